"""What an elastic cluster looks like now, for progress lines: :class:`ClusterSnapshot`."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class ClusterSnapshot:
    """What the cluster looks like now (for progress lines)."""

    nodes_held: int
    pilots: int
    units_queued: int
    units_running: int
    units_done: int
    revocations: int
    nodes_wanted: int | None = None   # what Troy's demand asks for (None: not known yet)
    pilot_cores: tuple[int, ...] = ()  # the size of each live pilot

    @classmethod
    def of(cls, manager: Any, session: Any, pilots: Sequence[Any]) -> ClusterSnapshot:
        """From the manager (None: not running), the Troy session's demand and the live
        pilots: memory and the local state store, no network call."""
        demand = session.demand()
        return cls(
            nodes_held=len(manager.state.nodes()) if manager is not None else 0,
            pilots=len(pilots), nodes_wanted=manager.demand if manager is not None else None,
            pilot_cores=tuple(p.size for p in pilots),
            units_queued=demand.units_queued, units_running=demand.units_running,
            units_done=demand.units_done,
            revocations=manager.state.revocations.counts()["revocations"]
            if manager is not None else 0)
