"""The ``local`` pilot framework: pilots are core budgets on this machine.

A pilot of ``size`` cores is a budget, not a process: any size is allowed (a 32-core pilot on
a 2-core laptop simply lets 32 one-core units run at once). Units run for real through
``troy.execution.execute`` in a thread pool: executables as subprocesses (killable), Python
callables in the pool thread (not interruptible; a canceled callable's result is dropped).

Binding: an early-bound unit waits for room on its pilot; a late-bound unit goes where
:func:`troy.place.choose` says: with a runtime hint, to the RUNNING pilot whose units end
when it does (long units together, ``long_unit`` the horizon; a long unit exposes another
pilot only within the budget of the work known: queued and running here, and what the
session's unit services and workload managers hold, ``work_to_come``); without one, to the
pilot whose free cores fit it most tightly (best fit, which keeps wide pilots free for wide
units). A unit never blocks the queue behind it: smaller units run while a wide one waits,
and a unit wider than every pilot waits until a wide-enough pilot appears.
Canceling a pilot (or its walltime running out) kills its running units and requeues them,
with their queued ones, onto the other pilots. Draining a pilot (``drain_pilot``, the base's
template) stops new units at once (a draining pilot has no free cores, and units bound to it
go back to late binding) and kills the running units that would not end in time, which
requeue the same way; ``lose_pilot`` kills them all. ``retire`` is the base's (True at
once): a local pilot runs Troy's units alone, so once drained it has nothing left to finish.
Long units (``long_unit``) prefer valued pilots (see
``PilotFramework.set_pilot_values``).
"""
from __future__ import annotations

import functools
import logging
import math
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from troy import execution
from troy.errors import BadParameter
from troy.frameworks.base import Pilot, PilotFramework
from troy.frameworks.shapes import tightest_free
from troy.place import Budget, Slot, choose, long_budget
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit, UnitResult

log = logging.getLogger(__name__)


@dataclass
class _Run:
    """One attempt of a unit on a pilot (cores reserved until the attempt's thread ends)."""

    unit: ComputeUnit
    pilot: Pilot
    cores: int
    procs: list[subprocess.Popen] = field(default_factory=list)
    canceled: bool = False
    requeued: bool = False


