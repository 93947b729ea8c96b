"""Task: one element of work of a workload (seed 001).

Before dispatch a task's state moves atomically with the workload manager's steps
(DESCRIBED → TRANSLATED → BOUND → DISPATCHED). After dispatch it is derived from its units'
states by the seed's table (``troy.states.derive_task_state``), recomputed whenever one of
its units pushes a change. Two refinements, both in the seed's spirit:

- a unit the workload manager still holds back (its task waits for a relation) counts as
  DISPATCHED: the workload has accepted it;
- a unit that bundles several tasks reports, to each task, that task's own outcome: a
  bundle where one member failed makes only that member's task FAILED.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from troy.descriptions import TaskDescription
from troy.states import FINAL_STATES, PRE_DISPATCH, Observable, State, derive_task_state
from troy.unit import ComputeUnit

if TYPE_CHECKING:
    from troy.workload.workload import Workload


TaskCallback = Callable[["Task", State], Any]
# what one unit's view makes its task (``derive_task_state`` of a single state)
_KEPT = frozenset({State.FAILED, State.CANCELED, State.DISPATCHED, State.RUNNING, State.DONE})


class Task(Observable):
    """A task: ``id``, ``description``, ``state``, ``units`` (once translated)."""

    def __init__(self, uid: str, description: TaskDescription,
                 workload: Workload | None = None) -> None:
        self.id = uid
        self.description = description
        self.units: list[ComputeUnit] = []
        self._workload = workload
        self._state = State.DESCRIBED
        self._dispatched = False
        self._lock = threading.RLock()
        self._callbacks: tuple[TaskCallback, ...] = ()

    def __repr__(self) -> str:
        return f"<Task {self.id} {self._state.value} units={len(self.units)}>"

    @property
    def workload(self) -> Workload | None:
        return self._workload

    def cancel(self) -> None:
        """Cancel the task's units (a unit bundling several tasks is canceled as a whole).

        A task not yet dispatched becomes CANCELED at once and is skipped at dispatch."""
        with self._lock:
            units = list(self.units)
            dispatched = self._dispatched
        if not dispatched:
            self._set_state(State.CANCELED)
        for u in units:
            if u.state not in FINAL_STATES:
                u.cancel()

    # -- for the managers ---------------------------------------------------------------
    # A state is derived and set under the task's lock (so the last event always wins);
    # callbacks run outside it, so a callback may cancel other tasks without deadlocks.
    def _set_state(self, state: State) -> None:
        with self._lock:
            change = self._transition(state)
        self._notify(change)

    def _transition(self, state: State) -> tuple[State, State] | None:
        old = self._state
        if old is state or old in FINAL_STATES:
            return None
        self._state = state
        return old, state

    def _notify(self, change: tuple[State, State] | None) -> None:
        if change is None:
            return
        old, new = change
        self._run_callbacks(self._callbacks, new)   # (a tuple, replaced whole: no lock)
        # last, so that whoever waits on the workload sees the task's callbacks done
        if self._workload is not None:
            self._workload._task_changed(self, old, new)

    def _attach(self, unit: ComputeUnit, *, watch: bool = True) -> None:
        """``unit`` serves this task; ``watch``: its changes call :meth:`_on_unit` (else the
        caller watches it for all its tasks at once: :class:`UnitTasks`)."""
        with self._lock:
            self.units.append(unit)
        if watch:
            unit.add_callback(self._on_unit)

    def _on_unit(self, unit: ComputeUnit, state: State) -> None:
        self._notify(self._unit_changed())

    def _unit_changed(self) -> tuple[State, State] | None:
        """The change one of its units' new states makes (the caller notifies it)."""
        with self._lock:
            return self._transition(self._derive()) if self._dispatched else None

    def _derive(self) -> State:
        if len(self.units) == 1:   # the usual case, a unit's every change: no lists
            return _task_state(self._unit_view(self.units[0]))
        return derive_task_state(self._unit_view(u) for u in self.units)

    def _unit_view(self, unit: ComputeUnit) -> State:
        """The state of ``unit`` as far as this task is concerned (see the module doc)."""
        members = _member_results(unit)
        if members:
            i = unit.member_index(self.id)
            if i is not None and i < len(members):
                return State.DONE if members[i].ok else State.FAILED
        return _unit_state(unit.state)


