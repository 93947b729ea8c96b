"""Where a unit goes: the pilot whose work ends when the unit's does.

A unit with a ``runtime`` hint has an expected end (its start plus the hint). Placed on the
pilot whose running units end latest at or after that end (the closest such), else on the
one whose latest end comes closest before it, units that end together share pilots: the
long units of a wave run on few pilots and the short ones on the others, which empty
together (the wave's tail frees whole nodes, and a reclaim of a node holding only short
work cuts nothing). Ties, and units without a hint, go best fit (the fewest free cores that
fit; then the order the pilots were given in), as before.

A unit is *long* when it would not end within ``horizon`` seconds (a reclaim's countdown);
a pilot running one is *exposed*. Started first (:mod:`troy.order`), the long units of a
wave would take every pilot; with a ``budget`` (cores) a long unit exposes one more pilot
only while the exposed pilots' cores are under it, and otherwise waits for room on an
exposed one. :func:`long_budget` is the cores the long work needs to end with the rest of
the work: the pilots it leaves unexposed are the ones a reclaim can take for free (their
resource values say so: :mod:`elasticslice.pilots.values`).

The elasticity simulation (``bench/elastic``) places its units with :func:`choose`, as
Troy's ``local`` framework places late-bound units.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")


@dataclass(frozen=True)
class Slot(Generic[K]):
    """A pilot (or node) as placement sees it: ``key`` (the caller's), ``size`` and
    ``free`` cores, ``end``: when the last of its running units is expected to end (None:
    it runs nothing; ``math.inf``: it runs a unit without a hint)."""

    key: K
    size: int
    free: int
    end: float | None = None


def exposed(slot: Slot, now: float, horizon: float) -> bool:
    """Whether ``slot`` runs work that would not end within ``horizon`` seconds of ``now``."""
    return slot.end is not None and slot.end > now + horizon


@dataclass(frozen=True)
class Budget:
    """``cores`` the exposed pilots may hold; ``span``: seconds until all the work could
    end (a long unit at least that long is never held back: the work ends with it)."""

    cores: float
    span: float


def long_budget(long_work: float, work: float, cores: int, longest: float = 0.0) -> Budget:
    """The cores that ``long_work`` (core-seconds) needs to end when all the ``work``
    (core-seconds, the long included) could end on ``cores``: the long work over the time
    the whole takes (``work / cores``, at least the ``longest`` unit's runtime)."""
    span = max(work / max(cores, 1), longest)
    return Budget(long_work / span if span > 0 else 0.0, span)


def choose(slots: Sequence[Slot[K]], cores: int, end: float | None, *, now: float,
           horizon: float, budget: Callable[[], Budget] | None = None) -> Slot[K] | None:
    """The slot for a unit of ``cores`` expected to end at ``end`` (None: no hint): by
    matching ends (module doc), ties best fit; without a hint, best fit. None if none
    fits or (a long unit, with a ``budget``) if it would expose one pilot too many.
    ``budget()`` is called only when that is the question (it may cost a look at the
    whole queue)."""
    fits = [s for s in slots if s.free >= cores]
    if not fits:
        return None
    if end is None:
        return min(fits, key=lambda s: s.free)
    if budget is not None and end > now + horizon:
        open_ = [s for s in fits if exposed(s, now, horizon)]
        if not open_:
            held = sum(s.size for s in slots if exposed(s, now, horizon))
            limit = budget()
            if held >= limit.cores and end - now < limit.span:
                return None
            open_ = fits
        fits = open_
    return min(fits, key=lambda s: _by_end(s, end))


def _by_end(slot: Slot, end: float) -> tuple[int, float, int]:
    if slot.end is None:
        return (2, 0.0, slot.free)
    if slot.end >= end:
        return (0, slot.end - end, slot.free)
    return (1, end - slot.end, slot.free)
