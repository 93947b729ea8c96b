"""What the pilots say about the nodes, for the policy: :class:`PilotWatch` (busy, idle
since when, the agent gone since when, the cores of a node) and the demand beside Troy's
(:class:`DemandSource`, :func:`extra_demand`). The watch reads a Troy framework, or anything
that answers as one (:class:`~elasticslice.pilots.remote.RemoteWorkload`: the pilots of a
workload in another process)."""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

from elasticslice.managers.policy import NodeState, NodeView
from troy.frameworks import Pilot, PilotFramework
from troy.states import FINAL_STATES

log = logging.getLogger("elasticslice.pilots.manager")

DEMAND_UNITS = ("cores", "nodes")
BOOTING = (NodeState.NOTREADY, NodeState.CHANGING)


@dataclasses.dataclass(frozen=True)
class DemandSource:
    """A source of demand next to Troy's: ``read()`` gives a number of ``unit`` ("cores"
    or "nodes"; None or a negative number: nothing)."""

    read: Callable[[], float | None]
    unit: str = "cores"
    name: str = ""


def extra_demand(values: Sequence[tuple[float | None, str]]) -> tuple[int, float]:
    """What ``(value, unit)`` pairs add to Troy's demand: (cores, nodes), each summed in its
    own unit (the policy adds the nodes to those Troy's cores need; before any node told its
    size a node is not some guess of cores). None or a value not above 0: nothing."""
    cores, nodes = 0, 0.0
    for value, unit in values:
        if value is None or value <= 0:
            continue
        if unit == "nodes":
            nodes += value
        else:
            cores += math.ceil(value)
    return cores, nodes


def site_of(pilot: object) -> str | None:
    """The site a pilot is at (``description.site``, or a reported pilot's ``site``)."""
    description = getattr(pilot, "description", None)
    return getattr(description, "site", None) or getattr(pilot, "site", None) or None


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
        #: ``() -> bool``: the framework cannot see the pilots now (the workload's process
        #: is gone, its pilots with it for the time being): every node counts as busy, so
        #: none is given back or replaced for want of an agent until it sees again
        self.blind: Callable[[], bool] | None = None
        #: ``{CM url: site}`` (:func:`~elasticslice.config.site_names`) and ``client_id ->
        #: its CM url`` (None: not ours): a pilot's site is its node's CM's (:meth:`label`)
        self.sites: dict[str, str] = {}
        self.cm_of: Callable[[str], str | None] = lambda client_id: None

    def refresh(self) -> None:
        """Before a decision on the pilots: a framework that reports from afar (the
        manager daemon's :class:`~elasticslice.pilots.remote.RemoteWorkload`) is asked for
        what is now; Troy's own frameworks are always current."""
        refresh = getattr(self.framework, "refresh", None)
        if refresh is not None:
            refresh()

    def pilot_of(self, client_id: str | None, cm: str | None = None) -> Pilot | None:
        """The pilot of the node ``client_id`` (its agent's name), None if none joined;
        with ``cm`` (the node's CM url), None too when the pilot is known to be at
        another site (a node of the same name there: never this node's pilot)."""
        pilot = self.framework.find_pilot(client_id) if client_id else None
        if pilot is not None and cm is not None:
            here, want = site_of(pilot), self.sites.get(cm)
            if here and want and here != want:
                return None
        return pilot

    def label(self, pilot: Pilot, *_: object, cm: str | None = None) -> None:
        """Stamp the site of the pilot's node (its CM's, ``cm`` or :attr:`cm_of`, named by
        :attr:`sites`) on the pilot's description, once it is known (a pilot callback:
        before it is given units; and at every decision, for a node recorded late)."""
        description = getattr(pilot, "description", None)
        name = getattr(pilot, "worker_name", None)
        if description is None or getattr(description, "site", None) or not name:
            return
        try:
            site = self.sites.get(cm or self.cm_of(str(name)) or "")
        except Exception:  # noqa: BLE001 - a replaced manager's closed state: the new one's
            log.debug("no site for pilot %s yet", name, exc_info=True)
            return
        if site:
            description.site = site

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
        if self.blind is not None and self.blind():
            self._agentless.clear()   # the agents' grace starts again when it sees
            return tuple(dataclasses.replace(v, busy=True, idle_since=None) for v in views)
        now = self.clock()
        out, missing = [], set()
        other = self._activity()
        for view in views:
            pilot = self.pilot_of(view.client_id)
            if pilot is not None and pilot.state not in FINAL_STATES:
                self.label(pilot, cm=view.cm)
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
