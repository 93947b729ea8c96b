"""Workload semantics of seed 001, through real workloads on the local framework."""
from __future__ import annotations

import pytest

import troy
from tests.helpers import wait_for
from troy import Relation, State, TaskDescription, Workload, WorkloadManager
from troy.errors import BadParameter, IncorrectState
from troy.states import derive_task_state, derive_workload_state


def sh(script: str, **kw) -> dict:
    return {"executable": "/bin/sh", "arguments": ["-c", script], **kw}


# -- composition ------------------------------------------------------------------------
def test_add_task_returns_ids_and_tasks_are_reachable():
    w = Workload()
    one = w.add_task(TaskDescription(executable="/bin/true"))
    many = w.add_task([{"executable": "/bin/true"}, {"executable": "/bin/date"}])
    assert isinstance(one, str) and len(many) == 2
    assert w.tasks[many[1]].description.executable == "/bin/date"
    assert w.tasks[one].state is State.DESCRIBED and w.state is State.DESCRIBED
    with pytest.raises(BadParameter, match="task: unknown field"):
        w.add_task({"exe": "/bin/true"})


def test_one_batch_of_changes_to_tasks_of_two_workloads_counts_each_in_its_own():
    """The managers tell workloads of many tasks' changes at once (a bundle's 250 tasks):
    a batch that mixes two workloads' tasks moves each workload's counts, not one's."""
    from troy.workload.task import set_states
    w1, w2 = Workload(), Workload()
    a = [w1.tasks[t] for t in w1.add_task([{"executable": "/bin/true"}] * 2)]
    b = [w2.tasks[t] for t in w2.add_task([{"executable": "/bin/true"}] * 3)]
    set_states([a[0], b[0], a[1], b[1]], State.DONE)
    assert w1.finished and not w2.finished
    set_states([b[2], a[0]], State.FAILED)   # a[0] is final already: no change
    assert w2.finished and a[0].state is State.DONE and b[2].state is State.FAILED


def test_add_relation_refuses_unknown_tasks_duplicates_and_cycles():
    w = Workload()
    a, b, c = w.add_task([{"executable": "/bin/true"}] * 3)
    w.add_relation(Relation(a, b))
    with pytest.raises(ValueError, match="no task 'nope'"):
        w.add_relation(Relation(a, "nope"))
    with pytest.raises(ValueError, match="already added"):
        w.add_relation(Relation(a, b))
    w.add_relation(Relation(b, c))
    with pytest.raises(ValueError, match="cycle"):
        w.add_relation(Relation(c, a))
    with pytest.raises(ValueError, match="cycle"):
        w.add_relation(Relation(a, a))
    with pytest.raises(ValueError, match="cycle"):  # a list is checked as a whole ...
        w.add_relation([Relation(a, c), Relation(c, a)])
    assert w.relations == [Relation(a, b), Relation(b, c)]  # ... and added all or nothing
    assert w.heads(c) == {b} and w.tails(a) == {b}


def test_a_locked_workload_refuses_changes():
    w = Workload()
    a = w.add_task({"executable": "/bin/true"})
    w.lock()
    assert w.locked()
    with pytest.raises(IncorrectState, match="locked"):
        w.add_task({"executable": "/bin/true"})
    with pytest.raises(IncorrectState, match="locked"):
        w.add_relation(Relation(a, a))
    w.unlock()
    assert not w.locked()
    w.add_task({"executable": "/bin/true"})


def test_no_tasks_after_translation(troy_session):
    w = Workload()
    w.add_task({"executable": "/bin/true"})
    WorkloadManager(troy_session).translate_workload(w)
    with pytest.raises(IncorrectState, match="TRANSLATED"):
        w.add_task({"executable": "/bin/true"})


