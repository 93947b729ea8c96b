"""Other tenants' load over virtual time: how many of the CM's nodes they want.

The patterns follow the emulator's model (:mod:`elasticslice.emulator.tenants`): a target
count of tenant-held nodes; tenants take free nodes first and what free nodes cannot cover
is reclaimed from dynamic slices (ours) with a countdown. ``bursty`` draws its targets with
the emulator's own :func:`~elasticslice.emulator.tenants.next_busy_target`, seeded, so
every policy meets the same bursts.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from elasticslice.emulator.tenants import next_busy_target


@dataclass
class Pattern:
    """``target(now, ours)``: nodes other tenants want at ``now`` (``ours``: nodes we hold)."""

    name: str
    total: int

    def target(self, now: float, ours: int) -> int:
        raise NotImplementedError


@dataclass
class Steady(Pattern):
    """A constant share of the pool."""

    load: float = 0.4

    def target(self, now: float, ours: int) -> int:
        return round(self.total * self.load)


@dataclass
class Bursty(Pattern):
    """The emulator's load model: around ``load`` of the pool, redrawn every ``interval``."""

    load: float = 0.6
    interval: float = 1200.0
    seed: int = 10
    _targets: list[int] = field(default_factory=list)

    def target(self, now: float, ours: int) -> int:
        period = int(now // self.interval)
        if not self._targets:
            rng = random.Random(self.seed)
            self._targets.append(next_busy_target(rng, self.total, self.load))
            self._rng = rng
        while len(self._targets) <= period:
            self._targets.append(next_busy_target(self._rng, self.total, self.load))
        return self._targets[period]


@dataclass
class Reclaim(Pattern):
    """Steady ``load``; at ``at`` the tenants want every free node plus ``share`` of ours,
    for ``hold`` seconds (the target is fixed when the reclaim starts)."""

    load: float = 0.4
    at: float = 3600.0
    hold: float = 3600.0
    share: float = 0.5
    _fixed: int | None = None

    def target(self, now: float, ours: int) -> int:
        base = round(self.total * self.load)
        if not self.at <= now < self.at + self.hold:
            return base
        if self._fixed is None:
            self._fixed = self.total - ours + math.ceil(ours * self.share)
        return max(base, self._fixed)


def patterns(total: int, *, reclaim_at: float) -> list[Pattern]:
    """The three load patterns of the benchmark, fresh (they keep state)."""
    return [Steady("steady", total), Bursty("bursty", total),
            Reclaim("reclaim50", total, at=reclaim_at)]
