"""The pilot framework contract (seed 003): a handful of methods, no more.

A framework owns pilots (resource placeholders of ``size`` cores) and runs compute units on
them. ``submit_unit(cud)`` without a pilot leaves the binding to the framework (late binding);
with a pilot it binds early. Application-level schedulers inspect ``list_pilots()`` (state,
``description.size``, ``free_cores``) and pick a framework through the public API alone.

A subclass must provide: ``kind`` (the registry name), ``start``, ``close``,
``_launch_pilot``, ``_cancel_pilot``, ``_submit``, ``cancel_unit``. It must push every unit
state change through ``unit._set_state`` and every pilot change through ``pilot._set_state``.
Constructors do no I/O; ``start`` does.

Draining (``drain_pilot``) is a template here, the same on every framework; a framework that
can drain provides three hooks (``_stop_dispatch``, ``_held_units``, ``_requeue_units``),
calls ``_unit_left`` whenever a unit ends or moves off a pilot, and ``_end_drain`` when a
pilot goes away before it emptied (see "drains" below). ``retire`` (a pilot finishing the
work Troy's drain does not see, then leaving) does nothing by default; a framework whose
pilots run others' work too overrides it (``dask``: Dask's retirement of the worker).
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from troy.descriptions import ComputeUnitDescription, PilotDescription
from troy.errors import BadParameter, DoesNotExist, IncorrectState
from troy.frameworks.drain import (AMPLE, Drain, DrainPlan, StatCounter, UnitStats,
                                   call_on_empty, keeps)
from troy.frameworks.pilot import Pilot, PilotCallback
from troy.frameworks.shapes import ShapeIndex
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit

__all__ = ["Pilot", "PilotCallback", "PilotFramework"]

log = logging.getLogger(__name__)


class PilotFramework(ABC):
    """Base of every pilot framework (``local``, ``dask``, ...).

    Options every framework takes: ``long_unit`` (seconds: units with a runtime hint at
    least this long are *long*, default 30) and ``low_value`` (pilots valued below it,
    default 0.5, get no long unit while another live pilot could take it; see
    ``set_pilot_values``)."""

    kind: ClassVar[str] = ""

    def __init__(self, name: str | None = None, *, long_unit: float = 30.0,
                 low_value: float = 0.5, **options: Any) -> None:
        self.name = name or self.kind
        self.options = options
        self._pilots: dict[str, Pilot] = {}
        self._shapes = ShapeIndex()  # pilots per shape: what the schedulers ask
        self._lock = threading.RLock()
        for opt, v in (("long_unit", long_unit), ("low_value", low_value)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise BadParameter(f"framework {self.name!r}: {opt}: expected a number "
                                   f">= 0, got {v!r}")
        self.long_unit = float(long_unit)
        self.low_value = float(low_value)
        self._stats = StatCounter()
        self._values: dict[str, float] = {}
        # the units no framework has yet (queued in a unit service, held by a workload
        # manager; set by Session.add_framework): the work a wave still has (troy.place)
        self.work_to_come: Callable[[], list[ComputeUnitDescription]] | None = None
        self._drains: dict[str, Drain] = {}     # pilot id -> its drain (over ones too)
        self._draining: dict[str, Drain] = {}   # the drains not over yet
        self._drain_lock = threading.RLock()    # guards both; never held across a hook

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} pilots={len(self._pilots)}>"

    # -- lifecycle --------------------------------------------------------------------
    @abstractmethod
    def start(self) -> None:
        """Acquire what the framework needs (processes, a scheduler...). Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Cancel every pilot and release everything; units not final become CANCELED."""

    # -- pilots -----------------------------------------------------------------------
    def submit_pilot(self, description: PilotDescription | dict[str, Any]) -> Pilot:
        """Start a pilot of ``description.size`` cores; returns at once (state PENDING)."""
        pd = PilotDescription.coerce(description)
        pilot = Pilot(pd, self)
        with self._lock:
            self._pilots[pilot.id] = pilot
        self._launch_pilot(pilot)
        return pilot

    def add_pilot_callback(self, cb: PilotCallback) -> None:
        """Call ``cb(pilot, state)`` on every state change of every pilot of this framework,
        present and future, however created (a UnitService uses it to re-check the units
        it queues). ``Pilot._set_state`` calls these after the pilot's own callbacks."""
        with self._lock:
            if not hasattr(self, "_pilot_watchers"):
                self._pilot_watchers: list[PilotCallback] = []
            self._pilot_watchers.append(cb)

    def list_pilots(self) -> list[Pilot]:
        with self._lock:
            return list(self._pilots.values())

    def get_pilot(self, pilot_id: str) -> Pilot:
        with self._lock:
            try:
                return self._pilots[pilot_id]
            except KeyError:
                raise DoesNotExist(f"framework {self.name!r} has no pilot {pilot_id!r}") from None

    def cancel_pilot(self, pilot_id: str) -> None:
        pilot = self.get_pilot(pilot_id)
        if pilot.state not in FINAL_STATES:
            self._cancel_pilot(pilot)
            pilot._set_state(State.CANCELED)

    def wait_pilot(self, pilot: Pilot, timeout: float | None = None) -> State:
        """Block until ``pilot`` leaves PENDING (frameworks may override to wait better)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pilot.state is State.PENDING:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return pilot.state

    def find_pilot(self, key: str) -> Pilot | None:
        """The pilot whose id, ``native_id`` or ``worker_name`` is ``key`` (live pilots
        first: a worker name may come back after its pilot ended), or None."""
        found = [p for p in self.list_pilots() if key in (p.id, p.native_id, p.worker_name)]
        live = [p for p in found if p.state not in FINAL_STATES]
        return (live or found or [None])[-1]

    def set_pilot_values(self, values: Mapping[str, float]) -> None:
        """Record the resource owner's value of pilots (keys: pilot id, ``native_id`` or
        ``worker_name``; values 0..1, lower is reclaimed sooner); a pilot that appears later
        under a known key gets its value then. Long units (runtime hint >= ``long_unit``)
        go to no pilot valued below ``low_value`` while another RUNNING pilot that is not
        draining could take them."""
        with self._lock:
            for key, v in values.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise BadParameter(f"framework {self.name!r}: value of {key!r}: "
                                       f"expected a number, got {v!r}")
                self._values[str(key)] = float(v)
            for p in self._pilots.values():
                self._apply_value(p)
        self._values_changed()

    def _apply_value(self, pilot: Pilot) -> None:
        for key in (pilot.id, pilot.native_id, pilot.worker_name):
            if key is not None and key in self._values:
                pilot.value = self._values[key]

    def _values_changed(self) -> None:
        """Pilot values or the set of live pilots changed (frameworks re-place long units)."""

    def is_long(self, cud: ComputeUnitDescription) -> bool:
        return bool(cud.runtime) and float(cud.runtime) >= self.long_unit

    def long_pilots(self) -> list[Pilot]:
        """The pilots that may take long units now: RUNNING, not draining, valued at least
        ``low_value`` (or not valued); if there is none, every RUNNING pilot that is not
        draining. A long unit no such pilot is wide enough for may go to any pilot."""
        live = [p for p in self.list_pilots() if p.state is State.RUNNING and not p.draining]
        return [p for p in live if p.value is None or p.value >= self.low_value] or live

    # -- drains: a template; frameworks provide the hooks -------------------------------
    def drain_pilot(self, pilot: Pilot, deadline: float | None = None, *, margin: float = 5.0,
                    on_empty: Callable[[Pilot], None] | None = None) -> DrainPlan:
        """Empty ``pilot`` before ``deadline`` (absolute: epoch seconds; None: let
        everything finish).

        Nothing new goes to it once this returns (``plan.dispatch_stopped_at``). Units not
        expected to end by ``deadline - margin`` (start plus runtime hint; without a hint,
        expected to end if at least ``max(long_unit, 30)`` s are left), and units queued on
        it, are requeued at once and run elsewhere (``plan.requeued``); the others run on
        (``plan.kept``). At ``deadline - margin`` whatever still runs there is requeued too
        (killed on the pilot: ``plan.late_requeued``). ``on_empty(pilot)`` is called once,
        on a thread of its own, when the pilot holds no unit (at once if it is empty).
        Asked again, a drain may only bring the deadline closer (with its margin), decides
        again with it, and calls the new ``on_empty`` too. The pilot stays RUNNING
        (``draining``) until it goes away; if it goes away first (``lose_pilot``, its
        machine leaving) there is no ``on_empty``."""
        deadline, margin = self._drain_numbers(deadline, margin)
        with self._drain_lock:
            d = self._drains.get(pilot.id)
            first = d is None
            if first:
                d = Drain(pilot, DrainPlan(pilot.id, deadline, margin, time.time()))
                self._drains[pilot.id] = self._draining[pilot.id] = d
            else:
                d.bring_closer(deadline, margin)
            now_too = d.add_callback(on_empty)
        if now_too and on_empty is not None:
            call_on_empty(on_empty, pilot)
        if first:
            pilot.draining = True
            self._stop_dispatch(pilot)
            d.plan.dispatch_stopped_at = time.time()
            log.info("pilot %s: draining (deadline in %s s)", pilot.id,
                     "-" if deadline is None else f"{deadline - time.time():.1f}")
            held = self._held_units(pilot) if pilot.state not in FINAL_STATES else {}
            with self._drain_lock:
                d.holding = {uid: u for uid, u in held.items() if uid not in d.left
                             and u.state not in FINAL_STATES}
                d.left.clear()
        self._review_drain(d)
        return d.plan

    def _drain_numbers(self, deadline: Any, margin: Any) -> tuple[float | None, float]:
        for what, v in (("deadline", deadline), ("margin", margin)):
            if v is None and what == "deadline":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or (what == "margin" and v < 0):
                raise BadParameter(f"framework {self.name!r}: drain_pilot {what}: expected "
                                   f"a finite number{' >= 0' if what == 'margin' else ''} "
                                   f"(epoch seconds for the deadline), got {v!r}")
        return (None if deadline is None else float(deadline)), float(margin)

    def _review_drain(self, d: Drain, at_deadline: bool = False) -> None:
        """Requeue what the drain cannot keep (everything ``at_deadline``), re-arm the
        watchdog, call ``on_empty`` if nothing is left."""
        pilot = d.pilot
        with self._drain_lock:
            if d.holding is None or d.over or (at_deadline and pilot.state in FINAL_STATES):
                return
            now, ample = time.time(), max(AMPLE, self.long_unit)
            move = [u for uid, u in d.holding.items() if uid not in d.moved
                    and (at_deadline or not keeps(u, d.until, now, ample))]
            d.moved.update(u.id for u in move)
            (d.plan.late_requeued if at_deadline else d.plan.requeued).extend(
                u.id for u in move)
            d.plan.kept = sorted((set(d.plan.kept) | set(d.holding)) - d.moved)
        if move:
            if at_deadline:
                log.warning("pilot %s: %d unit(s) still running at deadline - margin: "
                            "requeued", pilot.id, len(move))
            self._requeue_units(pilot, move)
        with self._drain_lock:
            if not at_deadline and not d.over and d.holding:
                d.arm(lambda: self._review_drain(d, at_deadline=True))
        self._fire_if_empty(d)

    def _fire_if_empty(self, d: Drain) -> None:
        with self._drain_lock:
            if d.over or d.holding is None or d.holding:
                return
            d.fired = True
            d.plan.emptied_at = time.time()
            d.disarm()
            self._draining.pop(d.plan.pilot, None)
            callbacks = list(d.on_empty)
        for cb in callbacks:
            call_on_empty(cb, d.pilot)

    def _unit_left(self, unit_id: str) -> None:
        """For frameworks: ``unit_id`` is no longer on the pilot it was handed to (it
        ended, was canceled or was moved away). Cheap when nothing drains."""
        if not self._draining:
            return
        emptied = []
        with self._drain_lock:
            for d in self._draining.values():
                if d.holding is None:
                    d.left.add(unit_id)
                elif d.holding.pop(unit_id, None) is not None and not d.holding:
                    emptied.append(d)
        for d in emptied:
            self._fire_if_empty(d)

    def _end_drain(self, pilot: Pilot) -> None:
        """For frameworks: ``pilot`` went away before it emptied (its units are requeued by
        whoever ends it): no watchdog, no ``on_empty``."""
        with self._drain_lock:
            d = self._draining.pop(pilot.id, None)
            if d is not None:
                d.ended = True
                d.disarm()

    def _end_drains(self) -> None:
        """For ``close``: every drain's watchdog stops."""
        with self._drain_lock:
            drains, self._draining = list(self._draining.values()), {}
            for d in drains:
                d.ended = True
                d.disarm()

    def drain_plan(self, pilot: Pilot) -> DrainPlan | None:
        """The plan of ``pilot``'s drain, if it was drained."""
        with self._drain_lock:
            d = self._drains.get(pilot.id)
            return d.plan if d is not None else None

    def _stop_dispatch(self, pilot: Pilot) -> None:
        """Hook: once this returns, no unit may start on ``pilot`` that was not handed to it
        before (``pilot.draining`` is set already); units queued for it alone go back to
        the framework's queue (to run elsewhere)."""
        raise IncorrectState(f"framework {self.name!r} ({self.kind}) cannot drain pilots")

    def _held_units(self, pilot: Pilot) -> dict[str, ComputeUnit]:
        """Hook: the units ``pilot`` holds now (queued there or running), by id."""
        raise IncorrectState(f"framework {self.name!r} ({self.kind}) cannot drain pilots")

    def _requeue_units(self, pilot: Pilot, units: list[ComputeUnit]) -> None:
        """Hook: move ``units`` off ``pilot`` (killed there) to run elsewhere, and call
        ``_unit_left`` for each once its attempt there is over (at once or later)."""
        raise IncorrectState(f"framework {self.name!r} ({self.kind}) cannot drain pilots")

    def retire(self, pilot: Pilot, until: float | None = None) -> bool:
        """Let ``pilot`` finish what it runs that Troy's drain does not see (work of the
        framework's other users: on ``dask``, plain Dask tasks of the scheduler's other
        clients) and leave, waiting until ``until`` (epoch seconds; None: as long as it
        takes) at most. Called after ``drain_pilot``'s ``on_empty``, or before a pilot's
        machine is given back. True when the pilot left or had nothing to finish; False
        when it did not make it by ``until`` (the framework's own recovery takes over).

        The default is for a framework that runs only Troy's units: nothing to finish,
        True at once. A framework whose pilots run other work overrides it."""
        return True

    def lose_pilot(self, pilot: Pilot, reason: str = "lost") -> list[ComputeUnit]:
        """``pilot``'s machine is gone (forced revocation, crash): requeue at once every
        unit it had (returned), the pilot goes FAILED. Idempotent; nothing waits for the
        machine."""
        raise IncorrectState(f"framework {self.name!r} ({self.kind}) cannot lose pilots")

    def unit_stats(self) -> UnitStats:
        """Requeues, duplicate completions and lost units so far (see ``UnitStats``)."""
        return self._stats.snapshot()

    def live_units(self) -> list[ComputeUnit]:
        """The units this framework holds that are not final (queued or running)."""
        return []

    @property
    def free_cores(self) -> int:
        return sum(p.free_cores for p in self.list_pilots())

    @property
    def total_cores(self) -> int:
        return sum(p.size for p in self.list_pilots() if p.state is State.RUNNING)

    # -- units ------------------------------------------------------------------------
    def submit_unit(self, unit: ComputeUnit | ComputeUnitDescription | dict[str, Any],
                    pilot: Pilot | str | None = None) -> ComputeUnit:
        """Run a unit. ``pilot`` binds it early; None leaves the choice to the framework.

        A unit wider than every pilot of this framework waits until one appears.
        """
        if not isinstance(unit, ComputeUnit):
            unit = ComputeUnit(ComputeUnitDescription.coerce(unit))
        target = self.get_pilot(pilot) if isinstance(pilot, str) else pilot
        if target is not None and target.state in FINAL_STATES:
            raise IncorrectState(f"pilot {target.id} is {target.state.value}")
        if target is not None and target.draining:  # nothing new reaches a draining pilot
            log.info("unit %s: pilot %s is draining; bound late instead", unit.id, target.id)
            target = None
        unit.framework = self.name
        unit._framework_obj = self
        unit.attempts += 1
        unit._set_state(State.DISPATCHED)
        self._submit(unit, target)
        return unit

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Within it, this thread's submissions may be held and handed over together when
        it ends (a framework that pays per hand-over batches them); none by default."""
        yield

    @abstractmethod
    def cancel_unit(self, unit: ComputeUnit) -> None:
        """Cancel ``unit``: never starts if queued; killed if running; state CANCELED."""

    # -- for subclasses ---------------------------------------------------------------
    @abstractmethod
    def _launch_pilot(self, pilot: Pilot) -> None:
        """Start the pilot's resources; push RUNNING when it can take units."""

    @abstractmethod
    def _cancel_pilot(self, pilot: Pilot) -> None:
        """Stop the pilot's resources and requeue or cancel its unfinished units."""

    @abstractmethod
    def _submit(self, unit: ComputeUnit, pilot: Pilot | None) -> None:
        """Queue ``unit`` (bound to ``pilot`` if given); push PENDING/RUNNING/final states."""
