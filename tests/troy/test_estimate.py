"""The estimated duration ``troy run`` prints at start: critical path and work / cores."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.helpers import REPO
from troy.cli import cli
from troy.estimate import duration, estimate
from troy.workload.files import load_workload

EXAMPLES = REPO / "examples" / "workflows"


def dag_file(tmp_path, tasks: list[dict]) -> str:
    path = tmp_path / "dag.json"
    path.write_text(json.dumps({"tasks": [{"executable": "/bin/true", **t} for t in tasks]}))
    return str(path)


DIAMOND = [  # a -> b, a -> c, b -> d, c -> d; the long chain is a b d
    {"id": "a", "runtime": 2.0},
    {"id": "b", "runtime": 3.0, "cores": 2, "parents": ["a"]},
    {"id": "c", "runtime": 1.0, "parents": ["a"]},
    {"id": "d", "runtime": 4.0, "parents": ["b", "c"]},
]


def test_hand_made_dag_critical_path_and_work(tmp_path):
    w = load_workload(dag_file(tmp_path, DIAMOND))
    e = estimate(w, cores=2)
    assert e.critical_path_s == 9.0                 # 2 + 3 + 4
    assert e.work_core_s == 13.0                    # 2 + 3*2 + 1 + 4
    assert e.work_per_core_s == 6.5
    assert e.seconds == 9.0 and e.bound == "critical path" and e.unknown == 0
    one = estimate(w, cores=1)                      # one core: the work decides
    assert one.seconds == 13.0 and one.bound == "work / cores"
    assert one.line() == ("estimated duration: at least 13 s: work / cores 13 s "
                          "(13 core-s on 1 core); critical path 9.0 s")


def test_tasks_without_runtime_are_counted_and_said(tmp_path):
    w = load_workload(dag_file(tmp_path, DIAMOND + [{"id": "e", "parents": ["d"]}]))
    e = estimate(w, cores=2)
    assert e.unknown == 1 and e.critical_path_s == 9.0
    assert e.line().endswith("; 1 of 5 tasks have no runtime hint, counted as 0 s")
    none = estimate(load_workload(dag_file(tmp_path, [{"id": "x"}, {"id": "y"}])), cores=4)
    assert none.line() == ("estimated duration: unknown (none of the 2 tasks has a "
                           "runtime hint)")


def _recorded(name: str) -> dict[str, tuple[float, int, list[str]]]:
    """A WfCommons instance's tasks straight from the file: (runtime, cores, parents)."""
    wf = json.loads((EXAMPLES / name).read_text())["workflow"]
    runs = {t["id"]: t for t in wf["execution"]["tasks"]}
    return {t["id"]: (runs[t["id"]]["runtimeInSeconds"], runs[t["id"]].get("coreCount") or 1,
                      t["parents"]) for t in wf["specification"]["tasks"]}


def test_wfcommons_forkjoin_trace(tmp_path):
    rec = _recorded("helloworld-forkjoin-10-chameleon.json")
    first, join = "cpuhog_forkjoin_00000001", "cpuhog_forkjoin_00000010"
    middle = max(rt for tid, (rt, _, _) in rec.items() if tid not in (first, join))
    e = estimate(load_workload(EXAMPLES / "helloworld-forkjoin-10-chameleon.json"), cores=4)
    assert e.critical_path_s == pytest.approx(rec[first][0] + middle + rec[join][0])
    assert e.work_core_s == pytest.approx(sum(rt * c for rt, c, _ in rec.values()))
    assert e.bound == "critical path" and e.tasks == 10


def test_srasearch_bare_run_is_announced_as_about_an_hour():
    """Broke (issue 12): a bare `troy run` of srasearch took an hour without warning."""
    rec = _recorded("srasearch-chameleon-10a-001.json")
    e = estimate(load_workload(EXAMPLES / "srasearch-chameleon-10a-001.json"), cores=2)
    assert e.work_core_s == pytest.approx(sum(rt * c for rt, c, _ in rec.values()))
    assert e.bound == "work / cores" and 50 * 60 < e.seconds < 70 * 60
    assert e.line().startswith("estimated duration: at least 58 min 18 s: work / cores")


@pytest.mark.slow
def test_troy_run_prints_the_estimate_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # task output goes to ./troy-out/ without --report
    result = CliRunner().invoke(cli, ["run", str(EXAMPLES / "helloworld-chain-5-chameleon.json"),
                                      "--pilots", "1x2", "--time-scale", "0.001"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # five 0.1 s tasks in a chain: 0.5 s along the critical path, whatever the cores
    assert lines[0].startswith("estimated duration: at least 0.5 s: critical path 0.5 s; "
                               "work / cores 0.25 s (1 core-s on 2 cores)"), lines[0]


@pytest.mark.parametrize("seconds, text", [
    (0.25, "0.25 s"), (9.04, "9.0 s"), (42.4, "42 s"), (185, "3 min 05 s"),
    (3720, "1 h 02 min")])
def test_duration_words(seconds, text):
    assert duration(seconds) == text
