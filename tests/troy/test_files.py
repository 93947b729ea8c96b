"""Workload files: every shared WfFormat instance, Troy JSON, and bad files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import SHARED
from troy.errors import WorkloadFileError
from troy.states import State
from troy.workload.files import load_workload

WFDIR = SHARED / "workloads" / "wfinstances"
INSTANCES = sorted(WFDIR.glob("*.json"))


def expected(path: Path) -> tuple[int, int, dict[str, float]]:
    """Task count, distinct parent links and runtimes, read straight from the file."""
    wf = json.loads(path.read_text())["workflow"]
    spec = wf["specification"]["tasks"]
    runs = {t["id"]: t["runtimeInSeconds"] for t in wf["execution"]["tasks"]}
    return len(spec), sum(len(set(t["parents"])) for t in spec), runs


def topological_order(w) -> list[str]:
    indeg = {t: len(w.heads(t)) for t in w.tasks}
    ready = sorted(t for t, d in indeg.items() if d == 0)
    order = []
    while ready:
        t = ready.pop()
        order.append(t)
        for tail in w.tails(t):
            indeg[tail] -= 1
            if indeg[tail] == 0:
                ready.append(tail)
    return order


def test_every_shared_instance_is_there():
    assert len(INSTANCES) >= 8


@pytest.mark.parametrize("path", INSTANCES, ids=[p.stem for p in INSTANCES])
def test_wfformat_instance_loads(path):
    w = load_workload(path, time_scale=0.5)
    ntasks, nrel, runtimes = expected(path)
    assert len(w.tasks) == ntasks and len(w.relations) == nrel
    assert w.state is State.DESCRIBED
    assert len(topological_order(w)) == ntasks  # a DAG: every task gets ordered
    for uid, task in w.tasks.items():
        d = task.description
        assert d.executable == "/bin/sleep" and d.cores >= 1
        assert float(d.arguments[0]) == pytest.approx(runtimes[uid] * 0.5, abs=1e-6)
        assert d.runtime == pytest.approx(runtimes[uid] * 0.5, abs=1e-6)


def test_wfformat_chain_relations_and_cores(tmp_path):
    w = load_workload(WFDIR / "helloworld-chain-5-chameleon.json", time_scale=0)
    assert topological_order(w) == [f"cpuhog_chain_0000000{i}" for i in range(1, 6)]
    assert {t.description.arguments[0] for t in w.tasks.values()} == {"0"}
    blast = load_workload(WFDIR / "blast-chameleon-small-001.json", max_cores=1)
    assert {t.description.cores for t in blast.tasks.values()} == {1}


def test_wfformat_older_schema_layout(tmp_path):
    """Schema <= 1.4: tasks under workflow.tasks, runtime/cores on the task itself."""
    f = tmp_path / "old.json"
    f.write_text(json.dumps({"schemaVersion": "1.3", "workflow": {"tasks": [
        {"name": "a", "runtime": 2.0, "cores": 4, "parents": []},
        {"name": "b", "runtime": 1.0, "parents": ["a"]},
        {"name": "c", "runtimeInSeconds": 1.0, "parents": [{"name": "a"}, "b"]}]}}))
    w = load_workload(f, time_scale=0.1, max_cores=2)
    assert w.tasks["a"].description.cores == 2 and w.tasks["b"].description.cores == 1
    assert w.tasks["a"].description.arguments == ["0.2"]
    assert w.heads("c") == {"a", "b"} and len(w.relations) == 3


def test_troy_json(tmp_path):
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"tasks": [
        {"id": "split", "executable": "/bin/echo", "arguments": ["hi"], "cores": 2},
        {"name": "work", "executable": "/bin/true", "cardinality": 3, "parents": ["split"]},
        {"executable": "/bin/true", "walltime": 5}],
        "relations": [["work", "task.2"], {"head": "split", "tail": "task.2"}]}))
    w = load_workload(f)
    assert set(w.tasks) == {"split", "work", "task.2"}
    assert w.tasks["split"].description.cores == 2
    assert w.tasks["work"].description.cardinality == 3
    assert w.heads("task.2") == {"work", "split"} and w.heads("work") == {"split"}


@pytest.mark.parametrize("content, message", [
    ('{"tasks": [', "line 1 column 12: invalid JSON"),
    ("[1, 2]", "expected a JSON object at the top"),
    ('{"jobs": []}', "neither Troy JSON"),
    ('{"tasks": {}}', "tasks: expected a list"),
    ('{"tasks": [{"id": "a", "cores": 0}]}', "tasks[0] (task 'a'): task.cores"),
    ('{"tasks": [{"id": "a", "colour": "red"}]}', "unknown field(s) colour"),
    ('{"tasks": [{"id": "a"}, {"id": "a"}]}', "tasks[1]: duplicate task id 'a'"),
    ('{"tasks": [{"id": "a", "parents": ["zz"]}]}', "tasks[0].parents[0]: unknown task 'zz'"),
    ('{"tasks": [{"id": "a"}], "relations": [["a"]]}', "relations[0]: expected [head, tail]"),
    ('{"tasks": [{"id": "a", "parents": ["b"]}, {"id": "b", "parents": ["a"]}]}', "cycle"),
    ('{"tasks": [], "extra": 1}', "top level: unknown key(s) extra"),
    ('{"workflow": {"tasks": [{"name": "a", "runtime": -1}]}}',
     "workflow.tasks[0] (a).runtime: expected a finite number >= 0"),
    ('{"workflow": {"tasks": [{"name": "a", "parents": ["nope"]}]}}',
     "workflow.tasks[0].parents[0] (task 'a'): unknown task 'nope'"),
    ('{"workflow": {"specification": {"tasks": [{"parents": []}]}}}',
     "workflow.specification.tasks[0]: task without an id or name"),
    # broke: NaN and Infinity were accepted as numbers
    ('{"tasks": [{"id": "a", "executable": "/bin/true", "walltime": NaN}]}',
     "tasks[0] (task 'a'): task.walltime: expected a finite number >= 0, got nan"),
    ('{"tasks": [{"id": "a", "executable": "/bin/true", "runtime": Infinity}]}',
     "tasks[0] (task 'a'): task.runtime: expected a finite number >= 0, got inf"),
    ('{"tasks": [{"id": "a", "executable": "/bin/echo", "arguments": [-Infinity]}]}',
     "tasks[0] (task 'a'): task.arguments: expected a list of strings"),
    ('{"workflow": {"tasks": [{"name": "a", "runtime": NaN}]}}',
     "workflow.tasks[0] (a).runtime: expected a finite number >= 0, got nan"),
    ('{"workflow": {"tasks": [{"name": "a", "cores": Infinity}]}}',
     "workflow.tasks[0] (a).cores: expected a finite number >= 1, got inf"),
    # broke: memory grew without end expanding it later
    ('{"tasks": [{"id": "a", "executable": "/bin/true", "cardinality": 1000000000}]}',
     "tasks[0] (task 'a'): task.cardinality: 1000000000 is more than the limit of 100000"),
    ('{"tasks": [{"id": "a", "executable": "/bin/true", "cardinality": 60000},'
     ' {"id": "b", "executable": "/bin/true", "cardinality": 60000}]}',
     "tasks[1] (task 'b'): cardinality 60000 brings the workload to at least 120000 tasks "
     "after expansion, more than the limit of 100000"),
    # broke: an internal error (TypeError: unhashable type: 'list')
    ('{"tasks": [{"id": "a", "executable": "/bin/true", "parents": [["b"]]}]}',
     "tasks[0].parents[0]: expected a task id (a string), got ['b']"),
])
def test_bad_files_name_file_and_place(tmp_path, content, message):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(WorkloadFileError) as info:
        load_workload(f)
    text = str(info.value)
    assert text.startswith(f"{f}: ") and message in text and "\n" not in text


def test_missing_file(tmp_path):
    with pytest.raises(WorkloadFileError, match="nope.json: cannot read"):
        load_workload(tmp_path / "nope.json")


@pytest.mark.parametrize("depth, message", [
    (100_000, "JSON nested too deeply"),   # broke: RecursionError, an internal error
    (900, "task.cores: expected an integer >= 1, got [[[["),  # parsed; the message stays short
])
def test_deeply_nested_json(tmp_path, depth, message):
    f = tmp_path / "deep.json"
    f.write_text('{"tasks": [{"executable": "/bin/true", "cores": '
                 + "[" * depth + "]" * depth + "}]}")
    with pytest.raises(WorkloadFileError) as info:
        load_workload(f)
    text = str(info.value)
    assert text.startswith(f"{f}: ") and message in text and len(text) < 300


def test_more_tasks_than_the_limit(tmp_path):
    from troy.limits import MAX_TASKS
    f = tmp_path / "many.json"
    f.write_text('{"tasks": [' + ", ".join(["{}"] * (MAX_TASKS + 1)) + "]}")
    with pytest.raises(WorkloadFileError, match=f"many.json: tasks: {MAX_TASKS + 1} tasks is "
                                                f"more than the limit of {MAX_TASKS}"):
        load_workload(f)
