"""The manager whose nodes are Troy pilots: demand in, CloudLab's notices out.

:class:`PilotSliceManager` is a :class:`SimpleElasticSliceManager` whose parts see pilots:

* the demand is Troy's (``session.demand()``), in cores, with the cores of a node (the
  largest pilot, or ``node_cores``): the pure policy turns them into nodes
  (:func:`~elasticslice.managers.policy.wanted_nodes`);
* :class:`PilotWatch` tells the policy which nodes are busy, idle since when, and which
  lost their agent (its pilot ended and none came back for ``agent_grace`` seconds, or a
  ready node no agent joined within ``agent_timeout``): the policy replaces those;
* other demand adds to Troy's: :meth:`PilotSliceManager.add_demand_source` takes a
  callable giving cores or nodes (a Dask scheduler's adaptive target, a fixed ``scale(n)``),
  read on each ``get_system_state`` and summed with Troy's cores (:func:`extra_cores`), so
  the same policy (thresholds, cooldowns, hysteresis) decides;
* CloudLab's resource values go to Troy (``set_system_state``), so the least valuable
  pilots get no long units;
* only the agents of nodes it holds are adopted (:meth:`PilotSliceManager.accepts`, the
  framework's ``adopt_filter``);
* :class:`PilotDrainer` releases a revoked node: it drains the node's pilot against the
  revocation's deadline (the notice's arrival plus its max_wait_time, unchanged; a
  countdown may only bring it earlier), off CloudLab's thread, and the node is given back
  as soon as the pilot is empty (asked in ``to_release``, given back by the cycle's
  ``release_nodes``, as every node given back); a node taken anyway (max_wait_time 0,
  NotifyDeleteComplete, gone from the sliver) has its pilot's units requeued at once.

What it counted lives in the state store, so it survives a restart.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from elasticslice.errors import RPCError
from elasticslice.managers.background import Background
from elasticslice.managers.endpoint import Releaser
from elasticslice.managers.manager import SimpleElasticSliceManager
from elasticslice.managers.policy import NodeState, NodeView, Observed, PolicyConfig, \
    wanted_nodes
from elasticslice.managers.records import PendingDelete, ReleaseSource
from elasticslice.pilots.failures import NodeFailures, what_failed
from elasticslice.pilots.values import changed as values_changed
from elasticslice.pilots.values import node_values, pilot_work
from elasticslice.rpc.codes import FAULT_NO_SUCH_METHOD, GeniCode
from troy.frameworks import Pilot, PilotFramework
from troy.states import FINAL_STATES

log = logging.getLogger(__name__)

DEMAND_UNITS = ("cores", "nodes")
BOOTING = (NodeState.NOTREADY, NodeState.CHANGING)


@dataclasses.dataclass(frozen=True)
class DemandSource:
    """A source of demand next to Troy's: ``read()`` gives a number of ``unit`` ("cores"
    or "nodes"; None or a negative number: nothing)."""

    read: Callable[[], float | None]
    unit: str = "cores"
    name: str = ""


def extra_cores(values: Sequence[tuple[float | None, str]],
                cores_per_node: int | None) -> int:
    """The cores that ``(value, unit)`` pairs add to Troy's demand: cores as they are, nodes
    times ``cores_per_node`` (none known yet: one core a node, which asks for the first
    node; the policy plans with the real size once a pilot joined)."""
    total = 0
    for value, unit in values:
        if value is None or value <= 0:
            continue
        if unit == "nodes":
            total += math.ceil(value) * (cores_per_node or 1)
        else:
            total += math.ceil(value)
    return total


@dataclasses.dataclass
class Revocations:
    """CloudLab's reclamations of our nodes (node_ids): seen, released early, forced (a
    view of the state store's revocations, for reports)."""

    seen: set[str] = dataclasses.field(default_factory=set)
    early: set[str] = dataclasses.field(default_factory=set)
    forced: set[str] = dataclasses.field(default_factory=set)


