"""Counts of what strangers did, logged as one line an interval instead of a line each.

A listener that logs a line per refused connection lets any stranger fill its log; a
:class:`Tally` counts instead, and :meth:`Tally.flush` (called often, from the listener's
loop) logs the counts as one WARNING line at most every ``interval`` seconds.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Tally:
    """Counts of what strangers did, logged by :meth:`flush` as one WARNING line (``name``:
    counts since the last line) at most every ``interval`` seconds; the first count of a
    quiet spell is logged at the next flush. Thread-safe."""

    def __init__(self, name: str, interval: float = 60.0, logger: logging.Logger = log,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.interval, self._log, self._clock = name, interval, logger, clock
        self._lock = threading.Lock()
        self._totals: collections.Counter[str] = collections.Counter()
        self._pending: collections.Counter[str] = collections.Counter()
        self._last: float | None = None

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self._totals[what] += n
            self._pending[what] += n

    def total(self, what: str) -> int:
        with self._lock:
            return self._totals[what]

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._totals)

    def flush(self, force: bool = False) -> bool:
        """Log the counts since the last line if ``interval`` passed (or ``force``);
        whether a line was logged."""
        now = self._clock()
        with self._lock:
            if not self._pending or (not force and self._last is not None
                                     and now - self._last < self.interval):
                return False
            since = "" if self._last is None else f" in the last {now - self._last:.0f} s"
            parts = "; ".join(f"{what}: {n}" for what, n in sorted(self._pending.items()))
            self._pending.clear()
            self._last = now
        self._log.warning("%s%s: %s", self.name, since, parts)
        return True
