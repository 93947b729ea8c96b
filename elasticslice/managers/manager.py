"""The seed's managers: ``ElasticSliceManager`` (:mod:`.base`) and
:class:`SimpleElasticSliceManager`, a facade over the plain :class:`~.core.Manager`.

Seed 004 says a manager is also a helper: users write
``class FooManager(SimpleElasticSliceHelper, SimpleElasticSliceManager)`` to override helper
methods by method resolution order, or plug one in (``helper=``, ``set_helper``). The facade
keeps that: it is its own helper (the plain manager's ``helper`` is the facade, which calls
the plugged helper unless a subclass overrides a method), it answers CloudLab's callbacks
itself (the endpoint's methods forward to ``client_endpoint``), and it takes the seed's
parameters (:func:`seed_options` turns them into the plain manager's: the thresholds into the
policy's config, the one place they live). The pilots' and Parsl's managers are plain
managers with their parts, not subclasses of this one.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers import cycle as seed_cycle
from elasticslice.managers.base import ElasticSliceManager
from elasticslice.managers.core import Manager
from elasticslice.managers.endpoint import PluginElasticSliceClientEndpoint, Releaser
from elasticslice.managers.helpers import ElasticSliceHelper, PluginElasticSliceHelper
from elasticslice.managers.hosted import HostedSystem
from elasticslice.managers.notify import Notifier
from elasticslice.managers.policy import PolicyConfig
from elasticslice.managers.sites import CM_METHODS
from elasticslice.managers.state import ManagerState

DEF_MIN_THRESHOLD = 1
DEF_MAX_THRESHOLD = 10


#: the seed's parameters of SimpleElasticSliceManager (past ``server, config``) and their
#: defaults
SEED_DEFAULTS: dict[str, Any] = dict(
    minthreshold=DEF_MIN_THRESHOLD, maxthreshold=DEF_MAX_THRESHOLD,
    percent_available_minimum=0.5, manage_order=None, manage_intervals=None,
    method_reset_triggers=None, retry_interval=30, nodetype=None, cmlist=None,
    enable_delete=False, email=True)


#: the seed's options that are the policy's knobs
POLICY_SEEDS = ("minthreshold", "maxthreshold", "percent_available_minimum", "enable_delete",
                "nodetype")


def seed_options(server: Any, *, policy: PolicyConfig | None = None,
                 **options: Any) -> dict[str, Any]:
    """The plain :class:`~.core.Manager`'s keywords from the seed's parameters
    (:data:`SEED_DEFAULTS`; other keywords are the plain manager's, passed on): the seed's
    thresholds, ``nodetype`` and ``enable_delete`` go into ``policy`` (a
    :class:`PolicyConfig`; its other knobs kept), ``cmlist`` (URLs, names or indices)
    becomes the CMs, ``manage_*``/``method_reset_triggers`` the cycle's, ``email`` the
    notifier (the seed's bool: on when an email config says so). A policy knob given both
    ways is the seed option's."""
    given = set(options) & set(SEED_DEFAULTS)
    seed = {name: options.pop(name, default) for name, default in SEED_DEFAULTS.items()}
    # a seed option given wins; else a policy given keeps its own value (the seed's
    # defaults overwrote it: ElasticCluster's percent_available_minimum of 0.25 was 0.5)
    policy = dataclasses.replace(policy or PolicyConfig(), **{
        k: seed[k] for k in POLICY_SEEDS if k in given or policy is None})
    least, most = policy.minthreshold, policy.maxthreshold
    if least < 0 or most < least:
        raise ElasticSliceError(f"need 0 <= minthreshold ({least}) <= maxthreshold ({most})")
    email, cmlist = seed["email"], seed["cmlist"]
    return dict(
        policy=policy,
        cms=[server.cm(c) for c in cmlist] if cmlist else None,
        order=list(seed["manage_order"] or seed_cycle.DEF_ORDER),
        intervals=seed["manage_intervals"], reset_triggers=seed["method_reset_triggers"],
        retry_interval=seed["retry_interval"],
        notifier=email if isinstance(email, Notifier) else Notifier(None), **options)


class SimpleElasticSliceManager(Manager, ElasticSliceManager, PluginElasticSliceHelper,
                                PluginElasticSliceClientEndpoint):
    """A complete manager: the seed's facade over :class:`~.core.Manager` (the module's
    doc). Seed options and defaults; ``state_dir`` (or ``state``), the ``helper``,
    ``clock``, ``policy`` extras (a :class:`PolicyConfig` whose thresholds the seed options
    override), renewal (``renew_hours``, ``renew_margin``), ``endpoint`` (an
    ``EndpointConfig``; None: no callback server), ``adopt`` (work on an existing slice
    this state directory did not create), ``releaser`` (how revoked nodes are released: a
    :class:`~.endpoint.Releaser`; None: the helper's delete commands) and ``hosted`` (what
    a hosted system adds: a :class:`~.hosted.HostedSystem`) are keyword extras."""

    CM_METHODS = list(CM_METHODS)   # each runs at every CM, a failing CM apart (sites.py)
    DEF_INTERVALS = dict(seed_cycle.DEF_INTERVALS)
    DEF_MIN_THRESHOLD = DEF_MIN_THRESHOLD
    DEF_MAX_THRESHOLD = DEF_MAX_THRESHOLD
    DEF_ORDER = list(seed_cycle.DEF_ORDER)
    METHOD_RESET_TRIGGERS = {k: list(v) for k, v in seed_cycle.RESET_TRIGGERS.items()}

    def __init__(self, server: Any, config: Any = None, minthreshold: int = DEF_MIN_THRESHOLD,
                 maxthreshold: int = DEF_MAX_THRESHOLD, percent_available_minimum: float = 0.5,
                 manage_order: Sequence[str] | None = None,
                 manage_intervals: Mapping[str, float] | None = None,
                 method_reset_triggers: Mapping[str, Sequence[str]] | None = None,
                 retry_interval: float = 30, nodetype: str | None = None,
                 cmlist: Sequence[str | int] | None = None, enable_delete: bool = False,
                 email: bool | Notifier = True, *, helper: ElasticSliceHelper | None = None,
                 state: ManagerState | None = None, state_dir: str | Path | None = None,
                 policy: PolicyConfig | None = None, renew_hours: float = 6.0,
                 renew_margin: float = 3600.0, endpoint: Any = None,
                 delete_in_group: bool = True, delete_commands_timeout: float = 600.0,
                 clock: Callable[[], float] = time.time, adopt: bool = False,
                 releaser: Releaser | None = None, hosted: HostedSystem | None = None) -> None:
        PluginElasticSliceHelper.__init__(self, server, config, helper)
        self.nodetype = nodetype
        Manager.__init__(self, server, helper=self, hosted=hosted, releaser=releaser,
                         **seed_options(
                             server, minthreshold=minthreshold, maxthreshold=maxthreshold,
                             percent_available_minimum=percent_available_minimum,
                             manage_order=manage_order or self.DEF_ORDER,
                             manage_intervals={**self.DEF_INTERVALS, **(manage_intervals or {})},
                             method_reset_triggers=self.METHOD_RESET_TRIGGERS
                             if method_reset_triggers is None else method_reset_triggers,
                             retry_interval=retry_interval, nodetype=nodetype, cmlist=cmlist,
                             enable_delete=enable_delete, email=email, policy=policy,
                             state=state, state_dir=state_dir, renew_hours=renew_hours,
                             renew_margin=renew_margin, endpoint=endpoint,
                             delete_in_group=delete_in_group,
                             delete_commands_timeout=delete_commands_timeout, clock=clock,
                             adopt=adopt))

    # ------------------------------------------------------------------ the seed's queries
    def get_email(self) -> tuple[str, ...]:
        """Where mail goes (the seed's accessor); empty when email is off."""
        return tuple(self.notifier.config.to) if self.notifier.enabled else ()

    def is_adding(self, node: str | None = None, cm: Any = None) -> bool:
        return self.actuator.pending("add", node, {c.url for c in self._cms(cm)})

    def is_deleting(self, node: str | None = None, cm: Any = None) -> bool:
        urls = {c.url for c in self._cms(cm)}
        if self.actuator.pending("delete", node, urls):
            return True
        if any(node is None or node in (r.node_id, r.client_id)
               for r in self.state.to_release.rows() if r.cm in urls):
            return True
        return any(node is None or node in (p.node_id, p.client_id)
                   for p in self.state.pending_deletes(open_only=True))

    def get_node_status(self, node: str, cm: Any = None, key: str | None = None) -> Any:
        """The last SliverStatus entry of client_id ``node`` (a dict), or its ``key``."""
        entry = self.observer.node_status(node, self._cms(cm))
        if entry is None:
            return None
        data = dataclasses.asdict(entry)
        return data.get(key) if key else data

    @classmethod
    def from_config(cls, server: Any, mconfig: Any, helper: ElasticSliceHelper | None = None,
                    **extra: Any) -> SimpleElasticSliceManager:
        """A manager from a :class:`~.config.ManagerConfig` (the ``[manager]`` section)."""
        options: dict[str, Any] = dict(
            config=mconfig, minthreshold=mconfig.minthreshold,
            maxthreshold=mconfig.maxthreshold,
            percent_available_minimum=mconfig.percent_available_minimum,
            manage_intervals=dict(mconfig.intervals), retry_interval=mconfig.retry_interval,
            nodetype=mconfig.nodetype, cmlist=list(mconfig.cms([c.url for c in server.cms])),
            enable_delete=mconfig.enable_delete, email=Notifier(mconfig.email),
            helper=helper, state_dir=mconfig.state_dir, policy=mconfig.policy(),
            renew_hours=mconfig.renew_hours, renew_margin=mconfig.renew_margin,
            endpoint=mconfig.endpoint if mconfig.endpoint.enabled else None,
            delete_in_group=getattr(mconfig, "delete_in_group", True))
        options.update(extra)
        return cls(server, **options)