# -- states -----------------------------------------------------------------------------
def test_states_move_atomically_then_follow_the_units(troy_session, local_fw):
    w = Workload()
    a = w.add_task(sh("sleep 0.1"))
    b = w.add_task({"executable": "/bin/true"})
    w.add_relation(Relation(a, b))
    seen: list[State] = []
    task_seen: list[State] = []
    w.add_callback(lambda wl, st: seen.append(st))
    w.tasks[b].add_callback(lambda t, st: task_seen.append(st))
    troy.Planner(troy_session).plan(w)
    wm = WorkloadManager(troy_session, bundle=False)
    wm.translate_workload(w)
    assert {t.state for t in w.tasks.values()} == {State.TRANSLATED}
    wm.bind_workload(w)
    assert w.state is State.BOUND is State.SCHEDULED
    wm.dispatch_workload(w)
    assert w.tasks[b].state is State.DISPATCHED  # held back by its relation
    assert wm.wait_workload(w, timeout=30) is State.DONE
    assert seen[:5] == [State.PLANNED, State.TRANSLATED, State.BOUND, State.DISPATCHED,
                        State.RUNNING] and seen[-1] is State.DONE
    assert State.UNKNOWN not in seen
    assert task_seen[:4] == [State.PLANNED, State.TRANSLATED, State.BOUND, State.DISPATCHED]
    assert task_seen[-2:] == [State.RUNNING, State.DONE]
    # the derived states agree with the seed's tables
    for t in w.tasks.values():
        assert t.state is derive_task_state(u.state for u in t.units)
    assert w.state is derive_workload_state(t.state for t in w.tasks.values())


def test_workload_reads_running_not_unknown_while_its_tasks_run(troy_session, local_fw,
                                                                 tmp_path):
    """Broke: seed 001's workload table has no RUNNING line, so a workload whose tasks ran
    read UNKNOWN. Two tasks run at once (a 4-core pilot) and wait for a go file."""
    go = tmp_path / "go"
    w = Workload()
    ids = w.add_task([sh(f"touch {tmp_path}/started.{i}; "
                         f"while [ ! -e {go} ]; do sleep 0.05; done") for i in range(2)])
    seen: list[State] = []
    w.add_callback(lambda wl, st: seen.append(st))
    troy.Planner(troy_session).plan(w)
    wm = WorkloadManager(troy_session, bundle=False)
    wm.dispatch_workload(w)
    try:
        wait_for(lambda: all((tmp_path / f"started.{i}").exists() for i in range(2)),
                 what="both tasks started")
        wait_for(lambda: all(w.tasks[t].state is State.RUNNING for t in ids),
                 what="both tasks RUNNING")
        assert w.state is State.RUNNING
    finally:
        go.touch()
    assert wm.wait_workload(w, timeout=60) is State.DONE
    assert State.RUNNING in seen and State.UNKNOWN not in seen


def test_workload_reads_running_while_a_task_runs_and_another_waits(troy_session, local_fw,
                                                                     tmp_path):
    """The issue asks RUNNING for a workload with running tasks: one task runs while the
    next waits for it (DISPATCHED, held back by the relation); the workload is RUNNING."""
    go = tmp_path / "go"
    w = Workload()
    first = w.add_task(sh(f"touch {tmp_path}/started; while [ ! -e {go} ]; do sleep 0.05; done"))
    second = w.add_task(sh("true"))
    w.add_relation(Relation(first, second))
    troy.Planner(troy_session).plan(w)
    wm = WorkloadManager(troy_session, bundle=False)
    wm.dispatch_workload(w)
    try:
        wait_for(lambda: w.tasks[first].state is State.RUNNING, what="the first task RUNNING")
        assert w.tasks[second].state is State.DISPATCHED
        assert w.state is State.RUNNING
    finally:
        go.touch()
    assert wm.wait_workload(w, timeout=60) is State.DONE


