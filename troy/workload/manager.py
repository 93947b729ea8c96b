"""WorkloadManager: translate, bind and dispatch workloads (seed 001).

- ``translate_workload`` turns tasks into compute units (one per task, or bundles of short
  tasks, see ``troy.workload.bundling``); expands cardinality first if the planner has not.
- ``bind_workload`` binds units to the overlay's pilots (``bind_mode="early"``) or leaves
  the choice to the scheduler and frameworks at dispatch (``"late"``, the default). Late-bound
  units of a workload dispatched on an overlay stay on the frameworks that hold the
  overlay's pilots (seed 001 schedules them onto the overlay), unless the session config
  says ``late_binding="session"`` (any framework of the session).
- ``dispatch_workload`` submits every unit whose tasks' heads are DONE and holds back the
  others; each time a task ends, the units of its tails are released, or canceled if a head
  FAILED or was CANCELED. Units go through a UnitService of the session (scheduler from the
  session config, default ``backfill``).
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from troy.collector import collector_paused
from troy.descriptions import ComputeUnitDescription, TaskDescription
from troy.errors import BadParameter, IncorrectState, NoSuccess
from troy.frameworks.base import Pilot
from troy.schedulers import BaseScheduler
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit, UnitResult
from troy.unit_service import UnitService
from troy.workload.bundling import check_mode, plan_bundles
from troy.workload.recovery import workload_spec
from troy.workload.task import Task, attach, mark_dispatched, set_states
from troy.workload.workload import Workload

if TYPE_CHECKING:
    from troy.overlay.overlay import Overlay
    from troy.session import Session

log = logging.getLogger(__name__)
T = TypeVar("T")

_UNSET: Any = object()


@dataclass
class _Plan:
    """What the manager knows of one workload: its units, their heads and bindings.
    ``workload``: None once it is final (the manager lets it go; its units stay)."""

    workload: Workload | None
    units: list[ComputeUnit] = field(default_factory=list)
    heads: dict[str, set[str]] = field(default_factory=dict)
    bindings: dict[str, Pilot] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    overlay: Overlay | None = None  # late-bound units go to its pilots' frameworks


def _collector_paused(step: Callable[..., T]) -> Callable[..., T]:
    """``step`` run with the collector paused (:func:`troy.collector.collector_paused`)."""
    @functools.wraps(step)
    def paused(*args: Any, **kwargs: Any) -> T:
        with collector_paused():
            return step(*args, **kwargs)
    return paused


def unit_description(tasks: list[Task]) -> ComputeUnitDescription:
    """The unit for one task, or the bundle unit for several."""
    def one(t: Task) -> ComputeUnitDescription:
        return ComputeUnitDescription.of_task(t.description, t.id)

    if len(tasks) == 1:
        return one(tasks[0])
    hints = [t.description.runtime or 0.0 for t in tasks]
    return ComputeUnitDescription(name=f"{tasks[0].id}+{len(tasks) - 1}", cores=1,
                                  runtime=sum(hints) or None,
                                  bundle=[one(t) for t in tasks])


def overlay_frameworks(overlay: Overlay | None) -> set[str] | None:
    """Names of the frameworks holding ``overlay``'s pilots (None: no overlay, any
    framework). A following overlay is its framework's, pilots or not."""
    if overlay is None:
        return None
    following = getattr(overlay, "framework", None)
    if following is not None:
        return {following.name}
    names = {op.framework for op in overlay.pilots.values() if op.framework}
    return names or None


