"""Callbacks on tasks, workloads and overlays: every change reaches them, and a callback that
raises is logged and never breaks the state change or the other callbacks."""
from __future__ import annotations

import logging

import pytest

import troy
from troy import State


def _observables():
    w = troy.Workload()
    task = w.tasks[w.add_task({"executable": "/bin/true"})]
    return {"workload": w, "task": task, "overlay": troy.Overlay([{"size": 1}])}


@pytest.mark.parametrize("kind", ["workload", "task", "overlay"])
def test_a_raising_callback_is_logged_and_the_others_still_run(kind, caplog):
    obj = _observables()[kind]
    seen: list[State] = []
    obj.add_callback(lambda o, st: 1 / 0)
    obj.add_callback(lambda o, st: seen.append(st))
    with caplog.at_level(logging.ERROR):
        obj._set_state(State.TRANSLATED)
    assert obj.state is State.TRANSLATED and obj.get_state() is State.TRANSLATED
    assert seen == [State.TRANSLATED]
    assert any("callback" in r.getMessage() and "failed" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("kind", ["workload", "task", "overlay"])
def test_removed_callback_is_not_called(kind):
    obj = _observables()[kind]
    seen: list[State] = []
    cb = lambda o, st: seen.append(st)  # noqa: E731
    obj.add_callback(cb)
    obj.remove_callback(cb)
    obj._set_state(State.TRANSLATED)
    assert seen == []
