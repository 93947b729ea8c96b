"""Bundling short tasks into units: the policy, and bundles running for real."""
from __future__ import annotations

import pytest

import troy
from troy import Relation, State, Workload, WorkloadManager
from troy.errors import BadParameter
from troy.workload.bundling import plan_bundles


def _tasks(w: Workload, n: int, **kw) -> list[str]:
    return w.add_task([{"executable": "/bin/true", **kw} for _ in range(n)])


def test_auto_bundles_only_short_one_core_tasks_with_the_same_heads():
    w = Workload()
    short = _tasks(w, 40, runtime=0.01)
    long = _tasks(w, 3, runtime=60)
    nohint = _tasks(w, 3)
    wide = _tasks(w, 2, runtime=0.01, cores=2)
    after = _tasks(w, 8, runtime=0.01)
    w.add_relation([Relation(short[0], t) for t in after])
    groups = plan_bundles(list(w.tasks.values()), w.heads, "auto", 1.0, cores=2)
    by_task = {t.id: g for g in groups for t in g}
    for tid in long + nohint + wide:
        assert len(by_task[tid]) == 1
    # 40 short tasks without heads: bundled (5 per bundle keeps 4 bundles per core)
    assert all(len(by_task[t]) > 1 for t in short)
    # only 8 behind short[0]: bundling them would leave cores idle
    assert all(len(by_task[t]) == 1 for t in after)
    groups = plan_bundles(list(w.tasks.values()), w.heads, 4, cores=2)
    by_task = {t.id: g for g in groups for t in g}
    assert all(len(by_task[t]) == 4 for t in after)
    for g in groups:
        heads = {frozenset(w.heads(t.id)) for t in g}
        assert len(heads) == 1  # members share their heads: no relation inside a bundle
    assert sorted(t.id for g in groups for t in g) == sorted(w.tasks)


def test_bundle_sizes_and_switches():
    w = Workload()
    _tasks(w, 100, runtime=0.0)
    tasks = list(w.tasks.values())
    auto = plan_bundles(tasks, w.heads, "auto", 1.0, cores=2)
    assert len(auto) == 8 and {len(g) for g in auto} <= {12, 13}  # >= 4 bundles per core
    assert len(plan_bundles(tasks, w.heads, 10, cores=2)) == 10
    assert len(plan_bundles(tasks, w.heads, False, cores=2)) == 100
    with pytest.raises(BadParameter, match="bundle"):
        plan_bundles(tasks, w.heads, "always")


def test_bundled_tasks_run_and_fail_individually(troy_session, local_fw, tmp_path):
    w = Workload()
    ok = w.add_task([{"executable": "/bin/sh", "runtime": 0.01,
                      "arguments": ["-c", f"touch {tmp_path}/ok.{i}"]} for i in range(15)])
    bad = w.add_task({"executable": "/bin/sh", "arguments": ["-c", "exit 2"], "runtime": 0})
    child = w.add_task({"executable": "/bin/true"})
    w.add_relation(Relation(bad, child))
    wm = WorkloadManager(troy_session, bundle=4)
    assert troy.execute_workload(troy_session, w, manager=wm) is State.FAILED
    units = wm.units(w)
    assert any(len(u.task_ids) > 1 and bad in u.task_ids for u in units)
    assert len(list(tmp_path.glob("ok.*"))) == 15
    assert all(w.tasks[t].state is State.DONE for t in ok)  # only the failed member fails
    assert w.tasks[bad].state is State.FAILED and w.tasks[child].state is State.CANCELED


def test_bundling_can_be_turned_off(troy_session, local_fw):
    w = Workload()
    _tasks(w, 12, runtime=0)
    wm = WorkloadManager(troy_session, bundle=False)
    assert troy.execute_workload(troy_session, w, manager=wm) is State.DONE
    assert len(wm.units(w)) == 12
    with troy.Session(store_path=troy_session.store_path + ".2",
                      config={"bundle": False}) as s:
        assert WorkloadManager(s).bundle is False