class LocalFramework(PilotFramework):
    """Pilots as core budgets on this machine; units as real subprocesses.

    Options: ``sandbox`` (default working directory of units; default: the current
    directory), ``max_workers`` (threads running units at once; default 256).
    """

    kind = "local"

    def __init__(self, name: str | None = None, *, sandbox: str | None = None,
                 max_workers: int | None = None, **options: Any) -> None:
        super().__init__(name, sandbox=sandbox, max_workers=max_workers, **options)
        self.sandbox = sandbox
        self._max_workers = max_workers or 256
        self._queue: list[tuple[ComputeUnit, Pilot | None]] = []
        self._running: dict[str, _Run] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._timers: dict[str, threading.Timer] = {}
        self._closed = False
        self._held_at = -math.inf
        self._held_seen: list[tuple[int, float]] = []

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._executor is None and not self._closed:
                self._executor = ThreadPoolExecutor(
                    max_workers=self._max_workers, thread_name_prefix=f"troy-{self.name}")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            queued = [u for u, _ in self._queue]
            self._queue = []
            runs = list(self._running.values())
            for run in runs:
                run.canceled = True
            timers = list(self._timers.values())
            self._timers.clear()
            pilots = list(self._pilots.values())
            executor, self._executor = self._executor, None
        for t in timers:
            t.cancel()
        self._end_drains()
        for run in runs:
            for proc in list(run.procs):
                execution.kill(proc)
        for unit in queued + [r.unit for r in runs]:
            unit._set_state(State.CANCELED)
        for pilot in pilots:
            pilot._set_state(State.CANCELED)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    # -- pilots -----------------------------------------------------------------------
    def _launch_pilot(self, pilot: Pilot) -> None:
        self.start()
        pilot.native_id = f"local:{pilot.id}"
        walltime = pilot.description.walltime
        if walltime:
            timer = threading.Timer(walltime, self._expire, (pilot,))
            timer.daemon = True
            with self._lock:
                self._timers[pilot.id] = timer
            timer.start()
        pilot._set_state(State.RUNNING)
        self._schedule()

    def _expire(self, pilot: Pilot) -> None:
        """The pilot's walltime is over: it ends DONE; its units go to other pilots."""
        if pilot.state in FINAL_STATES:
            return
        log.info("pilot %s reached its walltime of %ss", pilot.id, pilot.description.walltime)
        self._cancel_pilot(pilot)
        pilot._set_state(State.DONE)

    def _cancel_pilot(self, pilot: Pilot) -> None:
        # No unit starts on it from now: its killed units requeue (their threads) while it
        # is still RUNNING (its caller sets the final state after this), and the next
        # placement put them back on it (under load: the unit ran on, on a pilot gone).
        pilot.draining = True
        with self._lock:
            timer = self._timers.pop(pilot.id, None)
            self._queue = [(u, None if b is pilot else b) for u, b in self._queue]
            runs = [r for r in self._running.values() if r.pilot is pilot]
            for run in runs:
                run.requeued = True
            procs = [p for r in runs for p in r.procs]
        if timer is not None:
            timer.cancel()
        for proc in procs:  # the attempt's thread requeues the unit once the process is gone
            execution.kill(proc)

    # -- drain hooks (the drain itself: PilotFramework.drain_pilot) ----------------------
    def _stop_dispatch(self, pilot: Pilot) -> None:
        with self._lock:  # a draining pilot has no free cores: only its bound units wait
            self._queue = [(u, None if b is pilot else b) for u, b in self._queue]
        self._schedule()

    def _held_units(self, pilot: Pilot) -> dict[str, ComputeUnit]:
        with self._lock:
            return {r.unit.id: r.unit for r in self._running.values() if r.pilot is pilot}

    def _requeue_units(self, pilot: Pilot, units: list[ComputeUnit]) -> None:
        """Kill their processes: their threads requeue them (``_finish``)."""
        ids = {u.id for u in units}
        with self._lock:
            runs = [r for r in self._running.values() if r.pilot is pilot and r.unit.id in ids]
            for run in runs:
                run.requeued = True
            procs = [p for r in runs for p in r.procs]
        for proc in procs:
            execution.kill(proc)

    def lose_pilot(self, pilot: Pilot, reason: str = "lost") -> list[ComputeUnit]:
        if pilot.state in FINAL_STATES:
            return []
        log.warning("pilot %s: %s; requeuing its units", pilot.id, reason)
        pilot.draining = True
        self._end_drain(pilot)  # gone before it emptied: no on_empty, no watchdog
        with self._lock:
            units = [u for u, b in self._queue if b is pilot]
            units += [r.unit for r in self._running.values() if r.pilot is pilot]
        self._cancel_pilot(pilot)
        pilot._set_state(State.FAILED)
        self._schedule()
        return units

    def live_units(self) -> list[ComputeUnit]:
        with self._lock:
            return [u for u, _ in self._queue] + [r.unit for r in self._running.values()]

    # -- units ------------------------------------------------------------------------
    def _submit(self, unit: ComputeUnit, pilot: Pilot | None) -> None:
        cores = unit.description.cores
        if pilot is not None and cores > pilot.size:
            raise BadParameter(f"unit {unit.id} needs {cores} cores; pilot {pilot.id} has "
                               f"{pilot.size}")
        self.start()
        with self._lock:
            if self._closed or unit.state in FINAL_STATES:
                closed = self._closed
            else:
                closed = None
                self._queue.append((unit, pilot))
                self._held_at = -math.inf   # the work to come changed
        if closed:
            unit._set_state(State.CANCELED)
        self._schedule()

    def cancel_unit(self, unit: ComputeUnit) -> None:
        with self._lock:
            before = len(self._queue)
            self._queue = [(u, b) for u, b in self._queue if u is not unit]
            run = self._running.get(unit.id)
            procs: list[subprocess.Popen] = []
            if run is not None and before == len(self._queue):
                run.canceled = True
                procs = list(run.procs)
        for proc in procs:
            execution.kill(proc)
        unit._set_state(State.CANCELED)  # final at once; cores come back when the process ends

    def _schedule(self) -> None:
        """Start every queued unit that fits a pilot now (see the module doc for the rules)."""
        launches: list[_Run] = []
        held = self._held()  # outside the lock: it asks the workload managers
        with self._lock:
            executor = self._executor
            if self._closed or executor is None or not self._queue:
                return
            if tightest_free(self, 1) is None:  # every pilot full: no need to look at each
                return
            pilots = [p for p in self._pilots.values() if p.free_cores > 0]
            free = {p.id: p.free_cores for p in pilots}
            valued = self.long_pilots()
            if not free:
                return
            total_free = sum(free.values())
            now = time.time()
            ends = self._ends(now)
            budget = functools.cache(lambda: self._long_budget(now, held))

            def place(among: list[Pilot], unit: ComputeUnit) -> Pilot | None:
                runtime = unit.description.runtime
                slot = choose([Slot(p, p.size, free.get(p.id, 0), ends.get(p.id))
                               for p in among], unit.description.cores,
                              now + float(runtime) if runtime else None, now=now,
                              horizon=self.long_unit, budget=budget)
                if slot is None:
                    return None
                ends[slot.key.id] = max(ends.get(slot.key.id, now),
                                        now + float(runtime) if runtime else math.inf)
                return slot.key

            keep: list[tuple[ComputeUnit, Pilot | None]] = []
            smallest_unplaced = None
            for i, (unit, bound) in enumerate(self._queue):
                if total_free <= 0:
                    keep.extend(self._queue[i:])  # nothing more can start now
                    break
                cores = unit.description.cores
                target = None
                if bound is not None:
                    if free.get(bound.id, 0) >= cores:
                        target = bound
                elif self.is_long(unit.description) and any(p.size >= cores for p in valued):
                    target = place(valued, unit)
                elif smallest_unplaced is None or cores < smallest_unplaced:
                    if any(free[p.id] >= cores for p in pilots):
                        target = place(pilots, unit)
                    else:
                        smallest_unplaced = cores
                if target is None:
                    keep.append((unit, bound))
                    continue
                free[target.id] -= cores
                total_free -= cores
                target._reserve(cores)
                run = _Run(unit, target, cores)
                self._running[unit.id] = run
                launches.append(run)
            self._queue = keep
        for run in launches:
            try:
                executor.submit(self._run, run)
            except RuntimeError:  # shut down meanwhile: close() cancels the unit
                run.pilot._release(run.cores)

    def _held(self) -> list[tuple[int, float]]:
        """(cores, runtime hint) of the units no framework has yet (``work_to_come``),
        looked at again on a submission, else at most once a second (a look costs a pass
        over the session's queues)."""
        now = time.monotonic()
        if self.work_to_come is None or not self._queue:
            return []
        if now - self._held_at >= 1.0:
            self._held_seen = [(d.cores, float(d.runtime)) for d in self.work_to_come()
                               if d.runtime]
            self._held_at = now
        return self._held_seen

    def _ends(self, now: float) -> dict[str, float]:
        """When each pilot's running units are expected to end, the latest (inf: one has
        no runtime hint); called with the lock held."""
        ends: dict[str, float] = {}
        for run in self._running.values():
            runtime = run.unit.description.runtime
            end = (run.unit.start or now) + float(runtime) if runtime else math.inf
            ends[run.pilot.id] = max(ends.get(run.pilot.id, end), end)
        return ends

    def _long_budget(self, now: float, held: list[tuple[int, float]]) -> Budget:
        """troy.place's budget from the units running, queued here and ``held``
        elsewhere (cores, seconds left); called with the lock held."""
        work = list(held)
        for run in self._running.values():
            runtime = run.unit.description.runtime
            if runtime:
                work.append((run.cores, (run.unit.start or now) + float(runtime) - now))
        work += [(u.description.cores, float(u.description.runtime))
                 for u, _ in self._queue if u.description.runtime]
        cores = sum(p.size for p in self._pilots.values()
                    if p.state is State.RUNNING and not p.draining)
        return long_budget(sum(c * r for c, r in work if r > self.long_unit),
                           sum(c * r for c, r in work), cores,
                           max((r for _, r in work), default=0.0))

    def _run(self, run: _Run) -> None:
        unit = run.unit
        if not (run.canceled or run.requeued):
            unit._set_state(State.RUNNING, pilot=run.pilot.id)

        def on_start(proc: subprocess.Popen) -> None:
            with self._lock:   # the process running now (see the Dask agent's run_tracked)
                run.procs[:] = [proc]
                doomed = run.canceled or run.requeued
            if doomed:
                execution.kill(proc)

        if run.canceled or run.requeued:
            result = UnitResult(error="canceled before start")
        else:
            try:
                result = execution.execute(unit.description, sandbox=self.sandbox,
                                           on_start=on_start,
                                           canceled=lambda: run.canceled or run.requeued)
            except Exception as err:  # execute reports the unit's failures; this is ours
                log.exception("running %s failed", unit.id)
                result = UnitResult(error=f"{type(err).__name__}: {err}")
        self._finish(run, result)
        self._schedule()

    def _finish(self, run: _Run, result: UnitResult) -> None:
        unit = run.unit
        run.pilot._release(run.cores)
        with self._lock:
            current = self._running.get(unit.id) is run
            if current:
                del self._running[unit.id]
            requeue = current and run.requeued and not run.canceled and not result.ok \
                and not self._closed
            if requeue:
                unit.attempts += 1
        self._unit_left(unit.id)
        if result.ok and not run.canceled:
            self._stats.completed(unit)
        if requeue:
            self._stats.add(requeued=1)
        if not current:
            return
        if run.canceled:
            unit._set_state(State.CANCELED, result=result)
        elif requeue:
            log.info("requeuing %s (its pilot %s went away)", unit.id, run.pilot.id)
            unit._requeue()
            with self._lock:
                self._queue.insert(0, (unit, None))
        else:
            unit._set_state(State.DONE if result.ok else State.FAILED, result=result)