class PilotWatch:
    """What the pilots say about the nodes: busy, idle since, agent gone since (tracked on
    the injected clock), and the cores of a node."""

    def __init__(self, framework: PilotFramework, *, clock: Callable[[], float],
                 node_cores: int | None = None) -> None:
        self.framework = framework
        self.clock = clock
        self.node_cores = node_cores
        self._agentless: dict[str, float] = {}
        #: ``() -> {client_id: None (busy now) or when it was last busy}``: work on the
        #: nodes that Troy does not see (a Dask client's own tasks); see ``decorate``
        self.activity: Callable[[], dict[str, float | None]] | None = None

    def pilot_of(self, client_id: str | None) -> Pilot | None:
        """The pilot of the node ``client_id`` (its agent's name), None if none joined."""
        return self.framework.find_pilot(client_id) if client_id else None

    def cores_per_node(self) -> int | None:
        if self.node_cores:
            return self.node_cores
        sizes = [p.size for p in self.framework.list_pilots() if p.state not in FINAL_STATES]
        return max(sizes) if sizes else None

    def _activity(self) -> dict[str, float | None]:
        if self.activity is None:
            return {}
        try:
            return dict(self.activity())
        except Exception:  # without it, Troy's view alone
            log.exception("reading the nodes' other activity")
            return {}

    def decorate(self, views: tuple[NodeView, ...]) -> tuple[NodeView, ...]:
        """The policy's views with busy, idle_since and the agent's absence from the pilots
        (a node still booting, or booting again after a reboot, has no agent yet, and is not
        missing one)."""
        now = self.clock()
        out, missing = [], set()
        other = self._activity()
        for view in views:
            pilot = self.pilot_of(view.client_id)
            if pilot is not None and pilot.state not in FINAL_STATES:
                busy, since = pilot.busy, pilot.idle_since
                if view.client_id in other:  # other work: busy, or idle since it ended
                    last = other[view.client_id]
                    busy = busy or last is None
                    since = None if busy else max(since or 0.0, last or 0.0) or None
                out.append(dataclasses.replace(view, busy=busy, idle_since=since))
                continue
            if view.state in BOOTING or (pilot is None and view.state is not NodeState.READY):
                out.append(view)  # booting, or booting again after a reboot: no agent yet
                continue
            missing.add(view.client_id)
            since = self._agentless.setdefault(view.client_id, now)
            out.append(dataclasses.replace(view, agentless_since=since,
                                           had_agent=pilot is not None))
        for cid in set(self._agentless) - missing:
            del self._agentless[cid]
        return tuple(out)


class PilotDrainer:
    """A :class:`~elasticslice.managers.endpoint.Releaser` for pilots. ``start`` returns at
    once: a node without a live pilot is released there and then, a pilot's drain
    (``drain_pilot(pilot, revocation.deadline, margin=, on_empty=)``, a Dask round trip)
    runs on a thread of its own. ``release(node_id, client_id, why)`` is called when the
    node may go. ``plans``: node_id -> the framework's ``DrainPlan``."""

    def __init__(self, watch: PilotWatch, *, margin: float,
                 release: Callable[[str, str | None, str], None]) -> None:
        self.watch = watch
        self.framework = watch.framework
        self.margin = margin
        self.release = release
        self.plans: dict[str, Any] = {}
        self.work = Background("pilot-drain", threads=4)

    def _live(self, rev: PendingDelete) -> Pilot | None:
        pilot = self.watch.pilot_of(rev.client_id)
        return pilot if pilot is not None and pilot.state not in FINAL_STATES else None

    def start(self, revocations: Sequence[PendingDelete]) -> None:
        for rev in revocations:
            pilot = self._live(rev)
            if pilot is None:
                self.release(rev.node_id, rev.client_id, "no pilot on it")
            else:
                self.work.post(self._drain, rev, pilot)

    def hurry(self, revocation: PendingDelete) -> None:
        pilot = self._live(revocation)
        if pilot is not None:
            self.work.post(self._drain, revocation, pilot)

    def _drain(self, rev: PendingDelete, pilot: Pilot) -> None:
        log.warning("draining pilot %s of %s: CloudLab takes it in %.0f s", pilot.id,
                    rev.client_id, rev.deadline - self.watch.clock())
        self.plans[rev.node_id] = self.framework.drain_pilot(
            pilot, rev.deadline, margin=self.margin,
            on_empty=lambda p: self._emptied(rev, p))

    def _emptied(self, rev: PendingDelete, pilot: Pilot) -> None:
        """Troy's units are off the pilot; the framework retires it before the deadline
        (``PilotFramework.retire``: on Dask, plain Dask tasks of a client's own, which
        Troy's drain does not see, move with their data), then the node may go."""
        if pilot.state not in FINAL_STATES:
            self.framework.retire(pilot, rev.deadline - self.margin)
        self.release(rev.node_id, rev.client_id, "drained")

    def gone(self, revocations: Sequence[PendingDelete], *, now: bool = False) -> None:
        """These nodes are gone, or CloudLab takes them ``now``: their pilots' units are
        requeued, on a thread of the drainer's (the answer to CloudLab never waits for it:
        a unit Dask moves by itself off a dead worker is counted by the framework too)."""
        def lose_all() -> None:
            for rev in revocations:
                self.lose(rev.client_id, "taken back by CloudLab")
        self.work.post(lose_all)

    def lose(self, client_id: str | None, reason: str) -> None:
        pilot = self.watch.pilot_of(client_id)
        if pilot is not None and pilot.state not in FINAL_STATES:
            started = time.monotonic()
            requeued = self.framework.lose_pilot(pilot, reason)
            log.info("pilot %s of %s lost (%s): %d unit(s) requeued in %.0f ms", pilot.id,
                     client_id, reason, len(requeued), (time.monotonic() - started) * 1000)

    def running(self) -> int:
        return 0

    def close(self) -> None:
        self.work.close()


