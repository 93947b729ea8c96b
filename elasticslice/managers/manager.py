"""The elastic slice manager: the seed's ``ElasticSliceManager`` and ``SimpleElasticSliceManager``.

A manager keeps a slice alive (``ensure_slice``, ``ensure_sliver``, ``renew``), watches it
(``update_sliver_status``, ``update_all``, ``update_available``), grows and shrinks it
(``add_nodes``, ``delete_nodes``, as the pure policy in :mod:`.policy` decides) and answers
CloudLab's callbacks (it *is* a :class:`SimpleElasticSliceClientEndpoint`). What the
experiment is comes from a helper (``set_helper``). It acts only through
:class:`~elasticslice.rpc.client.ProtoGeniServer`, records everything in a
:class:`~.state.ManagerState` (an intent row before each AddNodes/DeleteNodes), and the
:class:`~.cycle.Cycle` decides when each method runs.
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
from elasticslice.managers import actions, lifecycle
from elasticslice.managers.base import ElasticSliceManager, TrackedState
from elasticslice.managers.cycle import Cycle
from elasticslice.managers.endpoint import SimpleElasticSliceClientEndpoint
from elasticslice.managers.helpers import ElasticSliceHelper, PluginElasticSliceHelper
from elasticslice.managers.notify import Notifier
from elasticslice.managers.policy import Decision, NodeState, Observed, PolicyConfig, decide
from elasticslice.managers.state import ManagerState

log = logging.getLogger(__name__)


class SimpleElasticSliceManager(ElasticSliceManager, PluginElasticSliceHelper,
                                SimpleElasticSliceClientEndpoint):
    """A complete manager. Seed options and defaults; ``state_dir`` (or ``state``), the
    ``helper``, ``clock``, ``policy`` extras (a :class:`PolicyConfig` whose thresholds the
    seed options override), renewal (``renew_hours``, ``renew_margin``), ``notifier`` and
    ``endpoint`` (an ``EndpointConfig``; None: no callback server) are keyword extras."""

    CM_METHODS = ["ensure_sliver", "update_sliver_status", "update_available", "update_all",
                  "add_nodes", "delete_nodes"]
    DEF_INTERVAL = 60
    DEF_INTERVALS = {"update_available": 600, "ensure_sliver": 60, "delete_nodes": 300,
                     "update_sliver_status": 60, "update_all": 86400, "renew": 3600,
                     "add_nodes": 300, "ensure_slice": 60}
    DEF_MIN_THRESHOLD = 1
    DEF_MAX_THRESHOLD = 10
    DEF_ORDER = ["ensure_slice", "ensure_sliver", "update_sliver_status", "renew",
                 "update_all", "update_available", "get_system_state", "add_nodes",
                 "delete_nodes", "set_system_state"]
    METHOD_RESET_TRIGGERS = {
        "add_nodes": ["update_sliver_status", "update_available", "get_system_state",
                      "set_system_state"],
        "delete_nodes": ["update_sliver_status", "update_available", "get_system_state",
                         "set_system_state"]}

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
                 clock: Callable[[], float] = time.time) -> None:
        if minthreshold < 0 or maxthreshold < minthreshold:
            raise ElasticSliceError(f"need 0 <= minthreshold ({minthreshold}) <= maxthreshold "
                                    f"({maxthreshold})")
        self.rlock = threading.RLock()
        SimpleElasticSliceClientEndpoint.__init__(self, helper=None,
                                                  delete_in_group=delete_in_group,
                                                  rlock=self.rlock)
        PluginElasticSliceHelper.__init__(self, server, config, helper)
        self.minthreshold = minthreshold
        self.maxthreshold = maxthreshold
        self.percent_available_minimum = percent_available_minimum
        self.manage_order = list(manage_order or self.DEF_ORDER)
        self.manage_intervals = {**self.DEF_INTERVALS, **(manage_intervals or {})}
        self.method_reset_triggers = {k: list(v) for k, v in (
            self.METHOD_RESET_TRIGGERS if method_reset_triggers is None
            else method_reset_triggers).items()}
        self.retry_interval = retry_interval
        self.nodetype = nodetype
        self.enable_delete = enable_delete
        self.clock = clock
        self.cms = ([server.cm(c) for c in cmlist] if cmlist else list(server.cms))
        self.cmlist = [c.url for c in self.cms]
        base = policy or PolicyConfig()
        self.policy = dataclasses.replace(
            base, minthreshold=minthreshold, maxthreshold=maxthreshold,
            percent_available_minimum=percent_available_minimum, enable_delete=enable_delete,
            nodetype=nodetype, cmlist=tuple(self.cmlist))
        self.renew_hours = renew_hours
        self.renew_margin = renew_margin
        self.endpoint_config = endpoint
        self.delete_commands_timeout = delete_commands_timeout
        if isinstance(email, Notifier):
            self.notifier: Notifier = email
        else:  # the seed's bool: on when an email config says so (off by default)
            self.notifier = Notifier(None)
        if state is None:
            if state_dir is None:
                raise ElasticSliceError("a manager needs a state_dir (or a state)")
            state = ManagerState.open(Path(state_dir).expanduser())
        self.state: Any = state if isinstance(state, TrackedState) else TrackedState(state)
        self.demand: int | None = None
        self.availability: dict[str, dict[str, Any]] = {}
        self.totals: dict[str, dict[str, int]] = {}
        self.last_status: dict[str, Any] = {}
        self.last_decision: Decision | None = None
        self.last_observed: Observed | None = None
        self.full_pass = 0  # the manage_once running (0: none)
        self.full_advertisement_in: dict[str, int] = {}
        self._passes = 0
        self.views: tuple[int, tuple[Any, ...]] | None = None  # (state writes, NodeViews)
        self.cycle = Cycle(self._run_method, order=self.manage_order,
                           intervals=self.manage_intervals, default_interval=self.DEF_INTERVAL,
                           reset_triggers=self.method_reset_triggers,
                           retry_interval=retry_interval, recorder=self.state,
                           on_error=self._on_method_error, clock=clock)
        self.endpoint_server: Any = None
        self.endpoint_url: str | None = None
        self.registered: set[str] = set()
        self._stop = threading.Event()
        self._started = False
        self._reconciled = False
        self.note_client_ids(r.client_id for r in self.state.nodes(include_gone=True))
        for intent in self.state.open_intents():
            self.note_client_ids(intent.client_ids)

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
    def _cms(self, cm: Any = None) -> list[Any]:
        if cm is None:
            return list(self.cms)
        if hasattr(cm, "url"):
            return [cm]
        return [self.server.cm(cm)]

    def _run_method(self, name: str) -> Any:
        if name not in self.manage_order:
            raise ElasticSliceError(f"unknown manager method {name!r}")
        with self.rlock:
            return getattr(self, name)()

    def _on_method_error(self, name: str, err: BaseException, failures: int) -> None:
        if failures == 1 or failures % 10 == 0:
            self.notify(f"{name} failed", f"{name} failed ({failures} in a row): {err}")

    def get_email(self) -> tuple[str, ...]:
        """Where mail goes (the seed's accessor); empty when email is off."""
        return tuple(self.notifier.config.to) if self.notifier.enabled else ()

    def notify(self, subject: str, body: str) -> None:
        self.notifier.send(f"[elasticslice] {subject}", body)

    def wake(self, *methods: str) -> None:
        """Run these cycle methods now (events call this)."""
        self.cycle.wake(*methods)

    def set_demand(self, demand: int | None) -> None:
        """What the work wants (total nodes; None = no opinion): a demand change wakes
        add_nodes and delete_nodes."""
        changed = demand != self.demand
        self.demand = demand
        if changed:
            self.wake("add_nodes", "delete_nodes")

    # ------------------------------------------------------------------ seed methods
    def create_slice(self) -> Any:
        return actions.create_slice(self)

    def ensure_slice(self) -> Any:
        return actions.ensure_slice(self)

    def create_sliver(self, cm: Any = None) -> Any:
        return actions.create_sliver(self, self._cms(cm)[0])

    def ensure_sliver(self, cm: Any = None) -> Any:
        created = 0
        for c in self._cms(cm):
            created += actions.ensure_sliver(self, c)
            lifecycle.register_endpoint(self, c)
        return created

    def update_sliver_status(self, cm: Any = None, force: bool = False) -> Any:
        if not self._reconciled or self.state.open_intents():
            self.reconcile()
        return sum(actions.update_sliver_status(self, c) for c in self._cms(cm))

    def reconcile(self) -> int:
        """Close the open intents against the CMs' slivers (at start, after a crash)."""
        done = actions.reconcile(self)
        self._reconciled = True
        return done

    def renew(self) -> Any:
        return lifecycle.renew(self)

    def update_all(self, cm: Any = None, force: bool = False,
                   lastFetchBefore: float | None = None) -> Any:  # noqa: N803 (seed name)
        for c in self._cms(cm):
            actions.update_resources(self, c, available=False)
        return None

    def update_available(self, cm: Any = None) -> Any:
        for c in self._cms(cm):
            actions.update_resources(self, c, available=True)
        return None

    def get_system_state(self) -> Any:
        """Override to pull the hosted system's state (and call :meth:`set_demand`)."""
        return None

    def set_system_state(self) -> Any:
        """Override to push CloudLab's resource values (``self.state.values()``) to the
        hosted system."""
        return None

    def decide(self) -> Decision:
        """The policy's decision on what the manager observes now (no I/O)."""
        observed = actions.observe(self)
        decision = decide(observed, self.policy)
        self.last_observed, self.last_decision = observed, decision
        return decision

    def should_add_nodes(self, count: int = 0, cm: Any = None) -> Any:
        """How many nodes to add at ``cm`` (int), the AddNodes struct (dict), or None.
        With ``count`` > 0: ``count`` when the policy allows that many, else None."""
        url = self._cms(cm)[0].url
        allowed = self.decide().add.get(url, 0)
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
                added += actions.add(self, c, args)
        return added

    def should_delete_nodes(self, cm: Any = None) -> Any:
        """The client_ids to give back at ``cm`` (what DeleteNodes takes), or None: the
        policy's victims, and added nodes that failed to boot (they only hold a machine;
        the policy does not count them, so they are replaced)."""
        url = self._cms(cm)[0].url
        victims = list(self.decide().delete.get(url, ()))
        observed = self.last_observed
        victims += [n.client_id for n in observed.nodes
                    if n.cm == url and n.state is NodeState.FAILED and not n.initial
                    and n.client_id not in observed.deleting and not n.pending_delete
                    and n.client_id not in victims]
        return victims or None

    def delete_nodes(self, cm: Any = None) -> Any:
        deleted = 0
        for c in self._cms(cm):
            victims = self.should_delete_nodes(c)
            if victims:
                deleted += actions.delete(self, c, victims)
        return deleted

    # ------------------------------------------------------------------ node queries
    def is_adding(self, node: str | None = None, cm: Any = None) -> bool:
        return self._in_intent("add", node, cm)

    def is_deleting(self, node: str | None = None, cm: Any = None) -> bool:
        if self._in_intent("delete", node, cm):
            return True
        for p in self.state.pending_deletes():
            if not p.finished and (node is None or node in (p.node_id, p.client_id)):
                return True
        return False

    def _in_intent(self, kind: str, node: str | None, cm: Any) -> bool:
        urls = {c.url for c in self._cms(cm)}
        return any(i.kind == kind and i.cm in urls and (node is None or node in i.client_ids)
                   for i in self.state.open_intents())

    def get_node_status(self, node: str, cm: Any = None, key: str | None = None) -> Any:
        """The last SliverStatus entry of client_id ``node`` (a dict), or its ``key``."""
        for c in self._cms(cm):
            status = self.last_status.get(c.url)
            entry = status.node(node) if status is not None else None
            if entry is not None:
                data = dataclasses.asdict(entry)
                return data.get(key) if key else data
        return None

    # ------------------------------------------------------------------ endpoint hooks
    def on_delete_pending(self, nodes: list[Any]) -> None:
        lifecycle.record_delete_pending(self, nodes)
        self.wake("update_sliver_status", "update_available")

    def on_delete_complete(self, nodes: list[Any]) -> None:
        lifecycle.record_delete_complete(self, nodes)
        self.wake("update_sliver_status", "update_available")

    def on_resource_values(self, values: list[Any]) -> None:
        lifecycle.record_values(self, values)
        self.wake("set_system_state")

    # ------------------------------------------------------------------ running
    def manage_once(self, force: bool = False) -> dict[str, str | None]:
        """Every method once, in order; method -> its error (None when it worked)."""
        self._passes += 1
        self.full_pass = self._passes
        try:
            return self.cycle.run_once()
        finally:
            self.full_pass = 0

    def start(self) -> None:
        """Start the callback endpoint (registered at every CM) and the cycle: one full
        cycle at once, then each method at its interval."""
        if self._started:
            return
        self._started = True
        if self.endpoint_config is not None:
            lifecycle.start_endpoint(self)
        self.cycle.start(first_delay=0.0)

    def stop(self) -> None:
        """Stop the cycle, unregister and stop the endpoint, flush and close the state."""
        self._stop.set()
        if not self._started:
            return
        self._started = False
        self.cycle.stop()
        lifecycle.stop_endpoint(self)

    def close(self) -> None:
        self.stop()
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
