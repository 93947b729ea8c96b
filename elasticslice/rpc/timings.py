"""How long ProtoGENI calls take, by method: cumulative histogram counts kept in memory.

:class:`XmlRpcTransport` records every call here (the whole call as the caller waits for
it, retries and back-offs included, whether it succeeded or not); the manager's metrics
(:mod:`elasticslice.metrics`) read it when scraped. Recording is a bisect and three
additions under a lock: cheap next to a TLS round trip. Only method names are kept, never
parameters (they hold credentials).
"""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

#: upper bounds (seconds) of the buckets: a fast emulator call is a few ms, AddNodes on a
#: busy CloudLab tens of seconds
BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                              30.0, 60.0, 120.0)


@dataclass
class MethodTimes:
    """One method's calls: ``counts[i]`` calls took at most ``BUCKETS[i]`` (not cumulative;
    the last slot is +Inf), their ``total`` seconds."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    @property
    def calls(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' buckets: (upper bound, calls at most that long), +Inf last."""
        out, running = [], 0
        for bound, n in zip([*map(_bound, BUCKETS), "+Inf"], self.counts):
            running += n
            out.append((bound, running))
        return out


def _bound(value: float) -> str:
    return repr(float(value))


class CallTimings:
    """Durations of calls by method name, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._methods: dict[str, MethodTimes] = {}

    def record(self, method: str, seconds: float) -> None:
        slot = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            times = self._methods.get(method)
            if times is None:
                times = self._methods[method] = MethodTimes()
            times.counts[slot] += 1
            times.total += seconds

    def snapshot(self) -> dict[str, MethodTimes]:
        """A copy: method -> its times."""
        with self._lock:
            return {m: MethodTimes(list(t.counts), t.total) for m, t in self._methods.items()}
