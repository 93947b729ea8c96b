"""`elasticslice run` as a user runs it (a real subprocess against a real emulator whose nodes
start real agents): it runs a workflow to the end, and a SIGKILL of its whole process
(manager, Troy, Dask scheduler) costs neither tasks nor nodes: the same command resumes,
serving the slice's tarball at the URL CloudLab fetches again at every sliver change, so it
can still add nodes and give one back early; a SIGTERM (or Ctrl-C) stops it the same way.
More in tests/elasticslice/pilots/test_run_*.py."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from elasticslice.emulator.adminclient import AdminClient
from tests.elasticslice.emulator.helpers import processes_with
from tests.elasticslice.helpers import (AGENT, FORKJOIN, RUN_TIMEOUT, elasticslice, ever_held,
                                        nodes_in_slices, run_forkjoin, tracked, units)
from tests.helpers import process_alive, wait_for

pytestmark = pytest.mark.slow


def test_a_sigkilled_run_resumes_with_its_nodes_and_runs_no_done_task_again(
        emulator_factory: Any, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.ini"   # 2-core nodes: the 8-wide fork wants four
    inventory.write_text("[inventory]\ndefault_hardware_type = m510\n\n[m510]\ncount = 6\n"
                         "cores = 2\nmemory = 16384\nprefix = ms10\n")
    emulator = emulator_factory(inventory=inventory, max_wait=30)  # room for an early release
    state_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    first = run_forkjoin(emulator, tmp_path, state_dir, log)
    try:
        wait_for(lambda: [s for s, _ in units(state_dir).values()].count("DONE") >= 2
                 and "RUNNING" in [s for s, _ in units(state_dir).values()],
                 RUN_TIMEOUT, 0.2, what="two tasks done and one running")
        cluster = json.loads((state_dir / "cluster.json").read_text())
        assert cluster["pid"] == first.pid and cluster["scheduler"].startswith(
            f"tls://{emulator.control_address}:")  # the box config's [pilots] listen
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
    published = json.loads((state_dir / "publish.json").read_text())  # its port and token
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
        assert json.loads((state_dir / "publish.json").read_text()) == published
        # CloudLab takes a node back: the DeleteNodes of its early release and the AddNodes
        # of the node in its place (the fork still wants more than --max-nodes) both fetch
        # the slice's tarball again, at its old URL
        AdminClient(emulator.dir).call("Revoke", nodes=[held[0]])
        wait_for(lambda: len(ever_held(state_dir)) >= 3, RUN_TIMEOUT, 0.2,
                 what="a node added in the revoked one's place")
        # one process per run: a second one on the same DIR is refused, in one line (the
        # running one is stopped meanwhile, so that it cannot finish and let go first)
        second.send_signal(signal.SIGSTOP)
        try:
            third = elasticslice(emulator, tmp_path, "run", str(FORKJOIN), "--state-dir",
                                 str(state_dir), "--time-scale", "0.03")
            out3, err3 = third.communicate(timeout=120)
        finally:
            second.send_signal(signal.SIGCONT)
        assert third.returncode == 1 and out3 == "", err3
        assert err3.strip() == (f"Error: {state_dir}: another workload (pid {second.pid}) "
                                f"is attached to this manager daemon; stop it first")
        out, _ = second.communicate(timeout=RUN_TIMEOUT)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    stderr = log.read_text()
    assert second.returncode == 0, stderr[-3000:]
    assert "resuming the run in" in stderr and "Traceback" not in stderr
    assert out.startswith("DONE: 10/10 tasks done, 0 failed, 0 canceled;")
    assert "; 1 revocation(s): 1 released early, 0 forced; 1 restart(s)," in out
    data = json.loads(report.read_text())
    assert data["tasks_done"] == data["tasks_total"] == 10
    assert data["stats"]["restarts"] == 1 and data["stats"]["units_lost"] == 0
    assert data["stats"]["duplicate_runs"] == 0
    assert data["stats"]["units_requeued"] >= 1   # the unit running when it was killed
    after = units(state_dir)
    assert all(s == "DONE" for s, _ in after.values())
    assert {u: after[u][1] for u in done_before} == done_before   # not run again
    assert "Could not setup tarfiles" not in stderr
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


def test_a_bad_output_dir_is_one_line_and_exit_2_before_any_node(emulator: Any,
                                                                  tmp_path: Path) -> None:
    plain = tmp_path / "a-file"
    plain.write_text("")
    p = elasticslice(emulator, tmp_path, "run", str(FORKJOIN), "--state-dir",
                     str(tmp_path / "d"), "--output-dir", str(plain))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"Error: --output-dir {plain}: cannot make it")
    assert nodes_in_slices(emulator) == 0


def test_a_state_dir_of_another_workflow_is_refused(emulator: Any, tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"workflow": "/x/other.json", "sha256": "0",
                                            "time_scale": 1.0}))
    p = elasticslice(emulator, tmp_path, "run", str(FORKJOIN), "--state-dir", str(d))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and out == ""
    assert err.strip().startswith(f"Error: --state-dir {d} holds a run of /x/other.json")

