"""What a hosted system adds to a :class:`~.core.Manager`: one part passed in (``hosted=``).

The plain manager keeps a slice and decides with the pure policy; a hosted system (Troy's
pilots, Parsl's blocks) tells it three things through this part, and nothing else:

* **the demand** (a demand source): :meth:`HostedSystem.pull` reads the work's demand on the
  cycle's ``get_system_state``, :meth:`HostedSystem.observe` puts it in what the policy sees
  (in nodes, or in cores the policy turns into nodes), :meth:`HostedSystem.wanted` says it in
  nodes for reports;
* **the nodes as the work sees them** (a node watch): busy, idle since when, without an agent
  since when (:meth:`HostedSystem.observe` decorates the node views; :meth:`refresh` reads the
  work again before victims are chosen);
* **node events** (a listener): a node settled or went (:meth:`node_added`,
  :meth:`node_deleted`, after the helper's ``handle_*_node``), an idle node is about to be
  given back (:meth:`before_give_back`), the adds of a cycle ended (:meth:`adds_done`), and
  CloudLab's resource values may go to the work (:meth:`push`, on ``set_system_state``).

What happens before a revoked node goes is the other part, the releaser (``releaser=``, a
:class:`~.endpoint.Releaser` that calls the manager's ``release_early`` once the node's work
is off it). The default of every method is the seed manager's: no demand but
``set_demand``'s, no watch, no listener.
"""
from __future__ import annotations

from typing import Any

from elasticslice.managers.background import Background
from elasticslice.managers.policy import Observed, PolicyConfig, wanted_nodes


class HostedSystem:
    """The seed's hosted system: the demand is what ``Manager.set_demand`` was told, the
    nodes are as the manager sees them, and nothing listens. Subclasses override what their
    system knows. ``release_wakes``: the cycle methods to run once a revoked node was given
    back."""

    release_wakes: tuple[str, ...] = ()

    def bind(self, manager: Any) -> None:
        """The manager this part serves, once built (the part calls it back only once the
        manager runs: ``wake``, its state, its registrar)."""

    # -- the demand and the nodes, as the policy sees them ---------------------------------
    def observe(self, observer: Any, demand: int | None) -> Observed:
        """What the policy sees (``observer.observe``), with the work's demand and nodes;
        ``demand``: what ``set_demand`` was told (nodes; None: no opinion)."""
        return observer.observe(demand=demand)

    def wanted(self, policy: PolicyConfig, demand: int | None) -> int | None:
        """Nodes the work wants before the thresholds (None: no opinion)."""
        return wanted_nodes(policy, nodes=demand)

    def refresh(self) -> None:
        """Read the work again (before the policy picks idle nodes to give back)."""

    def pull(self) -> Any:
        """``get_system_state``: read the work's demand now; what was read."""
        return None

    def push(self) -> Any:
        """``set_system_state``: CloudLab's resource values (the state's) to the work."""
        return None

    # -- node events -----------------------------------------------------------------------
    def node_added(self, node: dict[str, Any], status: str) -> None:
        """An added node settled (``ready``/``failed``/...), after the helper heard it."""

    def node_deleted(self, node: dict[str, Any]) -> None:
        """A node left the slice, after the helper heard it."""

    def before_give_back(self, client_ids: list[str]) -> None:
        """These idle nodes are given back next (the policy's victims): their work goes."""

    def adds_done(self) -> None:
        """``add_nodes`` ended (some may have failed), or ``ensure_sliver`` failed."""

    def threads(self) -> list[Background]:
        """Threads of the part's own, opened and closed with the manager."""
        return []


class NodeEvents:
    """The helper as the manager's parts see it: the helper's hooks, then the hosted
    system's (the observer says a node settled, the holdings that one went)."""

    def __init__(self, helper: Any, hosted: HostedSystem) -> None:
        self.helper, self.hosted = helper, hosted

    def note_client_ids(self, client_ids: Any) -> None:
        self.helper.note_client_ids(client_ids)

    def handle_added_node(self, node: dict[str, Any], status: str) -> None:
        try:
            self.helper.handle_added_node(node, status)
        finally:
            self.hosted.node_added(node, status)

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        try:
            self.helper.handle_deleted_node(node)
        finally:
            self.hosted.node_deleted(node)
