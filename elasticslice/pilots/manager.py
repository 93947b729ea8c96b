"""The manager whose nodes are Troy pilots: demand in, CloudLab's notices out.

:class:`PilotSliceManager` is the plain :class:`~elasticslice.managers.core.Manager`
assembled with the parts that see pilots (nothing overridden):

* ``hosted``: :class:`~elasticslice.pilots.hosted.PilotSystem`, Troy's demand (and the
  demand sources added to it), the nodes as the pilots see them (:class:`PilotWatch`), the
  resource values both ways, and what happens to a pilot as its node settles or goes;
* ``releaser``: :class:`~elasticslice.pilots.drainer.PilotDrainer`, which releases a revoked
  node: it drains the node's pilot against the revocation's deadline (the notice's arrival
  plus its max_wait_time, unchanged; a countdown may only bring it earlier), off CloudLab's
  thread, and the node is given back as soon as the pilot is empty (the manager's
  ``release_early``: asked in ``to_release``, given back by the cycle's ``release_nodes``,
  as every node given back); a node taken anyway (max_wait_time 0, NotifyDeleteComplete,
  gone from the sliver) has its pilot's units requeued at once;
* only the agents of nodes it holds are adopted (:meth:`PilotSliceManager.accepts`, the
  framework's ``adopt_filter``).

What it counted lives in the state store, so it survives a restart.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from elasticslice.managers.core import Manager
from elasticslice.managers.helpers import ElasticSliceHelper
from elasticslice.managers.manager import seed_options
from elasticslice.managers.policy import PolicyConfig
from elasticslice.pilots.drainer import PilotDrainer
from elasticslice.pilots.failures import NodeFailures
from elasticslice.pilots.hosted import PilotSystem
from elasticslice.pilots.snapshot import node_stats
from elasticslice.pilots.watch import DemandSource, PilotWatch
from troy.frameworks import Pilot, PilotFramework


@dataclasses.dataclass
class Revocations:
    """CloudLab's reclamations of our nodes (node_ids): seen, released early, forced (a
    view of the state store's revocations, for reports)."""

    seen: set[str] = dataclasses.field(default_factory=set)
    early: set[str] = dataclasses.field(default_factory=set)
    forced: set[str] = dataclasses.field(default_factory=set)


def _of_pilots(name: str, doc: str) -> property:
    """The manager's ``name``: its pilots' part's."""
    return property(lambda manager: getattr(manager.pilots, name), doc=doc)


class PilotSliceManager(Manager):
    """A manager whose helper's nodes run Troy node agents (see the module docstring).

    ``framework``: the Troy ``dask`` framework the agents join (with ``adopt_workers``);
    ``session``: the Troy session whose ``demand()`` drives scaling; ``margin``: seconds
    kept free before a revocation deadline; ``node_cores``: cores of a node to plan with
    (None: the largest pilot seen); ``lookahead``: the share of the cores of tasks not yet
    released that counts as demand; ``agent_grace``: seconds a held node may stay without
    the agent that once ran there (an agent restarting with its node comes back well
    within) before it is replaced; ``agent_timeout``: the same for a ready node whose agent
    never joined; ``failures``: where nodes that failed are named with their cause
    (:class:`~elasticslice.pilots.failures.NodeFailures`; default one of its own);
    ``helper``: what a node is. Other options as
    :class:`~elasticslice.managers.manager.SimpleElasticSliceManager`'s
    (:func:`~elasticslice.managers.manager.seed_options`)."""

    RETIRE_TIMEOUT = PilotSystem.RETIRE_TIMEOUT

    def __init__(self, server: Any, *, framework: PilotFramework, session: Any,
                 helper: ElasticSliceHelper, margin: float = 5.0,
                 node_cores: int | None = None, lookahead: float = 0.0,
                 agent_grace: float = 15.0, agent_timeout: float = 120.0,
                 failures: NodeFailures | None = None, **options: Any) -> None:
        options["policy"] = dataclasses.replace(
            options.get("policy") or PolicyConfig(), lookahead=lookahead,
            agent_grace=agent_grace, agent_timeout=agent_timeout)
        # the parts that see pilots (they call back only once the manager runs)
        watch = PilotWatch(framework, clock=lambda: self.clock(), node_cores=node_cores)
        drainer = PilotDrainer(watch, margin=margin,
                               release=lambda *node: self.release_early(*node))
        pilots = PilotSystem(framework, session, watch=watch, drainer=drainer,
                             failures=failures if failures is not None else NodeFailures())
        super().__init__(server, helper=helper, hosted=pilots, releaser=drainer,
                         **seed_options(server, **options))
        self.pilots, self.margin = pilots, margin

    # ------------------------------------------------------------------ the parts' faces
    framework = _of_pilots("framework", "the Troy framework the agents join")
    session = _of_pilots("session", "the Troy session whose demand drives scaling")
    watch = _of_pilots("watch", "the nodes as the pilots see them")
    drainer = _of_pilots("drainer", "the releaser of revoked nodes")
    failures = _of_pilots("failures", "the nodes that failed, with their cause")
    last_demand = _of_pilots("last_demand", "Troy's demand as last read")

    @property
    def drains(self) -> dict[str, Any]:
        """node_id -> the DrainPlan of the drain a revocation started."""
        return self.pilots.drainer.plans

    def pilot_of(self, client_id: str | None) -> Pilot | None:
        """The pilot of the node ``client_id`` (its agent's name), None if none joined."""
        return self.pilots.pilot_of(client_id)

    def holds(self, client_id: str) -> bool:
        """Whether ``client_id`` is a node of ours (held, or being added)."""
        return self.holdings.holds(client_id)

    def accepts(self, name: str | None, address: str, resources: Any = None) -> bool:
        """The framework's ``adopt_filter``: only agents named after a node we hold."""
        return self.pilots.accepts(name, address, resources)

    def cores_per_node(self) -> int | None:
        return self.pilots.watch.cores_per_node()

    def add_demand_source(self, read: Callable[[], float | None], *, unit: str = "cores",
                          name: str = "") -> DemandSource:
        """Demand next to Troy's: ``read()`` (called on each ``get_system_state``, on the
        manager's thread; keep it quick) gives cores or nodes (``unit``) that ADD to Troy's
        queued and running cores (cores) or to the nodes those need (nodes). The policy
        decides on the sum as on Troy's alone. A source that raises counts as nothing that
        time (logged). :meth:`remove_demand_source` takes it out."""
        return self.pilots.add_demand_source(read, unit=unit, name=name)

    def remove_demand_source(self, source: DemandSource) -> None:
        self.pilots.remove_demand_source(source)

    def our_values(self, cm_url: str, wait: float | None = None) -> dict[str, float]:
        return self.pilots.our_values(cm_url, wait)

    def send_values(self) -> int:
        return self.pilots.send_values()

    # ------------------------------------------------------------------ figures
    @property
    def revocations(self) -> Revocations:
        return Revocations(**self.state.revocations.nodes())

    def stats(self) -> dict[str, Any]:
        """revocations, early_releases, forced_releases, foreign_notices, nodes_peak,
        node_seconds."""
        return node_stats(self.state, self.notices.counts(), self.clock())
