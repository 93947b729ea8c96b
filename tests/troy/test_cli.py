"""``troy run``: CliRunner for the flows and errors, a real subprocess for the main flow."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.helpers import REPO, SHARED
from troy.cli import cli, parse_pilots
from troy.workload.files import load_workload

WF = SHARED / "workloads" / "wfinstances"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """troy run keeps task output under ./troy-out/ by default: not in the repository."""
    monkeypatch.chdir(tmp_path)


def assert_dependency_order(path, report: dict, time_scale: float = 0.001) -> None:
    """Every task started after all its parents (from the file) had ended."""
    w = load_workload(path, time_scale=time_scale)
    by_task = {e["task"]: e for e in report["tasks"]}
    assert set(by_task) == set(w.tasks)
    for tid in w.tasks:
        for head in w.heads(tid):
            assert by_task[tid]["start"] >= by_task[head]["end"], (head, tid)


@pytest.mark.slow
@pytest.mark.parametrize("framework, extra", [
    ("local", []), ("local", ["--no-bundle", "--scheduler", "first_fit"]), ("dask", [])])
def test_run_wfformat_in_dependency_order(tmp_path, framework, extra):
    path = WF / "helloworld-forkjoin-10-chameleon.json"
    out = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["run", str(path), "--framework", framework,
                                      "--pilots", "2x1", "--time-scale", "0.001",
                                      "--report", str(out), *extra])
    assert result.exit_code == 0, result.output
    assert "DONE: 10/10 tasks done, 0 failed" in result.output
    report = json.loads(out.read_text())
    assert report["tasks_total"] == report["tasks_done"] == 10
    assert report["tasks_failed"] == 0 and report["makespan_s"] > 0
    assert {e["state"] for e in report["tasks"]} == {"DONE"}
    assert all(e["pilot"] and e["start"] <= e["end"] for e in report["tasks"])
    assert_dependency_order(path, report)


def test_run_bundles_short_tasks_one_entry_per_task(tmp_path):
    path = WF / "seismology-chameleon-100p-001.json"
    out = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["run", str(path), "--pilots", "1x2",
                                      "--time-scale", "0.001", "--report", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["tasks_done"] == 101 == len(report["tasks"])
    assert report["units_total"] < 101  # short tasks were bundled into fewer units
    assert_dependency_order(path, report)


def test_run_troy_json_with_a_failing_task(tmp_path):
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"tasks": [
        {"id": "ok", "executable": "/bin/true"},
        {"id": "bad", "executable": "/bin/false", "parents": ["ok"]},
        {"id": "after", "executable": "/bin/true", "parents": ["bad"]}]}))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["run", str(f), "--report", str(out)])
    assert result.exit_code == 1
    report = json.loads(out.read_text())
    states = {e["task"]: e["state"] for e in report["tasks"]}
    assert states["ok"] == "DONE" and states["bad"] == "FAILED"
    assert states["after"] != "DONE"
    assert report["tasks_failed"] >= 1 and "FAILED" in result.output
    # broke: a failure said neither which task nor why
    assert "task bad FAILED: exit status 1" in result.output
    assert {e["task"]: e["error"] for e in report["tasks"]}["bad"] == "exit status 1"


@pytest.mark.parametrize("order, expected", [(None, ["long", "mid", "short"]),
                                             ("fifo", ["short", "long", "mid"])])
def test_run_starts_the_longest_task_first_unless_told_fifo(tmp_path, order, expected):
    """Three independent tasks on one core: the longest runtime hint starts first (the
    default, ``troy.order``); ``--order fifo`` starts them as the file lists them."""
    log = tmp_path / "ran"
    tasks = [{"id": name, "executable": "/bin/sh", "arguments": ["-c", f"echo {name} >> {log}"],
              "runtime": hint} for name, hint in (("short", 2.0), ("long", 9.0), ("mid", 5.0))]
    path = tmp_path / "three.json"
    path.write_text(json.dumps({"tasks": tasks}))
    result = CliRunner().invoke(cli, ["run", str(path), "--pilots", "1x1", "--no-bundle",
                                      *(["--order", order] if order else [])])
    assert result.exit_code == 0, result.output
    assert log.read_text().split() == expected


@pytest.mark.parametrize("args, message", [
    (["run", "/nonexistent/w.json"], "/nonexistent/w.json: cannot read"),
    (["run", "{bad}", "--pilots", "0x2"], "--pilots '0x2': expected COUNTxCORES"),
    (["run", "{bad}"], "line 1 column 2: invalid JSON"),
    (["run", "{good}", "--scheduler", "nosuch"], "nosuch"),
    (["run", "{good}", "--order", "lifo"], "'lifo' is not one of 'longest_first', 'fifo'"),
    (["run", "{good}", "--dask-scheduler", "dask://127.0.0.1:9"], "needs --framework dask"),
    (["run", "{good}", "--time-scale", "-1"], "--time-scale -1.0"),
    # broke: these ran (nan, inf), ran then failed (timeout, report), named no file
    # (no tasks, no executable), or printed a usage block (click usage errors)
    (["run", "{good}", "--time-scale", "nan"], "--time-scale nan: expected a finite"),
    (["run", "{good}", "--time-scale", "inf"], "--time-scale inf: expected a finite"),
    (["run", "{good}", "--timeout", "-1"], "--timeout -1.0: expected a number of seconds"),
    (["run", "{good}", "--report", "/nonexistent/r.json"], "--report /nonexistent/r.json"),
    (["run", "{empty}"], "empty.json: tasks: no tasks"),
    (["run", "{noexe}"], "noexe.json: tasks[0] (task 'a'): no executable"),
    (["run", "{good}", "--pilots", "3x"], "--pilots '3x'"),
    (["run", "{good}", "--pilots", "axb"], "--pilots 'axb'"),
    (["run", "{good}", "--time-scale", "abc"], "'--time-scale': 'abc' is not a valid float"),
    (["run", "{good}", "--framework", "slurm"], "'--framework': 'slurm' is not one of"),
    (["run", "{good}", "--frob"], "No such option '--frob'"),
    (["run"], "Missing argument 'FILE'"),
    # broke: waited forever for a pilot wide enough
    (["run", "{wide}", "--pilots", "2x1"], "wide.json: task 'a' needs 64 cores; the pilots "
                                           "have 1 (--pilots 2x1)"),
    # broke: hung after the tasks finished (100,000 pilots closed one scan each)
    (["run", "{good}", "--pilots", "100000x1000"],
     "--pilots '100000x1000': 100000 pilots is more than the limit of 1000"),
    (["run", "{good}", "--pilots", "2x5000"],
     "--pilots '2x5000': 5000 cores per pilot is more than the limit of 1024"),
    # broke: accepted (NaN), memory without end (cardinality), internal error (nesting)
    (["run", "{nan}"], "nan.json: tasks[0] (task 'a'): task.walltime: expected a finite"),
    (["run", "{huge}"], "huge.json: tasks[0] (task 'a'): task.cardinality: 1000000000 is "
                        "more than the limit of 100000"),
    (["run", "{deep}"], "deep.json: JSON nested too deeply"),
    (["run", "{good}", "--framework", "dask", "--dask-scheduler", "dask://host"],
     "--dask-scheduler: Dask scheduler address 'dask://host': missing port number"),
])
def test_errors_are_one_line(tmp_path, args, message):
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "good.json").write_text('{"tasks": [{"executable": "/bin/true"}]}')
    (tmp_path / "empty.json").write_text('{"tasks": []}')
    (tmp_path / "noexe.json").write_text('{"tasks": [{"id": "a"}]}')
    (tmp_path / "wide.json").write_text(
        '{"tasks": [{"id": "a", "executable": "/bin/true", "cores": 64}]}')
    (tmp_path / "nan.json").write_text(
        '{"tasks": [{"id": "a", "executable": "/bin/true", "walltime": NaN}]}')
    (tmp_path / "huge.json").write_text(
        '{"tasks": [{"id": "a", "executable": "/bin/true", "cardinality": 1000000000}]}')
    (tmp_path / "deep.json").write_text('{"tasks": ' + "[" * 100_000 + "]" * 100_000 + "}")
    names = ("bad", "good", "empty", "noexe", "wide", "nan", "huge", "deep")
    args = [a.format(**{n: tmp_path / f"{n}.json" for n in names}) for a in args]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    # In-process only: pytest's own sys.unraisablehook can fail near the recursion limit
    # while the deep document is freed and the interpreter says so on stderr; a real
    # `troy run` has no such hook (tests/hostile/test_workloads.py runs it as a process).
    output = result.output.replace("Exception ignored in sys.unraisablehook", "")
    lines = output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[-1].startswith("Error: ") and message in lines[-1], result.output
    assert "Traceback" not in result.output


def test_progress_counts_expanded_tasks(tmp_path):
    """Broke: progress counted tasks before cardinality expansion ("2/3 final" for 5)."""
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"tasks": [
        {"id": "a", "executable": "/bin/true"},
        {"id": "b", "executable": "/bin/true", "cardinality": 3, "parents": ["a"]}]}))
    result = CliRunner().invoke(cli, ["run", str(f)])
    assert result.exit_code == 0, result.output
    assert "tasks: 4/4 final" in result.output and "DONE: 4/4 tasks done" in result.output


def test_help_explains_defaults():
    top = CliRunner().invoke(cli, [])
    assert top.exit_code == 0 and "troy run --help" in top.output
    out = CliRunner().invoke(cli, ["run", "--help"]).output
    for default in ("[default: local]", "one pilot with", "[default: 1.0]",
                    "(default: backfill)", "(default: no limit)", "bundled"):
        assert default in out


@pytest.mark.parametrize("spec, expected", [("4x2", (4, 2)), ("3", (1, 3)), ("2X8", (2, 8))])
def test_parse_pilots(spec, expected):
    assert parse_pilots(spec) == expected


@pytest.mark.slow
def test_real_subprocess_on_dask(tmp_path):
    path = WF / "helloworld-chain-5-chameleon.json"
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "troy.cli", "run", str(path), "--framework", "dask",
         "--pilots", "1x1", "--time-scale", "0.001", "--report", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "DONE: 5/5 tasks done" in proc.stdout
    assert "tasks: 5/5 final" in proc.stderr and "Traceback" not in proc.stderr
    report = json.loads(out.read_text())
    assert_dependency_order(path, report)


@pytest.mark.slow
def test_real_subprocess_bad_file_is_one_line(tmp_path):
    bad = tmp_path / "w.json"
    bad.write_text('{"tasks": [{"id": "a", "cores": "many"}]}')
    proc = subprocess.run([sys.executable, "-m", "troy.cli", "run", str(bad)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert "tasks[0] (task 'a'): task.cores" in proc.stderr


@pytest.mark.slow
def test_malformed_dask_scheduler_address_is_one_line_at_once(tmp_path):
    """Broke: ValueError as an internal error, then Dask's half-made client hung for 30 s
    closing and printed a traceback."""
    good = tmp_path / "good.json"
    good.write_text('{"tasks": [{"executable": "/bin/true"}]}')
    proc = subprocess.run([sys.executable, "-m", "troy.cli", "run", str(good), "--framework",
                           "dask", "--dask-scheduler", "dask://[::zz"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "Error: --dask-scheduler: Dask scheduler address 'dask://[::zz': invalid address "
        "'[::zz'; maybe: ipv6 needs brackets like [::1]"]


def test_a_thousand_pilots_end_when_the_tasks_do(tmp_path):
    """At the pilot limit the run ends (closing the pilots took a scan of every pilot per
    pilot: 100,000 pilots never ended)."""
    good = tmp_path / "good.json"
    good.write_text('{"tasks": [{"executable": "/bin/true"}]}')
    result = CliRunner().invoke(cli, ["run", str(good), "--pilots", "1000x1"])
    assert result.exit_code == 0, result.output
    assert "DONE: 1/1 tasks done" in result.output


@pytest.mark.slow
def test_run_attached_to_a_running_dask_scheduler(tmp_path):
    from troy.frameworks.dask import DaskFramework
    host = DaskFramework("cli-host", sandbox=str(tmp_path / "host"))
    host.start()
    try:
        url = host.scheduler_address.replace("tcp://", "dask://")
        out = tmp_path / "r.json"
        result = CliRunner().invoke(cli, [
            "run", str(WF / "helloworld-chain-5-chameleon.json"), "--framework", "dask",
            "--dask-scheduler", url, "--pilots", "1x1", "--time-scale", "0",
            "--report", str(out)])
        assert result.exit_code == 0, result.output
        assert json.loads(out.read_text())["tasks_done"] == 5
    finally:
        host.close()
