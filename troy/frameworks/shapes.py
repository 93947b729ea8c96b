"""How many pilots of a framework have each shape: what the built-in schedulers ask.

A scheduler placing a unit needs to know whether some pilot has the free cores (or backlog
room, or size) for it, and at which framework; it does not need to look at every pilot.
Each framework keeps a count of its pilots per :class:`Shape` (accepting units or not,
size, free cores, room), which a pilot updates whenever one of those changes. Pilots of a
framework are mostly alike, so there are few shapes: a query costs the same with 10 pilots
as with 10,000 (the placement cost the benchmark ``bench/bench_scheduling.py`` measures).
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from troy.states import State

if TYPE_CHECKING:
    from troy.frameworks.base import Pilot


@dataclass(frozen=True)
class Shape:
    """``accepting``: RUNNING and not draining (takes units now); ``live``: PENDING or
    RUNNING and not draining (may take units one day)."""

    accepting: bool
    live: bool
    size: int
    free: int
    room: int


def shape_of(pilot: Pilot) -> Shape:
    state = pilot.state
    return Shape(state is State.RUNNING and not pilot.draining,
                 state in (State.PENDING, State.RUNNING) and not pilot.draining,
                 pilot.description.size, pilot.free_cores, pilot.room)


class ShapeIndex:
    """Pilot counts per shape; ``move`` is called with the pilot's own lock held."""

    def __init__(self) -> None:
        self._counts: dict[Shape, int] = {}
        self._lock = threading.Lock()

    def move(self, old: Shape | None, new: Shape | None) -> None:
        if old == new:
            return
        with self._lock:
            if old is not None:
                left = self._counts.get(old, 0) - 1
                if left > 0:
                    self._counts[old] = left
                else:
                    self._counts.pop(old, None)
            if new is not None:
                self._counts[new] = self._counts.get(new, 0) + 1

    def shapes(self) -> list[Shape]:
        with self._lock:
            return list(self._counts)


def shapes(framework: Any) -> Iterable[Shape]:
    """The shapes of ``framework``'s pilots (from its index; any other framework object:
    from its pilots)."""
    index = getattr(framework, "_shapes", None)
    if isinstance(index, ShapeIndex):
        return index.shapes()
    return {shape_of(p) for p in framework.list_pilots()}


def tightest_free(framework: Any, cores: int) -> int | None:
    """The fewest free cores, at least ``cores``, of an accepting pilot (None: none has)."""
    return min((s.free for s in shapes(framework)
                if s.accepting and s.free >= cores), default=None)


def widest_accepting(framework: Any) -> int:
    """The largest size of an accepting pilot (0: none)."""
    return max((s.size for s in shapes(framework) if s.accepting), default=0)


def most_room(framework: Any, cores: int) -> int | None:
    """The most backlog room of an accepting pilot wide enough for ``cores`` whose room
    holds them (None: none)."""
    return max((s.room for s in shapes(framework)
                if s.accepting and s.size >= cores and s.room >= cores), default=None)


def could_hold(framework: Any, cores: int) -> bool:
    """Whether a live pilot is wide enough for ``cores``."""
    return any(s.live and s.size >= cores for s in shapes(framework))
