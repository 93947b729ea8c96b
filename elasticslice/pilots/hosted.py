"""Troy's pilots as a hosted system of the manager: :class:`PilotSystem`, the part a
:class:`~elasticslice.pilots.manager.PilotSliceManager` is assembled with.

* the demand is Troy's (``session.demand()``), in cores, with the cores of a node (the
  largest pilot, or ``node_cores``): the pure policy turns them into nodes
  (:func:`~elasticslice.managers.policy.wanted_nodes`);
* :class:`~.watch.PilotWatch` tells the policy which nodes are busy, idle since when, and
  which lost their agent (its pilot ended and none came back for ``agent_grace`` seconds, or
  a ready node no agent joined within ``agent_timeout``): the policy replaces those;
* other demand adds to Troy's: :meth:`PilotSystem.add_demand_source` takes a callable giving
  cores or nodes (a Dask scheduler's adaptive target, a fixed ``scale(n)``), read on each
  ``get_system_state``: cores are summed with Troy's, nodes with the nodes Troy's cores need,
  in the policy (:func:`~.watch.extra_demand`), so the same policy decides;
* CloudLab's resource values go to Troy (``set_system_state``), so the least valuable
  pilots get no long units, and ours go to CloudLab (:meth:`PilotSystem.send_values`);
* an idle node given back has its pilot retired first, so its data moves and a unit that
  reached it meanwhile is requeued, never lost; a node that failed or went loses its pilot.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from elasticslice.config import site_names
from elasticslice.errors import RPCError
from elasticslice.managers.background import Background
from elasticslice.managers.hosted import HostedSystem
from elasticslice.managers.policy import Observed, PolicyConfig, wanted_nodes
from elasticslice.pilots.drainer import PilotDrainer
from elasticslice.pilots.failures import NodeFailures, what_failed
from elasticslice.pilots.values import changed as values_changed
from elasticslice.pilots.values import node_values, pilot_work
from elasticslice.pilots.watch import DEMAND_UNITS, DemandSource, PilotWatch, extra_demand
from elasticslice.rpc.codes import FAULT_NO_SUCH_METHOD, GeniCode
from troy.frameworks import Pilot
from troy.states import FINAL_STATES

log = logging.getLogger("elasticslice.pilots.manager")


class PilotSystem(HostedSystem):
    """Troy's pilots, as the manager's hosted system (the module's doc): ``framework`` (the
    Troy ``dask`` framework the agents join), ``session`` (whose ``demand()`` drives
    scaling), ``watch`` and ``drainer`` (the releaser of revoked nodes, the manager's other
    part), ``failures`` (where nodes that failed are named with their cause)."""

    release_wakes = ("update_sliver_status",)
    RETIRE_TIMEOUT = 10.0  # seconds a node given back waits for Dask to move its data

    def __init__(self, framework: Any, session: Any, *, watch: PilotWatch,
                 drainer: PilotDrainer, failures: NodeFailures) -> None:
        self.framework, self.session = framework, session
        self.watch, self.drainer, self.failures = watch, drainer, failures
        self.manager: Any = None
        self.last_demand: Any = None
        self._cores: tuple[int | None, int] = (None, 0)   # demand: cores now, waiting
        self._extra_nodes = 0.0                              # demand asked in nodes
        self._refused: set[str] = set()
        self._sources: list[DemandSource] = []
        self._sent_values: dict[str, dict[str, float]] = {}  # CM url -> our values sent

    def bind(self, manager: Any) -> None:
        """The manager's CMs name the pilots' sites (:meth:`PilotWatch.label`, as each
        pilot joins)."""
        self.manager = manager
        self.watch.sites = site_names(list(manager.cmlist))
        self.watch.cm_of = self._cm_of
        watch = getattr(self.framework, "add_pilot_callback", None)
        if watch is not None:   # a framework of this process (not reported from afar)
            watch(self.watch.label)
            for pilot in self.framework.list_pilots():
                self.watch.label(pilot)

    def _cm_of(self, client_id: str) -> str | None:
        """The CM url of our node ``client_id`` (None: not ours)."""
        for rec in self.manager.state.nodes():
            if rec.client_id == client_id:
                return str(rec.cm)
        return None

    # ------------------------------------------------------------------ pilots of nodes
    def pilot_of(self, client_id: str | None) -> Pilot | None:
        return self.watch.pilot_of(client_id)

    def accepts(self, name: str | None, address: str, resources: Any = None) -> bool:
        """The framework's ``adopt_filter``: only agents named after a node we hold."""
        ok = bool(name) and self.manager.holdings.holds(str(name))
        if ok:
            self.manager.observer.started()  # an agent joined: nodes do start
        if not ok and address not in self._refused:
            self._refused.add(address)
            log.warning("worker %s (%r) is not one of our nodes: not adopted, no units",
                        address, name)
        return ok

    # ------------------------------------------------------------------ demand
    def _demand_fields(self) -> dict[str, Any]:
        cores, waiting = self._cores
        return {"demand_cores": cores, "waiting_cores": waiting,
                "cores_per_node": self.watch.cores_per_node(),
                "extra_nodes": self._extra_nodes}

    def wanted(self, policy: PolicyConfig, demand: int | None) -> int | None:
        fields = self._demand_fields()
        return wanted_nodes(policy, cores=fields["demand_cores"],
                            waiting_cores=fields["waiting_cores"],
                            cores_per_node=fields["cores_per_node"],
                            extra_nodes=fields["extra_nodes"])

    def observe(self, observer: Any, demand: int | None) -> Observed:
        return observer.observe(decorate=self.watch.decorate, **self._demand_fields())

    def refresh(self) -> None:
        self.watch.refresh()

    def add_demand_source(self, read: Callable[[], float | None], *, unit: str = "cores",
                          name: str = "") -> DemandSource:
        if unit not in DEMAND_UNITS:
            raise ValueError(f"demand source {name or read!r}: unit: expected one of "
                             f"{', '.join(DEMAND_UNITS)}, got {unit!r}")
        if not callable(read):
            raise ValueError(f"demand source {name!r}: expected a callable, got {read!r}")
        source = DemandSource(read, unit, name)
        self._sources.append(source)
        self.manager.wake("get_system_state")
        return source

    def remove_demand_source(self, source: DemandSource) -> None:
        if source in self._sources:
            self._sources.remove(source)
            self.manager.wake("get_system_state")

    def _extra(self) -> tuple[int, float]:
        values: list[tuple[float | None, str]] = []
        for source in list(self._sources):
            try:
                values.append((source.read(), source.unit))
            except Exception:  # one source failing leaves the others and Troy's
                log.exception("demand source %s", source.name or source.read)
        return extra_demand(values)

    def pull(self) -> Any:
        demand = self.session.demand()
        self.last_demand = demand
        before = self.manager.demand
        cores, self._extra_nodes = self._extra()
        self._cores = (demand.queued_cores + demand.running_cores + cores,
                       demand.waiting_cores)
        if self.manager.demand != before:
            self.manager.wake("add_nodes", "delete_nodes")
        return demand

    # ------------------------------------------------------------------ values
    def push(self) -> Any:
        state = self.manager.state
        values = state.values()
        by_name = {r.client_id: values[r.node_id] for r in state.nodes()
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
        for r in self.manager.state.nodes(cm_url):
            pilot = self.pilot_of(r.client_id)
            pilots[r.client_id] = pilot if pilot is not None and \
                pilot.state not in FINAL_STATES else None
        return node_values(pilot_work(pilots, self.framework.live_units(), wait=wait))

    def send_values(self) -> int:
        """SetResourceValues at each CM that reclaims by our values (registered CLIENT),
        when they changed (another order, or a value moved); a CM that refuses them is
        registered LIFO instead. Returns the CMs sent to."""
        registrar = self.manager.registrar
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
    def node_added(self, node: dict[str, Any], status: str) -> None:
        pilot = self.pilot_of(node.get("client_id"))
        if status == "failed":
            entry = self.manager.observer.node_status(str(node.get("client_id")),
                                                      self.manager.cms)
            self.failures.failed(str(node.get("client_id")), str(node.get("node_id") or ""),
                                 what_failed(entry))
        if status == "ready":
            log.info("node %s ready: %s", node.get("client_id"),
                     f"pilot {pilot.id} adopted" if pilot else "waiting for its agent")
        elif pilot is not None:
            self.framework.lose_pilot(pilot, f"node {status}")

    def node_deleted(self, node: dict[str, Any]) -> None:
        self.failures.forget(str(node.get("client_id")))
        self.drainer.lose(node.get("client_id"), "node gone")

    def before_give_back(self, client_ids: list[str]) -> None:
        """Each victim's pilot is retired (on Dask, data that only its worker holds moves to
        the others) and taken out, so a unit that reached it meanwhile is requeued."""
        for cid in client_ids:
            pilot = self.pilot_of(cid)
            if pilot is not None and pilot.state not in FINAL_STATES:
                self.framework.retire(pilot, self.manager.clock() + self.RETIRE_TIMEOUT)
            self.drainer.lose(cid, "given back")

    def threads(self) -> list[Background]:
        return [self.drainer.work]
