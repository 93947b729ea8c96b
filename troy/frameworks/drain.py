"""Records and rules shared by every framework's drain: ``DrainPlan`` (what a drain
decided), ``UnitStats`` (requeues, duplicates, losses) and ``keeps`` (whether a running unit
is expected to end before a deadline).

A drain is how a pilot leaves gracefully before its resources are taken away (a CloudLab
node reclaimed with a deadline): nothing new goes to it; units expected to end before
``deadline - margin`` run on; the others are requeued at once and run elsewhere; at
``deadline - margin`` whatever is left is requeued too (killed on the pilot). Units are run
at least once: a requeued unit whose first attempt ends anyway counts as a duplicate.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from troy.states import State

if TYPE_CHECKING:
    from troy.frameworks.base import Pilot
    from troy.unit import ComputeUnit

# Without a runtime hint, a running unit is let finish when at least this many seconds are
# left before ``deadline - margin`` (the framework's ``long_unit`` option is used instead
# when it is larger).
AMPLE = 30.0


@dataclass
class DrainPlan:
    """What ``drain_pilot`` decided for one pilot. ``deadline``: epoch seconds (None: let
    everything finish); ``dispatch_stopped_at``: when nothing new could go to the pilot
    any more; ``kept``: ids of units let finish there; ``requeued``: ids of units moved
    away at once (more may follow at ``deadline - margin``: ``late_requeued``)."""

    pilot: str
    deadline: float | None
    margin: float
    started_at: float
    dispatch_stopped_at: float | None = None
    kept: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    late_requeued: list[str] = field(default_factory=list)
    emptied_at: float | None = None


@dataclass(frozen=True)
class UnitStats:
    """Counts for a report. ``requeued``: times a unit was moved off a pilot that went away
    or was drained (moves, not units: a unit moved off two pilots in turn counts twice, so
    the figure may exceed the number of units); ``duplicates``: extra completions of a unit's work (an attempt that ended
    although the unit had been requeued, or ran elsewhere too); ``lost``: units that ended
    FAILED or CANCELED because the framework lost them, not by their own doing (0 is the
    goal)."""

    requeued: int = 0
    duplicates: int = 0
    lost: int = 0

    def __add__(self, other: UnitStats) -> UnitStats:
        return UnitStats(self.requeued + other.requeued, self.duplicates + other.duplicates,
                         self.lost + other.lost)


class StatCounter:
    """A framework's live ``UnitStats`` (thread-safe increments)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requeued = self.duplicates = self.lost = 0

    def add(self, requeued: int = 0, duplicates: int = 0, lost: int = 0) -> None:
        with self._lock:
            self.requeued += requeued
            self.duplicates += duplicates
            self.lost += lost

    def completed(self, unit: ComputeUnit) -> None:
        """``unit``'s work ran to the end once more (a second time is a duplicate)."""
        with self._lock:
            unit.completions += 1
            if unit.completions > 1:
                self.duplicates += 1

    def snapshot(self) -> UnitStats:
        with self._lock:
            return UnitStats(self.requeued, self.duplicates, self.lost)


def keeps(unit: ComputeUnit, until: float | None, now: float, ample: float = AMPLE) -> bool:
    """Whether ``unit`` may run on where it is, being expected to end by ``until`` (epoch
    seconds; None: always). Only a RUNNING unit may: one still queued on a doomed pilot is
    better off elsewhere. With a runtime hint: its start plus the hint; without: if at least
    ``ample`` seconds are left."""
    if unit.state is not State.RUNNING:
        return False
    if until is None:
        return True
    hint = unit.description.runtime
    if hint:
        return (unit.start or now) + float(hint) <= until
    return until - now >= ample


@dataclass
class Drain:
    """A framework's bookkeeping of one drain in progress."""

    plan: DrainPlan
    on_empty: list[Callable[[Pilot], None]] = field(default_factory=list)
    timer: threading.Timer | None = None
    holding: set[str] = field(default_factory=set)   # unit ids still on the pilot
    fired: bool = False

    @property
    def until(self) -> float | None:
        """When kept units must be over: ``deadline - margin``."""
        d = self.plan.deadline
        return None if d is None else d - self.plan.margin

    def arm(self, action: Callable[[], None]) -> None:
        """(Re)arm the watchdog that runs ``action`` at ``until``."""
        if self.timer is not None:
            self.timer.cancel()
        if self.until is None:
            return
        self.timer = threading.Timer(max(0.0, self.until - time.time()), action)
        self.timer.daemon = True
        self.timer.start()

    def add_callback(self, pilot: Pilot, cb: Callable[[Pilot], None] | None) -> None:
        """Another ``on_empty`` (a drain asked again): called once too, at once if the
        pilot is empty already."""
        if cb is None or cb in self.on_empty:
            return
        self.on_empty.append(cb)
        if self.fired:
            _start(cb, pilot)

    def fire_if_empty(self, pilot: Pilot) -> None:
        """Call every ``on_empty(pilot)`` once, on a thread of its own, when nothing is
        left."""
        if self.holding or self.fired:
            return
        self.fired = True
        self.plan.emptied_at = time.time()
        if self.timer is not None:
            self.timer.cancel()
        for cb in self.on_empty:
            _start(cb, pilot)


def _start(cb: Callable[[Pilot], None], pilot: Pilot) -> None:
    threading.Thread(target=_call, args=(cb, pilot), daemon=True,
                     name=f"troy-{pilot.id}-empty").start()


def _call(cb: Callable[[Pilot], None], pilot: Pilot) -> None:
    import logging
    try:
        cb(pilot)
    except Exception:  # a user's callback must not break the framework
        logging.getLogger(__name__).exception("on_empty callback for %s failed", pilot.id)
