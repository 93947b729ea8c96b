"""Planner: cardinality expansion with %(cardinal)s, relation rewiring, derived overlays."""
from __future__ import annotations

import pytest

import troy
from troy import Planner, Relation, State, Workload


def test_cardinality_expands_and_substitutes(tmp_path):
    w = Workload()
    t = w.add_task({"executable": "/bin/echo-%(cardinal)s", "cardinality": 3,
                    "arguments": ["in.%(cardinal)s", "plain"],
                    "environment": {"N": "%(cardinal)s"}, "stdout": "out.%(cardinal)s",
                    "inputs": ["data.%(cardinal)s > d"], "tag": "t%(cardinal)s"})
    Planner().plan(w)
    assert w.state is State.PLANNED
    ids = w.expansions[t]
    assert ids == [f"{t}.0", f"{t}.1", f"{t}.2"] and t not in w.tasks
    d = w.tasks[ids[2]].description
    assert (d.executable, d.arguments, d.environment, d.stdout, d.inputs, d.tag,
            d.cardinality) == ("/bin/echo-2", ["in.2", "plain"], {"N": "2"}, "out.2",
                               ["data.2 > d"], "t2", 1)


def test_relations_follow_expansion():
    w = Workload()
    a = w.add_task({"executable": "/bin/true", "cardinality": 2})
    b = w.add_task({"executable": "/bin/true", "cardinality": 2})
    c = w.add_task({"executable": "/bin/true"})
    w.add_relation([Relation(a, b), Relation(b, c)])
    Planner().expand_workload(w)
    assert set(w.relations) == {Relation(f"{a}.0", f"{b}.0"), Relation(f"{a}.1", f"{b}.1"),
                                Relation(f"{b}.0", c), Relation(f"{b}.1", c)}


def test_expanded_tasks_really_run(troy_session, local_fw, tmp_path):
    w = Workload()
    w.add_task({"executable": "/bin/sh", "cardinality": 4,
                "arguments": ["-c", f"touch {tmp_path}/f.%(cardinal)s"]})
    assert troy.execute_workload(troy_session, w) is State.DONE
    assert sorted(p.name for p in tmp_path.glob("f.*")) == ["f.0", "f.1", "f.2", "f.3"]


def test_derived_overlay_is_sized_by_concurrency_and_capped(tmp_path):
    with troy.Session(store_path=tmp_path / "s", config={"machine_cores": 8}) as s:
        w = Workload()
        w.add_task({"executable": "/bin/true", "cardinality": 20})
        assert Planner(s).derive_overlay(w).size == 8  # capped at the machine
        w2 = Workload()
        a = w2.add_task({"executable": "/bin/true", "cores": 2})
        b = w2.add_task([{"executable": "/bin/true"}] * 3)
        w2.add_relation([Relation(a, x) for x in b])
        assert Planner(s).derive_overlay(w2).size == 3  # the widest level
        w3 = Workload()
        w3.add_task({"executable": "/bin/true", "cores": 16})
        assert Planner(s).derive_overlay(w3).size == 16  # never below the widest task


def test_cardinality_past_the_task_limit_is_refused_before_expanding():
    """Broke: cardinality 1,000,000,000 expanded until memory ran out."""
    from troy.limits import MAX_TASKS
    w = Workload()
    big = w.add_task({"executable": "/bin/true", "cardinality": MAX_TASKS // 2 + 1})
    w.add_task({"executable": "/bin/true", "cardinality": MAX_TASKS // 2 + 1})
    with pytest.raises(troy.BadParameter) as info:
        Planner().plan(w)
    assert f"more than the limit of {MAX_TASKS}" in str(info.value)
    assert repr(big) in str(info.value)
    assert len(w.tasks) == 2 and not w.expansions  # nothing was expanded
    with pytest.raises(troy.BadParameter, match=f"cardinality: {10**9} is more than the "
                                                f"limit of {MAX_TASKS}"):
        w.add_task({"executable": "/bin/true", "cardinality": 10**9})

