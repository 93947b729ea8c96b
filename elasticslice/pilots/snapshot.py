"""What an elastic cluster looks like now, for progress lines: :class:`ClusterSnapshot`."""
from __future__ import annotations

import dataclasses
from collections import Counter
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
    #: live pilots by site (their node's CM: ``{"utah": 2, "wisc": 1}``; a pilot of no
    #: known site is not counted)
    pilot_sites: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, manager: Any, session: Any, pilots: Sequence[Any]) -> ClusterSnapshot:
        """From the manager (None: not running), the Troy session's demand and the live
        pilots: memory and the local state store, no network call."""
        demand = session.demand()
        return cls(
            nodes_held=len(manager.state.nodes()) if manager is not None else 0,
            pilots=len(pilots), nodes_wanted=manager.demand if manager is not None else None,
            pilot_cores=tuple(p.size for p in pilots),
            pilot_sites=tuple(sorted(Counter(
                s for s in (getattr(p.description, "site", None) for p in pilots) if s
            ).items())),
            units_queued=demand.units_queued, units_running=demand.units_running,
            units_done=demand.units_done,
            revocations=manager.state.revocations.counts()["revocations"]
            if manager is not None else 0)


def node_stats(state: Any, counts: dict[str, int], now: float) -> dict[str, Any]:
    """revocations, early_releases, forced_releases, foreign_notices (``counts``: the
    notice book's), nodes_peak and node_seconds, from a manager's ``state``."""
    spans = [(r.added_at or now, r.gone_at or now) for r in state.nodes(include_gone=True)]
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans],
                    key=lambda e: (e[0], e[1]))
    held = peak = 0
    for _, step in events:
        held += step
        peak = max(peak, held)
    return {"revocations": counts["revocations"], "early_releases": counts["early"],
            "forced_releases": counts["forced"], "foreign_notices": counts.get("foreign", 0),
            "nodes_peak": peak,
            "node_seconds": round(sum(max(0.0, b - a) for a, b in spans), 1)}


class StateView:
    """The manager daemon's state as another process reads it (SQLite, read-only): what a
    snapshot, the run's figures and its timeline need of a manager. ``demand`` is the
    daemon's to know (None here); drains are the workload's (none here)."""

    demand = None

    def __init__(self, state: Any) -> None:
        self.state = state
        self.drains: dict[str, Any] = {}

    def stats(self) -> dict[str, Any]:
        import time
        return node_stats(self.state, self.state.revocations.counts(), time.time())
