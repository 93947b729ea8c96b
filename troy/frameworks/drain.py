"""Records and rules of the drain (its steps are ``PilotFramework.drain_pilot``, a template
in :mod:`troy.frameworks.base`): ``DrainPlan`` (what a drain decided), ``Drain`` (its
bookkeeping), ``UnitStats`` (requeues, duplicates, losses) and ``keeps`` (whether a running
unit is expected to end before a deadline).

A drain is how a pilot leaves gracefully before its resources are taken away (a CloudLab
node reclaimed with a deadline): nothing new goes to it; units expected to end before
``deadline - margin`` run on; the others are requeued at once and run elsewhere; at
``deadline - margin`` whatever is left is requeued too (killed on the pilot). Units are run
at least once: a requeued unit whose first attempt ends anyway counts as a duplicate.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from troy.states import State

if TYPE_CHECKING:
    from troy.frameworks.pilot import Pilot
    from troy.unit import ComputeUnit

log = logging.getLogger(__name__)

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
    """The bookkeeping of one drain in progress (``PilotFramework._drain_lock`` guards it).

    ``holding``: the units still on the pilot (None until the framework said what the pilot
    holds; units that left before are in ``left``); ``moved``: units this drain requeued
    (they leave the pilot when their attempt there is over); ``fired``: ``on_empty`` was
    called; ``ended``: the pilot went away before it emptied (no ``on_empty``, no watchdog).
    """

    pilot: Pilot
    plan: DrainPlan
    on_empty: list[Callable[[Pilot], None]] = field(default_factory=list)
    timer: threading.Timer | None = None
    holding: dict[str, ComputeUnit] | None = None
    left: set[str] = field(default_factory=set)
    moved: set[str] = field(default_factory=set)
    fired: bool = False
    ended: bool = False

    @property
    def until(self) -> float | None:
        """When kept units must be over: ``deadline - margin``."""
        d = self.plan.deadline
        return None if d is None else d - self.plan.margin

    @property
    def over(self) -> bool:
        return self.fired or self.ended

    def bring_closer(self, deadline: float | None, margin: float) -> None:
        """A drain asked again: its deadline may only come closer (with its margin)."""
        if deadline is not None and (self.plan.deadline is None
                                     or deadline < self.plan.deadline):
            self.plan.deadline, self.plan.margin = deadline, margin

    def add_callback(self, cb: Callable[[Pilot], None] | None) -> bool:
        """Keep another ``on_empty``; True when it must be called now (the pilot emptied
        already). Each callable is kept once."""
        if cb is None or cb in self.on_empty or self.ended:
            return False
        self.on_empty.append(cb)
        return self.fired

    def arm(self, action: Callable[[], None]) -> None:
        """(Re)arm the watchdog that runs ``action`` at ``until``."""
        self.disarm()
        if self.until is None:
            return
        self.timer = threading.Timer(max(0.0, self.until - time.time()), action)
        self.timer.daemon = True
        self.timer.start()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def call_on_empty(cb: Callable[[Pilot], None], pilot: Pilot) -> None:
    """``cb(pilot)`` on a thread of its own (it may be slow, or drain again)."""
    threading.Thread(target=_call, args=(cb, pilot), daemon=True,
                     name=f"troy-{pilot.id}-empty").start()


def _call(cb: Callable[[Pilot], None], pilot: Pilot) -> None:
    try:
        cb(pilot)
    except Exception:  # a user's callback must not break the framework
        log.exception("on_empty callback for %s failed", pilot.id)
