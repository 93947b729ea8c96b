"""Troy states, and the seed's rules for deriving a task's and a workload's state.

Every backend state (Dask task states, process exit codes) is translated into ``State`` once,
at the framework edge. ``BOUND`` and ``SCHEDULED`` are one state under two names: the seeds
call the binding step ``bind_workload`` (BOUND) and list the resulting workload state as
SCHEDULED.
"""
from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


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


def derive_task_state(unit_states: Iterable[State]) -> State:
    """A dispatched task's state from its units' states (seed 001, in order).

    The seed's table lists ``any unit DISPATCHED`` twice (the second mapping to RUNNING can
    never fire); we keep its order. A unit the backend holds but has not started (PENDING) is
    still dispatched, so PENDING counts as DISPATCHED here.
    """
    states = [State.DISPATCHED if s is State.PENDING else s for s in unit_states]
    if not states:
        return State.UNKNOWN
    if State.FAILED in states:
        return State.FAILED
    if State.CANCELED in states:
        return State.CANCELED
    if State.DISPATCHED in states:
        return State.DISPATCHED
    if State.RUNNING in states:
        return State.RUNNING
    if all(s is State.DONE for s in states):
        return State.DONE
    return State.UNKNOWN


def derive_workload_state(task_states: Iterable[State]) -> State:
    """A dispatched workload's state from its tasks' states (seed 001, literally).

    Note the seed's rule has no RUNNING line: a workload whose tasks are a mix of RUNNING and
    DONE is UNKNOWN until every task is DONE (or one FAILED / CANCELED).
    """
    states = list(task_states)
    if not states:
        return State.UNKNOWN
    if State.FAILED in states:
        return State.FAILED
    if State.CANCELED in states:
        return State.CANCELED
    if State.DISPATCHED in states:
        return State.DISPATCHED
    if all(s is State.DONE for s in states):
        return State.DONE
    return State.UNKNOWN
