"""``troy run --store`` resumes a killed run; ``troy status`` shows a run from its store."""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from tests.helpers import REPO, spare_port, wait_for
from troy.cli import cli

TROY = [sys.executable, "-m", "troy.cli"]


def _workload(tmp_path) -> tuple:
    """Four quick tasks q0..q3, two g0, g1 that wait at a gate (giving up by themselves
    after about a minute: the killed run's orphans never linger), and a join after all.
    Every task appends its name to ``out`` each time it runs."""
    out, gate = tmp_path / "out", tmp_path / "gate"
    wait = f"n=0; while [ ! -e {gate} ] && [ $n -lt 3000 ]; do sleep 0.02; n=$((n+1)); done"
    tasks = [{"id": f"q{i}", "executable": "/bin/sh", "arguments": ["-c", f"echo q{i} >> {out}"]}
             for i in range(4)]
    tasks += [{"id": f"g{i}", "executable": "/bin/sh", "parents": [f"q{i}"],
               "arguments": ["-c", f"{wait}; echo g{i} >> {out}"]} for i in range(2)]
    tasks.append({"id": "join", "executable": "/bin/sh", "parents": [t["id"] for t in tasks],
                  "arguments": ["-c", f"echo join >> {out}"]})
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"tasks": tasks}))
    return path, out, gate


def _unit_states(store) -> dict[str, str]:
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            return {json.loads(t)[0]: s for t, s in db.execute("SELECT task_ids, state FROM units")}
    except sqlite3.Error:
        return {}


