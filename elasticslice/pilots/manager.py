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
  read on each ``get_system_state``: cores are summed with Troy's, nodes with the nodes
  Troy's cores need, in the policy (:func:`extra_demand`), so the same policy (thresholds,
  cooldowns, hysteresis) decides;
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
from collections.abc import Callable
from typing import Any

from elasticslice.errors import RPCError
from elasticslice.managers.background import Background
from elasticslice.managers.manager import SimpleElasticSliceManager
from elasticslice.managers.policy import Observed, PolicyConfig, wanted_nodes
from elasticslice.pilots.drainer import EarlyReleases, PilotDrainer
from elasticslice.pilots.failures import NodeFailures, what_failed
from elasticslice.pilots.snapshot import node_stats
from elasticslice.pilots.values import changed as values_changed
from elasticslice.pilots.values import node_values, pilot_work
from elasticslice.pilots.watch import DEMAND_UNITS, DemandSource, PilotWatch, extra_demand
from elasticslice.rpc.codes import FAULT_NO_SUCH_METHOD, GeniCode
from troy.frameworks import Pilot, PilotFramework
from troy.states import FINAL_STATES

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Revocations:
    """CloudLab's reclamations of our nodes (node_ids): seen, released early, forced (a
    view of the state store's revocations, for reports)."""

    seen: set[str] = dataclasses.field(default_factory=set)
    early: set[str] = dataclasses.field(default_factory=set)
    forced: set[str] = dataclasses.field(default_factory=set)


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
        options["policy"] = dataclasses.replace(
            options.get("policy") or PolicyConfig(), lookahead=lookahead,
            agent_grace=agent_grace, agent_timeout=agent_timeout)
        # the parts that see pilots, passed in (they call back only once running)
        watch = PilotWatch(framework, clock=lambda: self.clock(), node_cores=node_cores)
        drainer = PilotDrainer(watch, margin=margin, release=self._release)
        super().__init__(server, releaser=drainer, **options)
        self.watch, self.drainer = watch, drainer
        self.framework = framework
        self.failures = failures if failures is not None else NodeFailures()
        self.session = session
        self.margin = margin
        self.last_demand: Any = None
        self._cores: tuple[int | None, int] = (None, 0)   # demand: cores now, waiting
        self._extra_nodes = 0.0                              # demand asked in nodes
        self._refused: set[str] = set()
        self._sources: list[DemandSource] = []
        self._sent_values: dict[str, dict[str, float]] = {}  # CM url -> our values sent

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
                "cores_per_node": self.cores_per_node(), "extra_nodes": self._extra_nodes}

    @property
    def demand(self) -> int | None:
        """Nodes Troy's demand asks for (None: not known yet)."""
        fields = self._demand_fields()
        return wanted_nodes(self.policy, cores=fields["demand_cores"],
                            waiting_cores=fields["waiting_cores"],
                            cores_per_node=fields["cores_per_node"],
                            extra_nodes=fields["extra_nodes"])

    def observe(self) -> Observed:
        return self.observer.observe(decorate=self.watch.decorate, **self._demand_fields())

    def add_demand_source(self, read: Callable[[], float | None], *, unit: str = "cores",
                          name: str = "") -> DemandSource:
        """Demand next to Troy's: ``read()`` (called on each ``get_system_state``, on the
        manager's thread; keep it quick) gives cores or nodes (``unit``) that ADD to Troy's
        queued and running cores (cores) or to the nodes those need (nodes). The policy
        decides on the sum as on Troy's alone. A source
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

    def _extra(self) -> tuple[int, float]:
        values: list[tuple[float | None, str]] = []
        for source in list(self._sources):
            try:
                values.append((source.read(), source.unit))
            except Exception:  # one source failing leaves the others and Troy's
                log.exception("demand source %s", source.name or source.read)
        return extra_demand(values)

    def get_system_state(self) -> Any:
        demand = self.session.demand()
        self.last_demand = demand
        before = self.demand
        cores, self._extra_nodes = self._extra()
        self._cores = (demand.queued_cores + demand.running_cores + cores,
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
        self.watch.refresh()   # the victims among the idle as they are now
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
        return Revocations(**self.state.revocations.nodes())

    def stats(self) -> dict[str, Any]:
        """revocations, early_releases, forced_releases, foreign_notices, nodes_peak,
        node_seconds."""
        return node_stats(self.state, self.notices.counts(), self.clock())
