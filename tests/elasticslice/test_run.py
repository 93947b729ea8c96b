"""`elasticslice run` as a user runs it (a real subprocess against a real emulator whose nodes
start real agents): it runs a workflow to the end, and a SIGKILL of its whole process
(manager, Troy, Dask scheduler) costs neither tasks nor nodes: the same command resumes."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from elasticslice.emulator.adminclient import AdminClient
from elasticslice.managers.state import ManagerState
from tests.helpers import WORKFLOWS, process_alive, wait_for
from tests.elasticslice.emulator.helpers import processes_with

pytestmark = pytest.mark.slow

FORKJOIN = WORKFLOWS / "helloworld-forkjoin-10-chameleon.json"   # 10 tasks of ~100 s
AGENT = "troy.frameworks.dask node"
RUN_TIMEOUT = 300


def elasticslice(emulator: Any, tmp: Path, *args: str, stderr: Any = None,
                 stdout: Any = subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp / "cred-cache")}
    return subprocess.Popen([sys.executable, "-m", "elasticslice.cli", "-c",
                             str(emulator.config_path), *args], env=env, stdout=stdout,
                            stderr=stderr if stderr is not None else subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)


def run_forkjoin(emulator: Any, tmp: Path, state_dir: Path, log: Path,
                 *extra: str) -> subprocess.Popen:
    return elasticslice(emulator, tmp, "run", str(FORKJOIN), "--state-dir", str(state_dir),
                        "--time-scale", "0.03", "--max-nodes", "2", *extra,
                        stderr=open(log, "a"))


def units(state_dir: Path) -> dict[str, tuple[str, float | None]]:
    """unit id -> (state, start) as the Troy store of the run says."""
    try:
        with sqlite3.connect(f"file:{state_dir / 'troy.db'}?mode=ro", uri=True,
                             timeout=5) as db:
            return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, state, start FROM units")}
    except sqlite3.Error:   # not made yet
        return {}


def nodes_in_slices(emulator: Any) -> int:
    pool = AdminClient(emulator.dir).call("Status")["pool"]
    return sum(row.get("slice", 0) for row in pool.values())


def tracked(state_dir: Path) -> list[str]:
    state = ManagerState.read_only(state_dir / "state")
    try:
        return sorted(r.node_id for r in state.nodes())
    finally:
        state.close()


def test_a_sigkilled_run_resumes_with_its_nodes_and_runs_no_done_task_again(
        emulator_factory: Any, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.ini"   # 4-core nodes: the 8-wide fork takes two
    inventory.write_text("[inventory]\ndefault_hardware_type = m510\n\n[m510]\ncount = 6\n"
                         "cores = 4\nmemory = 16384\nprefix = ms10\n")
    emulator = emulator_factory(inventory=inventory)
    state_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    first = run_forkjoin(emulator, tmp_path, state_dir, log)
    try:
        wait_for(lambda: [s for s, _ in units(state_dir).values()].count("DONE") >= 2
                 and "RUNNING" in [s for s, _ in units(state_dir).values()],
                 RUN_TIMEOUT, 0.2, what="two tasks done and one running")
        cluster = json.loads((state_dir / "cluster.json").read_text())
        assert cluster["pid"] == first.pid and cluster["scheduler"].startswith("tls://127.0.0.1:")
        agent = f"{AGENT} {cluster['scheduler']} "   # this run's agents only
        wait_for(lambda: len(processes_with(agent)) == 2, RUN_TIMEOUT, 0.2,
                 what="the agents of two nodes")
        agents = sorted(processes_with(agent))
        held = tracked(state_dir)
        assert len(held) == nodes_in_slices(emulator) == 2
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    done_before = {u: start for u, (s, start) in units(state_dir).items() if s == "DONE"}
    assert sorted(processes_with(agent)) == agents   # the agents wait for their scheduler

    restarted = time.time()
    report = tmp_path / "report.json"
    second = run_forkjoin(emulator, tmp_path, state_dir, log, "--report", str(report))
    try:
        wait_for(lambda: any(s == "RUNNING" and (start or 0) > restarted
                             for s, start in units(state_dir).values()),
                 RUN_TIMEOUT, 0.1, what="a unit running again after the restart")
        print(f"restart to the first unit running again: {time.time() - restarted:.1f} s")
        # the same nodes serve: their agents (the same processes) rejoined, nothing added
        assert set(agents) <= set(processes_with(agent))
        assert set(held) <= set(tracked(state_dir))
        assert json.loads((state_dir / "cluster.json").read_text())["scheduler"] \
            == cluster["scheduler"]
        # one process per run: a second one on the same DIR is refused, in one line
        third = elasticslice(emulator, tmp_path, "run", str(FORKJOIN), "--state-dir",
                             str(state_dir), "--time-scale", "0.03")
        out3, err3 = third.communicate(timeout=120)
        assert third.returncode == 1 and out3 == "", err3
        assert err3.strip() == (f"Error: {state_dir / 'state'}: another manager (pid "
                                f"{second.pid}) is running on this state directory; stop it "
                                f"first")
        out, _ = second.communicate(timeout=RUN_TIMEOUT)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    stderr = log.read_text()
    assert second.returncode == 0, stderr[-3000:]
    assert "resuming the run in" in stderr and "Traceback" not in stderr
    assert out.startswith("DONE: 10/10 tasks done, 0 failed, 0 canceled;")
    data = json.loads(report.read_text())
    assert data["tasks_done"] == data["tasks_total"] == 10
    assert data["stats"]["restarts"] == 1 and data["stats"]["units_lost"] == 0
    assert data["stats"]["duplicate_runs"] == 0
    assert data["stats"]["units_requeued"] >= 1   # the unit running when it was killed
    after = units(state_dir)
    assert all(s == "DONE" for s, _ in after.values())
    assert {u: after[u][1] for u in done_before} == done_before   # not run again
    # nothing held at the CM, no agent left
    assert nodes_in_slices(emulator) == 0
    wait_for(lambda: not processes_with(agent), 60, what="the node agents to end")
    assert not process_alive(second.pid)


def test_a_bad_workflow_is_one_line_and_exit_2(emulator: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for workflow, says in ((bad, f"{bad}:"), (tmp_path / "missing.json", "cannot read")):
        p = elasticslice(emulator, tmp_path, "run", str(workflow), "--state-dir",
                         str(tmp_path / "d"))
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2, err
        assert out == "" and len(err.strip().splitlines()) == 1 and says in err, err
    assert not (tmp_path / "d").exists()


def test_a_bad_state_dir_is_one_line_and_exit_1(emulator: Any, tmp_path: Path) -> None:
    plain = tmp_path / "a-file"
    plain.write_text("")
    p = elasticslice(emulator, tmp_path, "run", str(FORKJOIN), "--state-dir", str(plain))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and out == ""
    assert err.strip() == f"Error: --state-dir {plain}: not a directory"


def test_a_state_dir_of_another_workflow_is_refused(emulator: Any, tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"workflow": "/x/other.json", "sha256": "0",
                                            "time_scale": 1.0}))
    p = elasticslice(emulator, tmp_path, "run", str(FORKJOIN), "--state-dir", str(d))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and out == ""
    assert err.strip().startswith(f"Error: --state-dir {d} holds a run of /x/other.json")


def test_a_run_stopped_by_sigterm_gives_the_nodes_back_and_resumes(emulator: Any,
                                                                   tmp_path: Path) -> None:
    state_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    first = run_forkjoin(emulator, tmp_path, state_dir, log)
    try:
        wait_for(lambda: [s for s, _ in units(state_dir).values()].count("DONE") >= 1
                 and "RUNNING" in [s for s, _ in units(state_dir).values()],
                 RUN_TIMEOUT, 0.2, what="a task done and one running")
    finally:
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=120)
    assert first.returncode == 130 and out == ""
    assert f"interrupted: run the same command again to resume ({state_dir})" in log.read_text()
    assert "CANCELED" not in {s for s, _ in units(state_dir).values()}
    assert nodes_in_slices(emulator) == 0

    second = run_forkjoin(emulator, tmp_path, state_dir, log)
    out, _ = second.communicate(timeout=RUN_TIMEOUT)
    assert second.returncode == 0, log.read_text()[-3000:]
    assert out.startswith("DONE: 10/10 tasks done") and "1 restart(s)" in out
    assert nodes_in_slices(emulator) == 0