class WorkloadManager:
    """Translates, binds and dispatches workloads of one session."""

    def __init__(self, session: Session, *, scheduler: str | type[BaseScheduler] |
                 BaseScheduler | None = None, bundle: Any = _UNSET,
                 bundle_threshold: float | None = None,
                 unit_service: UnitService | None = None) -> None:
        self.session = session
        self.scheduler = scheduler or session.config["scheduler"]
        self.bundle = check_mode(session.config["bundle"] if bundle is _UNSET else bundle)
        self.bundle_threshold = float(bundle_threshold if bundle_threshold is not None
                                      else session.config["bundle_threshold"])
        self._us = unit_service
        self._plans: dict[str, _Plan] = {}
        self._lock = threading.RLock()

    @property
    def unit_service(self) -> UnitService:
        with self._lock:
            if self._us is None:
                if isinstance(self.scheduler, str):
                    self._us = self.session.shared_unit_service(self.scheduler)
                else:
                    self._us = self.session.unit_service(scheduler=self.scheduler)
            return self._us

    def units(self, workload: Workload) -> list[ComputeUnit]:
        """The units ``workload`` was translated into."""
        return list(self._plan(workload).units)

    def _plan(self, workload: Workload) -> _Plan:
        try:
            return self._plans[workload.id]
        except KeyError:
            raise IncorrectState(f"workload {workload.id} was not translated by this "
                                 f"manager") from None

    # -- translate ----------------------------------------------------------------------
    @_collector_paused
    def translate_workload(self, workload: Workload, overlay: Overlay | None = None) -> None:
        """Tasks → compute units (bundling short tasks); moves to TRANSLATED."""
        if workload.state not in (State.DESCRIBED, State.PLANNED):
            raise IncorrectState(f"workload {workload.id} is {workload.state.value}; only a "
                                 f"DESCRIBED or PLANNED workload can be translated")
        if any(t.description.cardinality > 1 for t in workload.tasks.values()):
            from troy.planner import Planner
            Planner(self.session).expand_workload(workload)
        cores = self._cores(overlay)
        tasks = [t for t in workload.tasks.values() if t.state not in FINAL_STATES]
        plan = _Plan(workload)
        for group in plan_bundles(tasks, workload.heads, self.bundle, self.bundle_threshold,
                                  cores):
            unit = ComputeUnit(unit_description(group), task_ids=[t.id for t in group])
            unit._set_state(State.TRANSLATED)
            own = {t.id for t in group}
            plan.heads[unit.id] = set().union(*(workload.heads(t) for t in own)) - own
            plan.units.append(unit)
            attach(unit, group)
        with self._lock:
            self._plans[workload.id] = plan
        set_states(tasks, State.TRANSLATED)
        workload._set_state(State.TRANSLATED)
        log.info("translated %s: %d tasks into %d units", workload.id, len(tasks),
                 len(plan.units))

    def _cores(self, overlay: Overlay | None) -> int:
        if overlay is not None and overlay.pilots:
            return sum(p.description.size for p in overlay.pilots.values())
        return int(self.session.config.get("machine_cores") or os.cpu_count() or 1)

    # -- bind ---------------------------------------------------------------------------
    @_collector_paused
    def bind_workload(self, workload: Workload, overlay: Overlay | None = None,
                      bind_mode: str = "late") -> None:
        """Bind units to pilots (early) or leave it to dispatch (late); moves to BOUND."""
        if bind_mode not in ("late", "early"):
            raise BadParameter(f"bind_mode: expected 'late' or 'early', got {bind_mode!r}")
        if workload.state in (State.DESCRIBED, State.PLANNED):
            self.translate_workload(workload, overlay)
        if workload.state is not State.TRANSLATED:
            raise IncorrectState(f"workload {workload.id} is {workload.state.value}; only a "
                                 f"TRANSLATED workload can be bound")
        plan = self._plan(workload)
        if bind_mode == "early":
            plan.bindings = self._bind_early(plan, overlay)
        set_states(list(workload.tasks.values()), State.BOUND)
        for u in plan.units:
            u._set_state(State.BOUND)
        workload._set_state(State.BOUND)

    def _bind_early(self, plan: _Plan, overlay: Overlay | None) -> dict[str, Pilot]:
        pilots = [op.pilot for op in (overlay.pilots.values() if overlay else ())
                  if op.pilot is not None and op.pilot.state in (State.PENDING, State.RUNNING)]
        if not pilots:
            raise IncorrectState("early binding needs a provisioned overlay with live pilots")
        load: dict[str, int] = defaultdict(int)
        bindings = {}
        for u in plan.units:
            cores = u.description.cores
            fits = [p for p in pilots if p.size >= cores]
            if not fits:
                raise NoSuccess(f"unit {u.id} ({u.description.name}) needs {cores} cores; "
                                f"no pilot of the overlay is that wide")
            best = min(fits, key=lambda p: (load[p.id] + cores) / p.size)
            load[best.id] += cores
            bindings[u.id] = best
        return bindings

    # -- dispatch -----------------------------------------------------------------------
    @_collector_paused
    def dispatch_workload(self, workload: Workload, overlay: Overlay | None = None) -> None:
        """Submit the units whose heads are DONE, hold the rest; moves to DISPATCHED and
        from then on the workload state follows its tasks."""
        if workload.state in (State.DESCRIBED, State.PLANNED, State.TRANSLATED):
            self.bind_workload(workload, overlay)
        if workload.state is not State.BOUND:
            raise IncorrectState(f"workload {workload.id} is {workload.state.value}; only a "
                                 f"BOUND workload can be dispatched")
        plan = self._plan(workload)
        if self.session.config.get("late_binding", "overlay") == "overlay":
            plan.overlay = overlay
        store = self.session.store
        # the workload and all its units (held ones too) survive a crash from here on
        store.put_workload(workload.id, State.DISPATCHED, len(workload.tasks), self.session.id,
                           spec=workload_spec(workload))
        store.add_units(plan.units, session=self.session.id, workload=workload.id)
        self._start(plan)

    def held_units(self) -> list[ComputeUnit]:
        """Units of dispatched workloads held back until the tasks they depend on are done
        (not final, not submitted yet)."""
        with self._lock:
            plans = list(self._plans.values())
            return [u for p in plans if p.workload is not None
                    and p.workload.state not in FINAL_STATES
                    for u in p.units if u.id not in p.released and u.state not in FINAL_STATES]

    def _start(self, plan: _Plan) -> None:
        self.session._managers.add(self)
        workload, store = plan.workload, self.session.store
        assert workload is not None
        workload.add_callback(lambda w, s: store.update_workload(w.id, s, len(w.tasks)))
        workload.add_callback(functools.partial(self._let_go, plan))
        tasks = list(workload.tasks.values())
        for t in tasks:   # a task others depend on releases them as it ends (the relations
            if workload.tails(t.id):   # are fixed from translation on); the rest: nothing
                t.add_callback(self._on_task)   # to do, no callback to run
        # the units go first, then the tasks are marked: a unit that ended meanwhile is
        # read when its tasks are (their states derive from their units' as they are), and
        # the nodes start 5,000 tasks' marking sooner
        self._release(plan, plan.units)
        mark_dispatched(tasks)
        workload._mark_dispatched()

    def _let_go(self, plan: _Plan, workload: Workload, state: State) -> None:
        """A final workload changes no more: the manager keeps its units (``units()``)
        but not the workload, whose tasks the user may let go (a manager running workload
        after workload kept every one of them, 70,000 objects a 5,000-task workload)."""
        if state in FINAL_STATES:
            with self._lock:
                plan.workload = None

    def _on_task(self, task: Task, state: State) -> None:
        if state not in FINAL_STATES or task.workload is None:
            return
        plan = self._plans.get(task.workload.id)
        wl = plan.workload if plan is not None else None
        if wl is None:
            return
        units = {u.id: u for t in wl.tails(task.id) for u in wl.tasks[t].units}
        if units:
            self._release(plan, list(units.values()))

    def _release(self, plan: _Plan, units: list[ComputeUnit]) -> None:
        """Submit the units whose heads are all DONE; cancel those with a failed head."""
        workload = plan.workload
        if workload is None:   # final: nothing is left to release
            return
        tasks = workload.tasks
        ready, doomed = [], []
        with self._lock:
            for u in units:
                if u.id in plan.released:
                    continue
                if u.state in FINAL_STATES:
                    plan.released.add(u.id)
                    continue
                states = [tasks[h].state for h in plan.heads[u.id]]
                if any(s in (State.FAILED, State.CANCELED) for s in states):
                    doomed.append(u)
                elif all(s is State.DONE for s in states):
                    ready.append(u)
                else:
                    continue
                plan.released.add(u.id)
        for u in doomed:
            u._set_state(State.CANCELED, result=UnitResult(
                error="canceled: a task it depends on failed or was canceled"))
        if ready:
            self._submit(plan, workload.id, ready)

    def _submit(self, plan: _Plan, wid: str, units: list[ComputeUnit]) -> None:
        us = self.unit_service
        late = [u for u in units if u.id not in plan.bindings]
        by_pilot: dict[str, list[ComputeUnit]] = defaultdict(list)
        for u in units:
            if u.id in plan.bindings:
                by_pilot[plan.bindings[u.id].id].append(u)
        for group in by_pilot.values():
            pilot = plan.bindings[group[0].id]
            if pilot.state in FINAL_STATES:
                log.warning("pilot %s is %s: %d early-bound unit(s) go late-bound", pilot.id,
                            pilot.state.value, len(group))
                late.extend(group)
                continue
            try:
                us.submit_units(group, pilot=pilot, workload=wid, stored=True)
            except Exception as err:  # the pilot went away meanwhile: bind late instead
                log.warning("early-bound submission to %s failed (%s); binding late",
                            pilot.id, err)
                late.extend(u for u in group
                            if u._framework_obj is None and u.state not in FINAL_STATES)
        if late:
            us.submit_units(late, workload=wid, stored=True,
                            frameworks=overlay_frameworks(plan.overlay))

    # -- wait / cancel ------------------------------------------------------------------
    def wait_workload(self, workload: Workload, timeout: float | None = None) -> State:
        """Block until every task is final (or ``timeout``); return the workload state."""
        return workload.wait(timeout)

    def cancel_workload(self, workload: Workload) -> None:
        workload.cancel()
