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
    unit = troy.ComputeUnit(troy.ComputeUnitDescription(executable="/bin/true"))
    return {"workload": w, "task": task, "overlay": troy.Overlay([{"size": 1}]),
            "unit": unit}


@pytest.mark.parametrize("kind", ["workload", "task", "overlay", "unit"])
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


@pytest.mark.parametrize("kind", ["workload", "task", "overlay", "unit"])
def test_removed_callback_is_not_called(kind):
    obj = _observables()[kind]
    seen: list[State] = []
    cb = lambda o, st: seen.append(st)  # noqa: E731
    obj.add_callback(cb)
    obj.remove_callback(cb)
    obj._set_state(State.TRANSLATED)
    assert seen == []


def test_a_unit_s_waiters_wake_at_its_final_state_and_its_callbacks_see_every_change():
    """A unit has a lock and an Event made for its first waiter (not a Condition each):
    waiters in several threads wake at the final state and not before, a timeout returns
    the state as it is, and callbacks added, removed and added first see what they should."""
    import threading
    import time

    from troy import ComputeUnitDescription
    from troy.unit import ComputeUnit
    unit = ComputeUnit(ComputeUnitDescription(executable="/bin/true"))
    assert unit.wait(0.05) is State.DESCRIBED
    seen: list[tuple[str, State]] = []
    gone = lambda u, st: seen.append(("gone", st))  # noqa: E731
    unit.add_callback(lambda u, st: seen.append(("last", st)))
    unit.add_callback(gone)
    unit.add_callback(lambda u, st: seen.append(("first", st)), first=True)
    unit.remove_callback(gone)
    woke: list[State] = []
    waiters = [threading.Thread(target=lambda: woke.append(unit.wait(30)), daemon=True)
               for _ in range(3)]
    for t in waiters:
        t.start()
    unit._set_state(State.RUNNING)
    time.sleep(0.2)
    assert woke == []   # RUNNING is not final
    unit._set_state(State.DONE)
    deadline = time.monotonic() + 5   # woken, not timed out (they wait up to 30 s)
    for t in waiters:
        t.join(max(0.0, deadline - time.monotonic()))
    assert woke == [State.DONE] * 3
    assert unit.wait() is State.DONE and unit.wait(0) is State.DONE
    assert seen == [("first", State.RUNNING), ("last", State.RUNNING),
                    ("first", State.DONE), ("last", State.DONE)]
    assert not unit._set_state(State.FAILED) and seen[-1] == ("last", State.DONE)
