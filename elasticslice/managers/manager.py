"""The elastic slice manager: the seed's ``ElasticSliceManager`` and ``SimpleElasticSliceManager``.

A manager keeps a slice alive (``ensure_slice``, ``ensure_sliver``, ``renew``), watches it
(``update_sliver_status``, ``update_all``, ``update_available``), grows and shrinks it
(``add_nodes``, ``delete_nodes``, as the pure policy in :mod:`.policy` decides) and answers
CloudLab's callbacks (the seed's endpoint methods forward to ``client_endpoint``). Every node
given back goes one way: asked in the state's ``to_release`` (a policy victim or replaced
node by ``delete_nodes``, a revoked node once its delete commands finished or, in the
pilots' and Parsl's managers, once drained), then given back by the actuator on the cycle's
``release_nodes``, a job on a thread of its own, woken at each ask. The
seed's methods are its public face; the work is done by small parts it composes, each with
explicit collaborators, built in one place (:func:`~.parts.build_parts`):

* :class:`~.observer.Observer`: reads the CMs into the state, builds what the policy sees;
* :class:`~.actuator.Actuator`: acts at the SA and CMs; owns the intent log;
* :class:`~.renewer.Renewer` and :class:`~.registrar.EndpointRegistrar`;
* :class:`~.notices.NoticeBook`: CloudLab's notices, checked, recorded once, its own lock;
* :class:`~.holdings.Holdings`: the node records; :class:`~.ownership.SliceClaim`;
* :class:`~.cycle.Cycle`: when each method runs;
* the helper (``helper=``, or a subclass overriding the helper methods, as the seed's MRO
  advice says): what the experiment is. The manager is the helper the parts are given.

Callbacks never wait for the cycle: the endpoint (``client_endpoint``) takes the book's short
lock only, and no lock a callback needs is held across an RPC, a back-off or a Dask round
trip; mail and the helper's reactions to a callback run on threads of their own.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.background import Background
from elasticslice.managers.base import ElasticSliceManager, TrackedState
from elasticslice.managers import cycle as seed_cycle
from elasticslice.managers.endpoint import PluginElasticSliceClientEndpoint, Releaser
from elasticslice.managers.helpers import ElasticSliceHelper, PluginElasticSliceHelper
from elasticslice.managers.notify import Notifier
from elasticslice.managers.parts import PolicyField, build_parts
from elasticslice.managers.policy import (Decision, Observed, PolicyConfig, decide, failure_pause,
                                         wanted_nodes)
from elasticslice.managers.records import ReleaseSource
from elasticslice.managers.state import ManagerState

log = logging.getLogger(__name__)


class SimpleElasticSliceManager(ElasticSliceManager, PluginElasticSliceHelper,
                                PluginElasticSliceClientEndpoint):
    """A complete manager. Seed options and defaults; ``state_dir`` (or ``state``), the
    ``helper``, ``clock``, ``policy`` extras (a :class:`PolicyConfig` whose thresholds the
    seed options override), renewal (``renew_hours``, ``renew_margin``), ``endpoint`` (an
    ``EndpointConfig``; None: no callback server), ``adopt`` (work on an existing slice
    this state directory did not create) and ``releaser`` (how revoked nodes are released:
    a :class:`~.endpoint.Releaser`; None: the helper's delete commands) are keyword
    extras."""

    CM_METHODS = ["ensure_sliver", "update_sliver_status", "update_available", "update_all",
                  "add_nodes", "delete_nodes"]
    DEF_INTERVAL = seed_cycle.DEF_INTERVAL  # the cycle's one table (managers/cycle.py)
    DEF_INTERVALS = dict(seed_cycle.DEF_INTERVALS)
    DEF_MIN_THRESHOLD = 1
    DEF_MAX_THRESHOLD = 10
    DEF_ORDER = list(seed_cycle.DEF_ORDER)
    # the seed's thresholds: the policy's config holds them, the manager reads through
    minthreshold = PolicyField()
    maxthreshold = PolicyField()
    percent_available_minimum = PolicyField()
    enable_delete = PolicyField()
    METHOD_RESET_TRIGGERS = {
        "add_nodes": ["update_sliver_status", "update_available", "get_system_state",
                      "set_system_state"],
        "delete_nodes": ["release_nodes"],
        "release_nodes": ["update_sliver_status", "update_available", "get_system_state",
                          "set_system_state"]}
    #: cycle methods woken once a revoked node was given back (besides the reset triggers)
    RELEASE_WAKES: tuple[str, ...] = ()

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
                 releaser: Releaser | None = None) -> None:
        if minthreshold < 0 or maxthreshold < minthreshold:
            raise ElasticSliceError(f"need 0 <= minthreshold ({minthreshold}) <= maxthreshold "
                                    f"({maxthreshold})")
        PluginElasticSliceHelper.__init__(self, server, config, helper)
        self.manage_order = list(manage_order or self.DEF_ORDER)
        if "release_nodes" not in self.manage_order:  # the one way back is always there
            after = self.manage_order.index("delete_nodes") + 1 \
                if "delete_nodes" in self.manage_order else len(self.manage_order)
            self.manage_order.insert(after, "release_nodes")
        self.manage_intervals = {**self.DEF_INTERVALS, **(manage_intervals or {})}
        self.method_reset_triggers = {k: list(v) for k, v in (
            self.METHOD_RESET_TRIGGERS if method_reset_triggers is None
            else method_reset_triggers).items()}
        self.retry_interval = retry_interval
        self.nodetype = nodetype
        self.clock = clock
        self.cms = ([server.cm(c) for c in cmlist] if cmlist else list(server.cms))
        self.cmlist = [c.url for c in self.cms]
        self.policy = dataclasses.replace(
            policy or PolicyConfig(), minthreshold=minthreshold, maxthreshold=maxthreshold,
            percent_available_minimum=percent_available_minimum, enable_delete=enable_delete,
            nodetype=nodetype, cmlist=tuple(self.cmlist))
        self.renew_hours, self.renew_margin = renew_hours, renew_margin
        # the seed's bool: on when an email config says so (off by default)
        self.notifier = email if isinstance(email, Notifier) else Notifier(None)
        if state is None:
            if state_dir is None:
                raise ElasticSliceError("a manager needs a state_dir (or a state)")
            state = ManagerState.open(Path(state_dir).expanduser())
        self.state: Any = state if isinstance(state, TrackedState) else TrackedState(state)
        self._demand_nodes: int | None = None
        self.last_decision: Decision | None = None
        self.last_observed: Observed | None = None
        self._paused_after: float | None = None  # the failure the last add pause followed
        self._passes = 0
        # cycle methods run one at a time; no callback, drain or release ever takes it, nor
        # the cycle's methods apart (``release_nodes``) (the seed's per-instance RLock,
        # ``rlock``)
        self._methods_lock = self.rlock = threading.RLock()
        self._stop = threading.Event()
        self._started = False
        self._reconciled = False
        self._build(server, endpoint, delete_in_group, delete_commands_timeout, adopt,
                    releaser)
        self.note_client_ids(r.client_id for r in self.state.nodes(include_gone=True))
        for intent in self.state.open_intents():
            self.note_client_ids(intent.client_ids)

    def _build(self, server: Any, endpoint: Any, delete_in_group: bool,
               delete_commands_timeout: float, adopt: bool, releaser: Releaser | None) -> None:
        """The parts (no I/O): :func:`~.parts.build_parts`."""
        build_parts(self, server, endpoint=endpoint, delete_in_group=delete_in_group,
                    delete_commands_timeout=delete_commands_timeout, adopt=adopt,
                    releaser=releaser)

    def _commands_finished(self, node_ids: list[str], outcome: str) -> None:
        """The delete commands of revoked nodes ended (the book released them): the nodes
        are given back, unless CloudLab takes them anyway (no time was left, or the
        commands were killed at the deadline or as the nodes went)."""
        if outcome not in ("done", "failed"):
            return
        recs = [r for r in (self.state.find_node(i) for i in node_ids)
                if r is not None and r.gone_at is None]
        self.actuator.ask_release(recs, ReleaseSource.NOTICE.value,
                                  f"revoked, delete commands {outcome}")

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

    # ------------------------------------------------------------------ small helpers
    def _now(self) -> float:
        return self.clock()  # the clock may be swapped after construction (tests do)

    def _cms(self, cm: Any = None) -> list[Any]:
        if cm is None:
            return list(self.cms)
        return [cm] if hasattr(cm, "url") else [self.server.cm(cm)]

    def _run_method(self, name: str) -> Any:
        if name not in self.manage_order:
            raise ElasticSliceError(f"unknown manager method {name!r}")
        if name in self.cycle.apart:  # never behind another method (see Actuator.release)
            return getattr(self, name)()
        with self._methods_lock:
            return getattr(self, name)()

    def _renew_margin(self) -> float:
        return max(self.renew_margin,
                   2 * self.manage_intervals.get("renew", 3600) + self.retry_interval)

    def _on_method_error(self, name: str, err: BaseException, failures: int) -> None:
        if failures == 1 or failures % 10 == 0:
            self.notify(f"{name} failed", f"{name} failed ({failures} in a row): {err}")

    def get_email(self) -> tuple[str, ...]:
        """Where mail goes (the seed's accessor); empty when email is off."""
        return tuple(self.notifier.config.to) if self.notifier.enabled else ()

    def notify(self, subject: str, body: str) -> None:
        """Mail now (the cycle's thread may wait for the SMTP server)."""
        self.notifier.send(f"[elasticslice] {subject}", body)

    def notify_later(self, subject: str, body: str) -> None:
        """Mail from a thread that must not wait (a callback's)."""
        if self.notifier.enabled:
            self.mail.post(self.notify, subject, body)

    def wake(self, *methods: str) -> None:
        """Run these cycle methods now (events call this; it never waits)."""
        self.cycle.wake(*methods)

    @property
    def demand(self) -> int | None:
        """Nodes the hosted system wants (None: no opinion)."""
        return wanted_nodes(self.policy, nodes=self._demand_nodes)

    def set_demand(self, demand: int | None) -> None:
        """What the work wants (total nodes; None = no opinion): a demand change wakes
        add_nodes and delete_nodes."""
        changed = demand != self._demand_nodes
        self._demand_nodes = demand
        if changed:
            self.wake("add_nodes", "delete_nodes")

    @property
    def endpoint_server(self) -> Any:
        return self.registrar.endpoint_server if self.registrar else None

    @property
    def endpoint_url(self) -> str | None:
        return self.registrar.url if self.registrar else None

    @property
    def registered(self) -> set[str]:
        return self.registrar.registered if self.registrar else set()

    @property
    def availability(self) -> dict[str, Any]:
        return self.observer.availability

    # ------------------------------------------------------------------ seed methods
    def create_slice(self) -> Any:
        return self.actuator.create_slice()

    def ensure_slice(self) -> Any:
        return self.actuator.ensure_slice()

    def create_sliver(self, cm: Any = None) -> Any:
        return self.actuator.create_sliver(self._cms(cm)[0])

    def ensure_sliver(self, cm: Any = None) -> Any:
        created = 0
        for c in self._cms(cm):
            created += self.actuator.ensure_sliver(c)
            if self.registrar is not None:
                self.registrar.register(c)
        return created

    def update_sliver_status(self, cm: Any = None, force: bool = False) -> Any:
        if not self._reconciled or self.state.open_intents():
            self.reconcile()
        return sum(self.observer.sliver_status(c) for c in self._cms(cm))

    def reconcile(self) -> int:
        """Close the open intents against the CMs' slivers (at start, after a crash)."""
        done = self.actuator.reconcile()
        self._reconciled = True
        if done and self.state.to_release.rows():  # rows that waited for it
            self.wake("release_nodes")
        return done

    def renew(self) -> Any:
        return self.renewer.renew()

    def update_all(self, cm: Any = None, force: bool = False,
                   lastFetchBefore: float | None = None) -> Any:  # noqa: N803 (seed name)
        for c in self._cms(cm):
            self.observer.resources(c, available=False)
        return None

    def update_available(self, cm: Any = None) -> Any:
        for c in self._cms(cm):
            self.observer.resources(c, available=True)
        return None

    def get_system_state(self) -> Any:
        """Override to pull the hosted system's state (and call :meth:`set_demand`)."""
        return None

    def set_system_state(self) -> Any:
        """Override to push CloudLab's resource values (``self.state.values()``) to the
        hosted system."""
        return None

    def observe(self) -> Observed:
        """What the policy sees now (no RPC)."""
        return self.observer.observe(demand=self._demand_nodes)

    def decide(self) -> Decision:
        """The policy's decision on what the manager observes now (no I/O)."""
        observed = self.observe()
        decision = decide(observed, self.policy)
        self.last_observed, self.last_decision = observed, decision
        pause = failure_pause(observed, self.policy)
        if pause > 0 and self._paused_after != observed.last_failed_at:
            self._paused_after = observed.last_failed_at  # said once a pause
            log.warning("%d added nodes in a row failed to start: no add for %.0f s (the "
                        "nodes' causes are above); then one more try", observed.failed_in_a_row,
                        pause)
        return decision

    def should_add_nodes(self, count: int = 0, cm: Any = None) -> Any:
        """How many nodes to add at ``cm`` (int), the AddNodes struct (dict), or None.
        With ``count`` > 0: ``count`` when the policy allows that many, else None."""
        allowed = self.decide().add.get(self._cms(cm)[0].url, 0)
        if count > 0:
            return count if allowed >= count else None
        return allowed or None

    def add_nodes(self, count: int = 0, cm: Any = None) -> Any:
        added = 0
        for c in self._cms(cm):
            answer = self.should_add_nodes(count, c)
            if not answer:
                continue
            args = answer if isinstance(answer, dict) else self.get_add_args(int(answer))
            if args:
                added += self.actuator.add(c, args)
        return added

    def should_delete_nodes(self, cm: Any = None) -> Any:
        """The client_ids to give back at ``cm`` (what DeleteNodes takes), or None: the
        policy's victims and its replacements (added nodes that failed to boot)."""
        return self.decide().give_back(self._cms(cm)[0].url) or None

    def delete_nodes(self, cm: Any = None) -> Any:
        """The policy's victims and replaced nodes: the helper's delete commands, then they
        are asked to be given back (``release_nodes`` does it); how many were asked."""
        deleted = 0
        for c in self._cms(cm):
            victims = self.should_delete_nodes(c)
            if victims:
                why = "; ".join(self.last_decision.reasons) if self.last_decision else ""
                deleted += self.actuator.delete(c, victims, why)
        return deleted

    def release_nodes(self) -> Any:
        """Give back every node asked (the state's ``to_release``): the one way nodes go
        back, on a thread of the cycle's own (never behind a slow AddNodes); how many
        went. Then, when a revoked node went, the methods of ``RELEASE_WAKES`` run."""
        done = self.actuator.release()
        if any(r.source == ReleaseSource.NOTICE.value for r in done):
            self.wake(*self.RELEASE_WAKES)
        return len(done)

    # ------------------------------------------------------------------ node queries
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

    # ------------------------------------------------------------------ running
    def manage_once(self, force: bool = False) -> dict[str, str | None]:
        """Every method once, in order; method -> its error (None when it worked). Raises
        when the slice is not this state directory's (see :class:`~.ownership.SliceClaim`)."""
        self.claim.claim()
        self._passes += 1
        self.observer.full_pass = self._passes
        try:
            return self.cycle.run_once()
        finally:
            self.observer.full_pass = 0

    def start(self) -> None:
        """Claim the slice, start the callback endpoint (registered at every CM) and the
        cycle: one full cycle at once, then each method at its interval."""
        if self._started:
            return
        self.claim.claim()
        self._started = True
        for part in self._threads():
            part.open()
        if self.registrar is not None:
            self.registrar.start()
        self.cycle.start(first_delay=0.0)

    def _threads(self) -> list[Background]:
        """The threads of the manager's own that callbacks hand work to."""
        return [self.events, self.mail]

    def stop(self) -> None:
        """Stop the cycle, unregister and stop the endpoint, finish what callbacks started."""
        self._stop.set()
        if not self._started:
            return
        self._started = False
        self.cycle.stop()
        if self.registrar is not None:
            self.registrar.stop()
        self.client_endpoint.shutdown_deletes()
        for part in self._threads():
            part.close()

    def close(self) -> None:
        self.stop()
        for part in self._threads():  # a manager never started may have some too
            part.close()
        self.state.close()

    def stop_requested(self) -> None:
        """Ask :meth:`manage` to stop (safe from a signal handler)."""
        self._stop.set()

    def manage(self) -> None:
        """Run until :meth:`stop_requested` (a signal handler calls it) or :meth:`stop`."""
        self._stop.clear()
        self.start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()
