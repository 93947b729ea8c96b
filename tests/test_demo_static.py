"""``bin/demo --static`` (the single-machine walkthrough) as users run it: a real
subprocess, the emulator over TLS, real node processes, real Troy pilots; assertions on
what the user sees and on what is left behind."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.helpers import WORKFLOWS, wait_for
from tests.demo_helpers import DemoRun, emulator_port, leftovers, run_listens_on
from troy.report import ENTRY_KEYS

pytestmark = pytest.mark.slow

FAST = ["--static", "--boot-delay", "0.2", "--timeout", "30"]


def test_demo_walks_every_step_and_leaves_nothing_running(tmp_path: Path) -> None:
    d = tmp_path / "run"
    run = DemoRun("--dir", str(d), *FAST, "--time-scale", "0.1", cwd=tmp_path)
    # While Troy runs (step 4, two seconds of tasks) the nodes are still held: their
    # own folders hold what the startup command wrote. The demo is frozen while we look.
    wait_for(lambda: run.saw("[4/5]") or run.proc.poll() is not None, 60, what="step 4")
    os.kill(run.proc.pid, signal.SIGSTOP)
    try:
        started = sorted(d.glob("nodes/*/root/tmp/started"))
        contents = [p.read_text() for p in started]
        assert not run.saw("[5/5]")
    finally:
        os.kill(run.proc.pid, signal.SIGCONT)
    code, out, err = run.finish()
    assert code == 0, err
    assert "Traceback" not in out + err and err == ""
    for n in range(1, 6):
        assert f"[{n}/5] " in out
    names = {p.parent.parent.parent.name for p in started}  # m510s; the added ones free ones by name
    assert len(started) == 4 and {"ms1001", "ms1002"} <= names and \
        all(n.startswith("ms10") for n in names)
    assert all(c.startswith("node-") and "cores=8" in c and " user=" in c
               and not c.endswith(" user=root") for c in contents), contents  # as on CloudLab
    assert "SliverStatus: sliver ready     ready 2/2  startup done 2/2" in out
    assert "node-0: exit 0; run/nodes/ms1001/root/tmp/started: node-0.elastic.elasticslice" in out
    table = [line.split() for line in out.splitlines() if line.strip().startswith("node-")
             and line.strip().endswith("ready")]
    assert [row[0] for row in table] == ["node-0", "node-1", "node-2", "node-3"]
    assert all(row[-2:] == ["8", "ready"] for row in table)
    assert "--static: these pilots run on THIS machine" in out
    assert "tasks run       58/58 done, 0 failed, 0 canceled" in out
    assert "nodes acquired  4 (2 by CreateSliver, 2 by AddNodes)" in out
    assert "nodes released  4 (2 by DeleteNodes, 2 by DeleteSlice)" in out
    report = json.loads((d / "report.json").read_text())
    assert report["troy"]["tasks_done"] == 58 and report["troy"]["state"] == "DONE"
    assert all(tuple(e) == ENTRY_KEYS for e in report["troy"]["tasks"])
    assert sum(p["units"] for p in report["troy"]["pilots"].values()) == \
        report["troy"]["units_total"]
    assert all(n["started"].startswith(n["hostname"]) for n in report["nodes"])
    assert [n["released_by"] for n in report["nodes"]] == \
        ["DeleteSlice", "DeleteSlice", "DeleteNodes", "DeleteNodes"]
    assert not list(d.glob("nodes/*/root/tmp/started"))    # released nodes are wiped
    assert not run_listens_on(emulator_port(report), run.proc.pid, d)
    assert leftovers(run.proc.pid, d) == []


def test_demo_on_dask_pilots(tmp_path: Path) -> None:
    d = tmp_path / "run"
    run = DemoRun("--dir", str(d), *FAST, "--framework", "dask", "--nodes", "1",
                  "--add-nodes", "1", "--workflow",
                  str(WORKFLOWS / "helloworld-forkjoin-10-chameleon.json"),
                  "--time-scale", "0.005", "--quiet", cwd=tmp_path)
    code, out, err = run.finish()
    assert code == 0, err
    assert "Traceback" not in out + err
    assert "tasks run       10/10 done, 0 failed, 0 canceled" in out
    assert "on 2 dask pilots" in out
    assert "SliverStatus" not in out                    # --quiet: steps and summary only
    report = json.loads((d / "report.json").read_text())
    assert report["troy"]["framework"] == "dask"
    assert not run_listens_on(emulator_port(report), run.proc.pid, d)
    assert leftovers(run.proc.pid, d) == []


def test_interrupt_stops_everything(tmp_path: Path) -> None:
    d = tmp_path / "run"
    run = DemoRun("--dir", str(d), *FAST, "--time-scale", "5", cwd=tmp_path)
    wait_for(lambda: run.saw("pilots up") or run.proc.poll() is not None, 60,
             what="pilots up")
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish()
    assert code == 130, f"exit {code}: {err[-2000:]}"
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("demo: interrupted in step 4/5 (Troy workflow)")
    assert "Traceback" not in out + err
    report = json.loads((d / "report.json").read_text())
    assert not run_listens_on(emulator_port(report), run.proc.pid, d)
    assert leftovers(run.proc.pid, d) == []


@pytest.mark.parametrize("args, message", [
    (["--hardware-type", "nosuch"], "step 1/5 (emulator): --hardware-type nosuch: the "
                                    "emulator has none; it has m400, m510, xl170, d430"),
    (["--hardware-type", "d430", "--nodes", "5", "--add-nodes", "4"],
     "step 2/5 (slice and sliver): 9 d430 nodes wanted, 8 available"),
])
def test_failures_are_one_line_and_clean(tmp_path: Path, args: list[str],
                                         message: str) -> None:
    d = tmp_path / "run"
    run = DemoRun("--dir", str(d), *FAST, *args, cwd=tmp_path)
    code, out, err = run.finish()
    assert code == 1
    assert err.count("\n") == 1 and message in err and "Traceback" not in out + err
    report = json.loads((d / "report.json").read_text())
    assert not run_listens_on(emulator_port(report), run.proc.pid, d)
    assert leftovers(run.proc.pid, d) == []


def test_bad_workflow_fails_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "wf.json"
    bad.write_text('{"workflow": {"tasks": [{"id": "a", "runtime": -1}]}}')
    run = DemoRun("--static", "--dir", str(tmp_path / "run"), "--workflow", str(bad),
                  cwd=tmp_path)
    code, out, err = run.finish()
    assert code == 1
    assert err.count("\n") == 1 and "demo: failed in setup:" in err and str(bad) in err
    assert "[1/5]" not in out and "Traceback" not in out + err


def test_refuses_to_wipe_a_directory_it_did_not_make(tmp_path: Path) -> None:
    mine = tmp_path / "precious"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    run = DemoRun("--static", "--dir", str(mine), cwd=tmp_path)
    code, out, err = run.finish()
    assert code == 1 and "was not made by the demo" in err and "Traceback" not in err
    assert (mine / "thesis.tex").read_text() == "keep me"