def _unit_state(state: State) -> State:
    """A unit's state as its tasks see it (a unit not dispatched yet: DISPATCHED, the
    workload has accepted it), but for a bundle member's own outcome."""
    return State.DISPATCHED if state in PRE_DISPATCH else state


def _task_state(view: State) -> State:
    """The state a task of one unit has, from its view of that unit
    (``derive_task_state`` of a single state)."""
    if view in _KEPT:
        return view
    return State.DISPATCHED if view is State.PENDING else State.UNKNOWN


def _member_results(unit: ComputeUnit) -> list[Any] | None:
    """A final bundle's members' results (None: not a final bundle with results)."""
    result = unit.result
    if unit.state in (State.DONE, State.FAILED) and unit.description.bundle \
            and result is not None:
        return result.members
    return None


def notify_tasks(changes: list[tuple[Task, tuple[State, State]]]) -> None:
    """Many tasks' changes: each task's callbacks, in order, then each workload's counts
    once for all of them (as :meth:`Task._notify` does for one)."""
    per_workload: dict[int, tuple[Workload, list[tuple[Task, State, State]]]] = {}
    last, batch = None, None   # (a batch is one workload's tasks, but for rare cases)
    for task, (old, new) in changes:
        if task._callbacks:   # (most tasks have none: the manager watches only heads)
            task._run_callbacks(task._callbacks, new)
        workload = task._workload
        if workload is None:
            continue
        if workload is not last:
            entry = per_workload.get(id(workload))
            if entry is None:
                entry = per_workload[id(workload)] = (workload, [])
            last, batch = workload, entry[1]
        batch.append((task, old, new))   # type: ignore[union-attr]
    for workload, done in per_workload.values():
        workload._tasks_changed(done)


def mark_dispatched(tasks: list[Task]) -> None:
    """The workload manager dispatched ``tasks``: each becomes DISPATCHED, then what its
    units say (a unit that ended already); their workloads told once a step."""
    firsts, seconds = [], []
    for task in tasks:
        with task._lock:
            if task._state in FINAL_STATES:
                continue
            task._dispatched = True
            first = task._transition(State.DISPATCHED)
            second = task._transition(task._derive())
        if first is not None:
            firsts.append((task, first))
        if second is not None:
            seconds.append((task, second))
    notify_tasks(firsts)
    notify_tasks(seconds)


def set_states(tasks: list[Task], state: State) -> None:
    """:meth:`Task._set_state` of many tasks, their workloads told once."""
    changes = []
    for task in tasks:
        with task._lock:
            change = task._transition(state)
        if change is not None:
            changes.append((task, change))
    notify_tasks(changes)


class UnitTasks:
    """The one callback of a unit that serves several tasks (a bundle): at each of its
    changes, every task derives its state, and the tasks that changed are told together
    (:func:`notify_tasks`): a bundle of 250 tasks costs one workload update a change, not
    250."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = list(tasks)

    def __repr__(self) -> str:
        return f"<UnitTasks of {len(self.tasks)} tasks>"

    def __call__(self, unit: ComputeUnit, state: State) -> None:
        if state in PRE_DISPATCH:
            return   # every task sees such a unit as DISPATCHED (Task._unit_view): no change
        # each task's state from the unit (Task._derive, for all of them at once): a final
        # bundle's member outcome, else the unit's state; the tasks are its members in order
        members = _member_results(unit) or ()
        same = _task_state(_unit_state(unit.state))
        changes = []
        for i, task in enumerate(self.tasks):
            view = same if i >= len(members) else \
                State.DONE if members[i].ok else State.FAILED
            with task._lock:
                if not task._dispatched:
                    continue
                # (a task of this unit alone, as always in a bundle: its view is its state)
                change = task._transition(view) if len(task.units) == 1 and \
                    task.units[0] is unit else task._transition(task._derive())
            if change is not None:
                changes.append((task, change))
        if changes:
            notify_tasks(changes)


def attach(unit: ComputeUnit, tasks: list[Task]) -> None:
    """``unit`` serves ``tasks``: one callback for them all when they are several."""
    if len(tasks) == 1:
        tasks[0]._attach(unit)
        return
    for task in tasks:
        task._attach(unit, watch=False)
    unit.add_callback(UnitTasks(tasks))
