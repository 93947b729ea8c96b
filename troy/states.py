"""Troy states, and the seed's rules for deriving a task's and a workload's state.

Every backend state (Dask task states, process exit codes) is translated into ``State`` once,
at the framework edge. ``BOUND`` and ``SCHEDULED`` are one state under two names: the seeds
call the binding step ``bind_workload`` (BOUND) and list the resulting workload state as
SCHEDULED.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any


class State(str, Enum):
    DESCRIBED = "DESCRIBED"
    PLANNED = "PLANNED"
    TRANSLATED = "TRANSLATED"
    BOUND = "BOUND"
    SCHEDULED = "BOUND"  # alias: State.SCHEDULED is State.BOUND
    DISPATCHED = "DISPATCHED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELED = "CANCELED"
    UNKNOWN = "UNKNOWN"
    # overlay states
    PROVISIONED = "PROVISIONED"
    COMPLETED = "COMPLETED"

    def __str__(self) -> str:
        return self.value

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES = frozenset({State.DONE, State.FAILED, State.CANCELED})

# Before dispatch a task's state moves atomically with the workload manager's steps.
PRE_DISPATCH = (State.DESCRIBED, State.PLANNED, State.TRANSLATED, State.BOUND)


# Seed 001's derivation tables, in the seed's order: the first state any member is in wins;
# else DONE if all are DONE; else UNKNOWN. The task table lists ``any unit DISPATCHED`` twice
# (the second, mapping to RUNNING, can never fire): kept as the seed has it. The workload
# table of the seed has no RUNNING line, so a workload whose tasks run read UNKNOWN; we add
# one, before DISPATCHED (a deviation from the seed, documented in docs/troy.md): a workload
# with a task RUNNING (and none FAILED or CANCELED) is RUNNING, whatever still waits.
# Everything else is the seed's.
TASK_TABLE = (State.FAILED, State.CANCELED, State.DISPATCHED, State.RUNNING)
WORKLOAD_TABLE = (State.FAILED, State.CANCELED, State.RUNNING, State.DISPATCHED)


def _derive(states: list[State], table: tuple[State, ...]) -> State:
    if not states:
        return State.UNKNOWN
    for state in table:
        if state in states:
            return state
    return State.DONE if all(s is State.DONE for s in states) else State.UNKNOWN


def derive_task_state(unit_states: Iterable[State]) -> State:
    """A dispatched task's state from its units' states (seed 001, ``TASK_TABLE``). A unit
    the backend holds but has not started (PENDING) is still dispatched, so PENDING counts
    as DISPATCHED here."""
    return _derive([State.DISPATCHED if s is State.PENDING else s for s in unit_states],
                   TASK_TABLE)


def derive_workload_state(task_states: Iterable[State]) -> State:
    """A dispatched workload's state from its tasks' states (seed 001's table, ``WORKLOAD_TABLE``,
    plus a RUNNING line: any task RUNNING and none FAILED or CANCELED)."""
    return _derive(list(task_states), WORKLOAD_TABLE)


class Lockable:
    """``lock`` / ``locked`` / ``unlock`` of the seeds' workloads and overlays: a locked one
    refuses changes to its composition. Expects ``_lock`` and ``_locked`` of the class."""

    _lock: Any
    _locked: bool

    def lock(self) -> None:
        with self._lock:
            self._locked = True

    def unlock(self, *args: Any) -> None:
        with self._lock:
            self._locked = False

    def locked(self) -> bool:
        return self._locked


class Observable:
    """State with pushed change callbacks, for tasks, workloads and overlays: ``state`` /
    ``get_state()``, ``add_callback(cb)`` / ``remove_callback(cb)``; ``cb(obj, state)`` runs
    on every change, in the thread that caused it, outside the object's lock. A failing
    callback is logged and never breaks the caller. Expects ``_state``, ``_lock`` and
    ``_callbacks`` of the class (a tuple, copied on write: a state change reads it as it
    is, and the many objects that never get a callback share the empty one); the class
    decides its transitions and calls ``_run_callbacks`` with it, read under its lock."""

    _state: State
    _lock: Any
    _callbacks: tuple[Callable[[Any, State], Any], ...]

    @property
    def state(self) -> State:
        return self._state

    def get_state(self) -> State:
        return self._state

    def add_callback(self, cb: Callable[[Any, State], Any]) -> None:
        """Call ``cb(obj, state)`` on every state change."""
        with self._lock:
            self._callbacks = (*self._callbacks, cb)

    def remove_callback(self, cb: Callable[[Any, State], Any]) -> None:
        with self._lock:
            if cb in self._callbacks:
                kept = list(self._callbacks)
                kept.remove(cb)
                self._callbacks = tuple(kept)

    def _run_callbacks(self, callbacks: Iterable[Callable[[Any, State], Any]],
                       state: State) -> None:
        for cb in callbacks:
            try:
                cb(self, state)
            except Exception:
                logging.getLogger(type(self).__module__).exception(
                    "%s callback %r on %s failed", type(self).__name__.lower(), cb,
                    getattr(self, "id", self))
