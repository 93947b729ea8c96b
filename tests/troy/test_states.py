"""The seed-001 state derivation tables, row by row."""
from __future__ import annotations

import pytest

from troy.states import State, derive_task_state, derive_workload_state

S = State


@pytest.mark.parametrize("units, expected", [
    ([S.DONE, S.FAILED, S.RUNNING], S.FAILED),
    ([S.DONE, S.CANCELED, S.RUNNING], S.CANCELED),
    ([S.FAILED, S.CANCELED], S.FAILED),
    ([S.DONE, S.DISPATCHED, S.RUNNING], S.DISPATCHED),
    ([S.DONE, S.PENDING, S.RUNNING], S.DISPATCHED),
    ([S.DONE, S.RUNNING], S.RUNNING),
    ([S.DONE, S.DONE], S.DONE),
    ([S.DONE, S.TRANSLATED], S.UNKNOWN),
    ([], S.UNKNOWN),
])
def test_task_state_derivation(units, expected):
    assert derive_task_state(units) is expected


@pytest.mark.parametrize("tasks, expected", [
    ([S.DONE, S.FAILED, S.CANCELED], S.FAILED),
    ([S.DONE, S.CANCELED, S.DISPATCHED], S.CANCELED),
    ([S.DONE, S.DISPATCHED], S.DISPATCHED),
    ([S.DONE, S.DONE], S.DONE),
    # broke: a workload whose tasks ran read UNKNOWN (seed 001 has no RUNNING line)
    ([S.DONE, S.RUNNING], S.RUNNING),
    ([S.RUNNING, S.RUNNING], S.RUNNING),
    ([S.DISPATCHED, S.RUNNING], S.RUNNING),  # a task runs: RUNNING, though others wait
    ([S.DISPATCHED, S.DONE], S.DISPATCHED),
    ([S.FAILED, S.RUNNING], S.FAILED),
    ([S.DONE, S.UNKNOWN], S.UNKNOWN),
])
def test_workload_state_derivation(tasks, expected):
    assert derive_workload_state(tasks) is expected


def test_scheduled_is_bound():
    assert S.SCHEDULED is S.BOUND
    assert S("BOUND") is S.SCHEDULED