class EarlyReleases:
    """For managers that drain a revoked node (the pilots', Parsl's): :meth:`_release` when
    its work is off it. The next countdown answer says max_wait_time 0, and the node is asked
    in ``to_release``, which wakes the cycle's ``release_nodes``: its DeleteNodes goes at once,
    on the release job's own thread, never behind a slow AddNodes (CloudLab may count down for
    up to its notify interval more otherwise); then the cycle methods of ``RELEASE_WAKES``
    run. :meth:`_release` returns at once (a callback's thread may call it)."""

    RELEASE_WAKES: tuple[str, ...] = ("update_sliver_status",)
    notices: Any
    actuator: Any
    state: Any

    def _release(self, node_id: str, client_id: str | None, why: str) -> None:
        if not self.notices.release([node_id], why):
            return
        log.info("releasing %s (%s) early: %s", node_id, client_id, why)
        rec = self.state.find_node(node_id)
        if rec is not None and rec.gone_at is None:
            self.actuator.ask_release([rec], ReleaseSource.NOTICE.value, why)


class PilotSliceManager(EarlyReleases, SimpleElasticSliceManager):
    """A manager whose helper's nodes run Troy node agents (see the module docstring).

    ``framework``: the Troy ``dask`` framework the agents join (with ``adopt_workers``);
    ``session``: the Troy session whose ``demand()`` drives scaling; ``margin``: seconds
    kept free before a revocation deadline; ``node_cores``: cores of a node to plan with
    (None: the largest pilot seen); ``lookahead``: the share of the cores of tasks not yet
    released that counts as demand; ``agent_grace``: seconds a held node may stay without
    the agent that once ran there (an agent restarting with its node comes back well
    within) before it is replaced; ``agent_timeout``: the same for a ready node whose agent
    never joined; ``failures``: where nodes that failed are named with their cause
    (:class:`~elasticslice.pilots.failures.NodeFailures`; default one of its own). Other
    options as :class:`SimpleElasticSliceManager`."""

    def __init__(self, server: Any, *, framework: PilotFramework, session: Any,
                 margin: float = 5.0, node_cores: int | None = None, lookahead: float = 0.0,
                 agent_grace: float = 15.0, agent_timeout: float = 120.0,
                 failures: NodeFailures | None = None, **options: Any) -> None:
        self.framework = framework
        self.failures = failures if failures is not None else NodeFailures()
        self.session = session
        self.margin = margin
        self.watch = PilotWatch(framework, clock=lambda: self.clock(), node_cores=node_cores)
        options["policy"] = dataclasses.replace(
            options.get("policy") or PolicyConfig(), lookahead=lookahead,
            agent_grace=agent_grace, agent_timeout=agent_timeout)
        super().__init__(server, **options)
        self.last_demand: Any = None
        self._cores: tuple[int | None, int] = (None, 0)   # demand: cores now, waiting
        self._refused: set[str] = set()
        self._sources: list[DemandSource] = []
        self._sent_values: dict[str, dict[str, float]] = {}  # CM url -> our values sent

    def _releaser(self) -> Releaser:
        self.drainer = PilotDrainer(self.watch, margin=self.margin, release=self._release)
        return self.drainer

    # ------------------------------------------------------------------ pilots of nodes
    def pilot_of(self, client_id: str | None) -> Pilot | None:
        """The pilot of the node ``client_id`` (its agent's name), None if none joined."""
        return self.watch.pilot_of(client_id)

    def holds(self, client_id: str) -> bool:
        """Whether ``client_id`` is a node of ours (held, or being added)."""
        return self.holdings.holds(client_id)

    def accepts(self, name: str | None, address: str, resources: Any = None) -> bool:
        """The framework's ``adopt_filter``: only agents named after a node we hold."""
        ok = bool(name) and self.holds(str(name))
        if ok:
            self.observer.started()  # an agent joined: nodes do start
        if not ok and address not in self._refused:
            self._refused.add(address)
            log.warning("worker %s (%r) is not one of our nodes: not adopted, no units",
                        address, name)
        return ok

    @property
    def drains(self) -> dict[str, Any]:
        """node_id -> the DrainPlan of the drain a revocation started."""
        return self.drainer.plans

    # ------------------------------------------------------------------ demand and values
    def cores_per_node(self) -> int | None:
        return self.watch.cores_per_node()

    def _demand_fields(self) -> dict[str, Any]:
        cores, waiting = self._cores
        return {"demand_cores": cores, "waiting_cores": waiting,
                "cores_per_node": self.cores_per_node()}

    @property
    def demand(self) -> int | None:
        """Nodes Troy's demand asks for (None: not known yet)."""
        fields = self._demand_fields()
        return wanted_nodes(self.policy, cores=fields["demand_cores"],
                            waiting_cores=fields["waiting_cores"],
                            cores_per_node=fields["cores_per_node"])

    def observe(self) -> Observed:
        return self.observer.observe(decorate=self.watch.decorate, **self._demand_fields())

    def add_demand_source(self, read: Callable[[], float | None], *, unit: str = "cores",
                          name: str = "") -> DemandSource:
        """Demand next to Troy's: ``read()`` (called on each ``get_system_state``, on the
        manager's thread; keep it quick) gives cores or nodes (``unit``) that ADD to Troy's
        queued and running cores. The policy decides on the sum as on Troy's alone. A source
        that raises counts as nothing that time (logged). :meth:`remove_demand_source`
        takes it out."""
        if unit not in DEMAND_UNITS:
            raise ValueError(f"demand source {name or read!r}: unit: expected one of "
                             f"{', '.join(DEMAND_UNITS)}, got {unit!r}")
        if not callable(read):
            raise ValueError(f"demand source {name!r}: expected a callable, got {read!r}")
        source = DemandSource(read, unit, name)
        self._sources.append(source)
        self.wake("get_system_state")
        return source

    def remove_demand_source(self, source: DemandSource) -> None:
        if source in self._sources:
            self._sources.remove(source)
            self.wake("get_system_state")

    def _extra_cores(self) -> int:
        values: list[tuple[float | None, str]] = []
        for source in list(self._sources):
            try:
                values.append((source.read(), source.unit))
            except Exception:  # one source failing leaves the others and Troy's
                log.exception("demand source %s", source.name or source.read)
        return extra_cores(values, self.cores_per_node())

    def get_system_state(self) -> Any:
        demand = self.session.demand()
        self.last_demand = demand
        before = self.demand
        self._cores = (demand.queued_cores + demand.running_cores + self._extra_cores(),
                       demand.waiting_cores)
        if self.demand != before:
            self.wake("add_nodes", "delete_nodes")
        return demand

    def set_system_state(self) -> Any:
        values = self.state.values()
        by_name = {r.client_id: values[r.node_id] for r in self.state.nodes()
                   if r.node_id and r.node_id in values}
        if by_name:
            self.framework.set_pilot_values(by_name)
        self.send_values()
        return len(by_name)

    def our_values(self, cm_url: str, wait: float | None = None) -> dict[str, float]:
        """Our value of each node held at ``cm_url`` (client_id -> 0..1) from its pilot's
        work (:mod:`elasticslice.pilots.values`: idle pilots lowest, busy ones by the work a
        reclamation within ``wait`` seconds would lose)."""
        pilots = {}
        for r in self.state.nodes(cm_url):
            pilot = self.pilot_of(r.client_id)
            pilots[r.client_id] = pilot if pilot is not None and \
                pilot.state not in FINAL_STATES else None
        return node_values(pilot_work(pilots, self.framework.live_units(), wait=wait))

    def send_values(self) -> int:
        """SetResourceValues at each CM that reclaims by our values (registered CLIENT),
        when they changed (another order, or a value moved); a CM that refuses them is
        registered LIFO instead. Returns the CMs sent to."""
        registrar = self.registrar
        if registrar is None:
            return 0
        sent = 0
        for cm in registrar.client_cms():
            wait = registrar.waits.get(cm.url) or None
            ours = self.our_values(cm.url, wait)
            if not ours or not values_changed(self._sent_values.get(cm.url, {}), ours):
                continue
            try:
                cm.set_resource_values([{"client_id": cid, "value": v}
                                        for cid, v in sorted(ours.items())])
            except RPCError as err:
                # the CM has no such call: LIFO there; anything else (a node that just
                # went, a busy CM) is tried again at the next set_system_state
                if err.code in (GeniCode.UNSUPPORTED, FAULT_NO_SUCH_METHOD) or \
                        "no such method" in str(err).lower():
                    registrar.fall_back(cm, str(err))
                else:
                    log.warning("SetResourceValues at %s: %s", cm.dynslice_url, err)
                continue
            self._sent_values[cm.url] = ours
            sent += 1
        return sent

    # ------------------------------------------------------------------ nodes coming, going
    def handle_added_node(self, node: dict[str, Any], status: str) -> None:
        super().handle_added_node(node, status)
        pilot = self.pilot_of(node.get("client_id"))
        if status == "failed":
            entry = self.observer.node_status(str(node.get("client_id")), self.cms)
            self.failures.failed(str(node.get("client_id")), str(node.get("node_id") or ""),
                                 what_failed(entry))
        if status == "ready":
            log.info("node %s ready: %s", node.get("client_id"),
                     f"pilot {pilot.id} adopted" if pilot else "waiting for its agent")
        elif pilot is not None:
            self.framework.lose_pilot(pilot, f"node {status}")

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        super().handle_deleted_node(node)
        self.failures.forget(str(node.get("client_id")))
        self.drainer.lose(node.get("client_id"), "node gone")

    def delete_nodes(self, cm: Any = None) -> Any:
        """Give back what the policy chose (asked in ``to_release``, as the base class);
        each victim's pilot is taken out first, so a unit that reached it meanwhile is
        requeued, never lost."""
        deleted = 0
        for c in self._cms(cm):
            victims = self.should_delete_nodes(c)
            if victims:
                for cid in victims:
                    self._retire(cid)
                    self.drainer.lose(cid, "given back")
                why = "; ".join(self.last_decision.reasons) if self.last_decision else ""
                deleted += self.actuator.delete(c, victims, why)
        return deleted

    RETIRE_TIMEOUT = 10.0  # seconds a node given back waits for Dask to move its data

    def _retire(self, client_id: str) -> None:
        """Before an idle node goes: the framework retires its pilot (on Dask, data that
        only its worker holds moves to the others); nothing to do without a live pilot."""
        pilot = self.pilot_of(client_id)
        if pilot is not None and pilot.state not in FINAL_STATES:
            self.framework.retire(pilot, self.clock() + self.RETIRE_TIMEOUT)

    def _threads(self) -> list[Background]:
        return [*super()._threads(), self.drainer.work]

    # ------------------------------------------------------------------ figures
    @property
    def revocations(self) -> Revocations:
        rows = self.state.pending_deletes()
        return Revocations(
            seen={r.node_id for r in rows},
            early={r.node_id for r in rows if r.outcome == "early" or (
                r.outcome is None and r.released is not None and r.released <= r.deadline)},
            forced={r.node_id for r in rows if r.outcome == "forced"})

    def stats(self) -> dict[str, Any]:
        """revocations, early_releases, forced_releases, foreign_notices, nodes_peak,
        node_seconds."""
        counts = self.notices.counts()
        now = self.clock()
        spans = [(r.added_at or now, r.gone_at or now)
                 for r in self.state.nodes(include_gone=True)]
        events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans],
                        key=lambda e: (e[0], e[1]))
        held = peak = 0
        for _, step in events:
            held += step
            peak = max(peak, held)
        return {"revocations": counts["revocations"], "early_releases": counts["early"],
                "forced_releases": counts["forced"], "foreign_notices": counts["foreign"],
                "nodes_peak": peak,
                "node_seconds": round(sum(max(0.0, b - a) for a, b in spans), 1)}