def test_relations_order_execution(troy_session, local_fw, tmp_path):
    log = tmp_path / "log"
    w = Workload()
    first = w.add_task(sh(f"sleep 0.1; echo first >> {log}"))
    mids = w.add_task([sh(f"echo mid >> {log}") for _ in range(3)])
    last = w.add_task(sh(f"echo last >> {log}"))
    w.add_relation([Relation(first, m) for m in mids] + [Relation(m, last) for m in mids])
    assert troy.execute_workload(troy_session, w) is State.DONE
    assert log.read_text().split() == ["first", "mid", "mid", "mid", "last"]


def test_a_failed_head_cancels_its_dependants(troy_session, local_fw, tmp_path):
    marker = tmp_path / "ran"
    w = Workload()
    bad = w.add_task({"executable": "/bin/sh", "arguments": ["-c", "exit 1"]})
    child = w.add_task(sh(f"touch {marker}"))
    grandchild = w.add_task(sh(f"touch {marker}"))
    other = w.add_task({"executable": "/bin/true"})
    w.add_relation([Relation(bad, child), Relation(child, grandchild)])
    assert troy.execute_workload(troy_session, w) is State.FAILED
    assert w.tasks[bad].state is State.FAILED
    assert w.tasks[child].state is State.CANCELED
    assert w.tasks[grandchild].state is State.CANCELED
    assert w.tasks[other].state is State.DONE
    assert not marker.exists()
    assert w.tasks[bad].units[0].result.exit_code == 1


def test_cancel_a_task(troy_session, local_fw):
    w = Workload()
    slow = w.add_task({"executable": "/bin/sleep", "arguments": ["30"]})
    after = w.add_task({"executable": "/bin/true"})
    fine = w.add_task({"executable": "/bin/true"})
    w.add_relation(Relation(slow, after))
    wm = WorkloadManager(troy_session, bundle=False)
    wm.dispatch_workload(w)
    wait_for(lambda: w.tasks[slow].state is State.RUNNING, 10, what="slow task running")
    w.tasks[slow].cancel()
    assert wm.wait_workload(w, timeout=30) is State.CANCELED
    assert [w.tasks[t].state for t in (slow, after, fine)] == \
        [State.CANCELED, State.CANCELED, State.DONE]


def test_cancel_a_workload(troy_session, local_fw):
    w = Workload()
    w.add_task([{"executable": "/bin/sleep", "arguments": ["30"]} for _ in range(6)])
    wm = WorkloadManager(troy_session, bundle=False)
    wm.dispatch_workload(w)
    wait_for(lambda: sum(t.state is State.RUNNING for t in w.tasks.values()) == 4, 10,
             what="four tasks running")
    w.cancel()
    assert w.wait(10) is State.CANCELED
    assert {t.state for t in w.tasks.values()} == {State.CANCELED}


def test_cancel_a_unit_cancels_its_task(troy_session, local_fw):
    w = Workload()
    t = w.add_task({"executable": "/bin/sleep", "arguments": ["30"]})
    wm = WorkloadManager(troy_session, bundle=False)
    wm.dispatch_workload(w)
    wait_for(lambda: w.tasks[t].state is State.RUNNING, 10, what="task running")
    w.tasks[t].units[0].cancel()
    assert w.wait(10) is State.CANCELED and w.tasks[t].state is State.CANCELED


def test_cancel_before_dispatch(troy_session, local_fw):
    w = Workload()
    a = w.add_task({"executable": "/bin/true"})
    b = w.add_task({"executable": "/bin/true"})
    w.tasks[a].cancel()
    assert w.tasks[a].state is State.CANCELED
    assert troy.execute_workload(troy_session, w) is State.CANCELED
    assert w.tasks[b].state is State.DONE and w.tasks[a].units == []