@pytest.fixture
def killed_run(tmp_path, request):
    """A `troy run --store` SIGKILLed (or ``request.param``) once q0..q3 are DONE in its
    store and g0, g1 run."""
    sig = getattr(request, "param", signal.SIGKILL)
    path, out, gate = _workload(tmp_path)
    store = tmp_path / "run.sqlite"
    child = subprocess.Popen([*TROY, "run", str(path), "--store", str(store), "--pilots",
                              "1x2", "--no-bundle"], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        def ready() -> bool:
            s = _unit_states(store)
            return all(s.get(f"q{i}") == "DONE" for i in range(4)) \
                and s.get("g0") == s.get("g1") == "RUNNING"
        wait_for(ready, 60, what="q0..q3 DONE and g0, g1 RUNNING in the store")
    finally:
        child.send_signal(sig)  # SIGKILL: abrupt, no close, no flush
        child.wait(60)
    try:
        yield path, out, gate, store
    finally:
        gate.touch()  # the orphaned g0, g1 of the killed run end


@pytest.mark.slow
def test_a_killed_run_resumes_and_does_not_run_done_tasks_again(killed_run):
    path, out, gate, store = killed_run
    before = out.read_text().split()
    assert sorted(before) == ["q0", "q1", "q2", "q3"]
    gate.touch()
    proc = subprocess.run([*TROY, "run", str(path), "--store", str(store), "--pilots", "1x2"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "resuming: 4/7 tasks already done" in proc.stderr
    assert "DONE: 7/7 tasks done" in proc.stdout
    lines = out.read_text().split()
    for i in range(4):  # DONE before the kill: not run again
        assert lines.count(f"q{i}") == 1
    assert lines.count("join") == 1
    assert lines.index("join") > max(lines.index("g0"), lines.index("g1"))
    # and once more: nothing left, nothing run
    again = subprocess.run([*TROY, "run", str(path), "--store", str(store)], cwd=REPO,
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 0 and "resuming: 7/7 tasks already done" in again.stderr
    assert out.read_text().split() == lines


@pytest.mark.slow
def test_status_shows_a_killed_run_from_its_store(killed_run):
    path, _, _, store = killed_run
    result = CliRunner().invoke(cli, ["status", str(store)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("workload workload.") and f"({path})" in lines[0]
    assert lines[1] == "  tasks: 4/7 done, 2 running, 0 failed, 0 canceled, 1 pending"
    assert lines[2].startswith("  started ") and "; last update " in lines[2]
    data = json.loads(CliRunner().invoke(cli, ["status", str(store), "--json"]).output)
    (w,) = data["workloads"]
    assert (w["tasks"], w["done"], w["running"], w["failed"], w["pending"]) == (7, 4, 2, 0, 1)
    assert w["file"] == str(path) and w["started"] <= w["updated"] <= time.time()


@pytest.mark.slow
@pytest.mark.parametrize("killed_run", [signal.SIGINT], indirect=True)
def test_ctrl_c_leaves_the_run_resumable(killed_run):
    """Closing the session on Ctrl-C cancels the units it runs: the store must not say so,
    or the next run would find g0, g1 and join CANCELED and never run them."""
    _, _, _, store = killed_run
    states = _unit_states(store)
    assert "CANCELED" not in states.values() and states["q0"] == "DONE"
    result = CliRunner().invoke(cli, ["status", str(store)])
    assert "4/7 done, 2 running, 0 failed, 0 canceled, 1 pending" in result.output


@pytest.mark.slow
def test_status_of_a_file_that_is_not_a_store_is_one_line(tmp_path):
    (tmp_path / "w.json").write_text("{}")
    sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE x (a)")
    for name, why in (("w.json", "file is not a database"),
                      ("other.db", "without Troy's units and workloads tables")):
        proc = subprocess.run([*TROY, "status", str(tmp_path / name)], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == ""
        (line,) = proc.stderr.splitlines()
        assert f"{name}: not a Troy store" in line and why in line
    assert (tmp_path / "w.json").read_text() == "{}"


def test_a_store_of_another_workload_file_is_refused(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text('{"tasks": [{"executable": "/bin/true"}]}')
    two.write_text('{"tasks": [{"executable": "/bin/true"}, {"executable": "/bin/true"}]}')
    store = tmp_path / "s.sqlite"
    assert CliRunner().invoke(cli, ["run", str(one), "--store", str(store)]).exit_code == 0
    result = CliRunner().invoke(cli, ["run", str(two), "--store", str(store)])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert f"--store {store}: a run of another workload file ({one})" in line
    scaled = CliRunner().invoke(cli, ["run", str(one), "--store", str(store),
                                      "--time-scale", "0.5"])
    assert scaled.exit_code == 2 and "resume with the same --time-scale" in scaled.output


@pytest.mark.slow
def test_pilots_2by4_exits_2_in_a_real_process(tmp_path):
    """Broke: `troy run w.json --pilots 2by4` exited 1, as if the run had failed."""
    f = tmp_path / "w.json"
    f.write_text('{"tasks": [{"executable": "/bin/true"}]}')
    proc = subprocess.run([*TROY, "run", str(f), "--pilots", "2by4"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["Error: --pilots '2by4': expected COUNTxCORES such "
                                        "as 4x2"]


@pytest.mark.parametrize("args", [
    ["run", "{good}", "--pilots", "0x2"], ["run", "{good}", "--pilots", "3x"],
    ["run", "{good}", "--pilots", "100000x1000"], ["run", "{good}", "--pilots", "2x5000"],
    ["run", "{good}", "--time-scale", "-1"], ["run", "{good}", "--time-scale", "nan"],
    ["run", "{good}", "--time-scale", "abc"], ["run", "{good}", "--timeout", "0"],
    ["run", "{good}", "--report", "/nonexistent/r.json"],
    ["run", "{good}", "--store", "/nonexistent/s.sqlite"],
    ["run", "{good}", "--store", "{good}"],
    ["run", "{good}", "--scheduler", "nosuch"],
    ["run", "{good}", "--dask-scheduler", "dask://127.0.0.1:9"],
    ["run", "{good}", "--framework", "dask", "--dask-scheduler", "dask://host"],
    ["run", "{good}", "--framework", "slurm"], ["run", "{good}", "--frob"], ["run"],
    ["run", "{wide}", "--pilots", "2x1"],
    ["status"], ["status", "/nonexistent/s.sqlite"], ["status", "{good}"],
    ["status", "{good}", "--frob"], ["--frob"], ["nosuchcommand"],
])
def test_every_usage_error_exits_2(tmp_path, args):
    (tmp_path / "good.json").write_text('{"tasks": [{"executable": "/bin/true"}]}')
    (tmp_path / "wide.json").write_text('{"tasks": [{"executable": "/bin/true", "cores": 64}]}')
    args = [a.format(good=tmp_path / "good.json", wide=tmp_path / "wide.json") for a in args]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_bad_workload_file_is_not_a_usage_error(tmp_path):
    (tmp_path / "bad.json").write_text('{"tasks": [{"id": "a"}]}')
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "bad.json")])
    assert result.exit_code == 1 and "no executable" in result.output


@pytest.mark.slow
def test_version():
    proc = subprocess.run([*TROY, "--version"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("troy, version ")


@pytest.mark.slow
def test_timeout_bounds_connecting_to_a_dead_dask_scheduler(tmp_path):
    """Broke: `--timeout 2` still waited Dask's 15 s connect timeout for a dead address."""
    port = spare_port()  # a port nothing listens on
    f = tmp_path / "w.json"
    f.write_text('{"tasks": [{"executable": "/bin/true"}]}')
    proc = subprocess.run([*TROY, "run", str(f), "--framework", "dask", "--dask-scheduler",
                           f"dask://127.0.0.1:{port}", "--timeout", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert "cannot reach Dask scheduler" in line and f"127.0.0.1:{port}" in line
    assert line.endswith(f"Timed out trying to connect to tcp://127.0.0.1:{port} after 2 s"), \
        line  # the connect gave up at --timeout, not at Dask's 15 s