def test_early_binding_uses_the_overlay_pilots(troy_session, local_fw):
    overlay = troy.Overlay([{"size": 2, "framework": "local"}, {"size": 2}])
    w = Workload()
    w.add_task([{"executable": "/bin/true"} for _ in range(4)])
    state = troy.execute_workload(troy_session, w, overlay, bind_mode="early", bundle=False)
    assert state is State.DONE
    ids = {p.pilot.id for p in overlay.pilots.values()}
    units = [t.units[0] for t in w.tasks.values()]
    assert {u.pilot for u in units} == ids  # spread over both overlay pilots
    overlay.cancel()
    assert overlay.state is State.COMPLETED


def test_workload_is_recorded_in_the_store(troy_session, local_fw):
    w = Workload()
    w.add_task({"executable": "/bin/true"})
    troy.execute_workload(troy_session, w)
    troy_session.store.flush()
    rows = {r["id"]: r for r in troy_session.store.workloads()}
    assert rows[w.id]["state"] is State.DONE
    units = troy_session.store.units()
    assert [u.task_ids for u in units if u.workload == w.id] == [list(w.tasks)]


def test_cancel_from_a_callback_on_concurrent_failures_does_not_deadlock(troy_session,
                                                                         local_fw):
    """Fail fast: a task callback cancels the whole workload while other tasks fail too."""
    w = Workload()
    failing = w.add_task([{"executable": "/bin/sh", "arguments": ["-c", "exit 1"]}
                          for _ in range(6)])
    slow = w.add_task([{"executable": "/bin/sleep", "arguments": ["30"]} for _ in range(4)])

    def fail_fast(task, state):
        if state is State.FAILED:
            w.cancel()

    for t in failing:
        w.tasks[t].add_callback(fail_fast)
    wm = WorkloadManager(troy_session, bundle=False, scheduler="round_robin")
    wm.dispatch_workload(w)
    assert w.wait(20) is State.FAILED and w.finished
    assert {w.tasks[t].state for t in slow} == {State.CANCELED}


def test_the_collector_is_paused_until_the_units_are_out_and_runs_while_they_do(
        troy_session, monkeypatch):
    """Planning, translating and dispatching a workload run with Python's cyclic garbage
    collector paused (a full pass over a long session's objects there held the first unit
    back 30-90 ms); awaiting the overlay's pilots and the units does not; a caller that
    paused it keeps it paused. Seen from inside each step."""
    import gc
    from troy import planner as planner_module
    from troy.workload import WorkloadManager
    from troy.workload import manager as manager_module
    seen: dict[str, bool] = {}

    def spying(name, step):
        def spy(*args, **kwargs):
            seen[name] = gc.isenabled()
            return step(*args, **kwargs)
        return spy
    for owner, name in ((planner_module, "set_states"), (manager_module, "plan_bundles"),
                        (manager_module, "workload_spec"),
                        (troy.OverlayManager, "manage_overlay"),
                        (WorkloadManager, "wait_workload")):
        monkeypatch.setattr(owner, name, spying(name, getattr(owner, name)))
    from troy.descriptions import TaskDescription
    coerce = TaskDescription.coerce.__func__

    def coerce_spy(cls, *args, **kwargs):
        seen.setdefault("add_task", gc.isenabled())
        return coerce(cls, *args, **kwargs)
    monkeypatch.setattr(TaskDescription, "coerce", classmethod(coerce_spy))
    w = troy.Workload()
    w.add_task([{"executable": "/bin/true"}] * 3)   # (so is adding many tasks)
    assert seen.pop("add_task") is False and gc.isenabled()
    assert troy.execute_workload(troy_session, w) is State.DONE
    # (not while the overlay's pilots are awaited: on CloudLab, minutes)
    assert seen == {"set_states": False, "manage_overlay": True, "plan_bundles": False,
                    "workload_spec": False, "wait_workload": True}
    assert gc.isenabled()
    w = troy.Workload()
    w.add_task({"executable": "/bin/true"})
    gc.disable()
    try:
        assert troy.execute_workload(troy_session, w) is State.DONE
        assert not gc.isenabled() and not seen["wait_workload"]
    finally:
        gc.enable()
