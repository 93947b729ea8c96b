"""`elasticslice run` keeps each task's output as `troy run` does (DIR/output by default,
named per task in the report), and its summary line gives the revocations, early and
forced releases; a run that ended is only summarised again, with the same files. Nothing
secret is left behind by a finished run: no tarball, no token, no node key on the control
node's disk (only the cluster CA's key and its control members'); the run's nodes (the
stock image's, as on CloudLab) enrolled through the new path (no node certificate issued
on this side)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.elasticslice.helpers import RUN_TIMEOUT, nodes_in_slices, run_workflow

pytestmark = pytest.mark.slow

CONTROL_KEYS = {"ca.key", "scheduler.key", "enrolment.key", "wheelhouse.key"}


def assert_no_secret_left(state_dir: Path) -> None:
    """What a finished run leaves on the control node's disk: no tarball, token or node
    key."""
    private = sorted(str(f.relative_to(state_dir)) for f in state_dir.rglob("*")
                     if f.is_file() and b"PRIVATE KEY" in f.read_bytes())
    assert {name.rsplit("/", 1)[-1] for name in private} <= CONTROL_KEYS, private
    members = {f.stem for f in (state_dir / "pki" / "members").iterdir()}
    assert members <= {"scheduler", "enrolment", "wheelhouse"}, members  # nodes were never issued here
    assert not list((state_dir / "tarballs").glob("*")), "tarballs left behind"


def test_a_run_keeps_each_task_s_output_says_its_releases_and_leaves_no_secret(
        emulator: Any, tmp_path: Path) -> None:
    """What broke: its report had ``stdout: null`` for every task and no output directory;
    and a second run of the same config with another --state-dir, after the first ended and
    gave its nodes back, was refused. Its nodes boot the stock image (each
    builds the agent's environment from the wheelhouse and enrols with its token): what it
    leaves behind is checked once it ended (the secrets' test had a run of its own; the
    output's was tests/elasticslice/pilots/test_run_output.py)."""
    workflow = tmp_path / "talk.json"
    workflow.write_text(json.dumps({"tasks": [
        {"id": f"talk-{i}", "executable": "/bin/sh",
         "arguments": ["-c", f"echo said-{i}; echo warned-{i} >&2"]} for i in range(3)]}))
    state_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    reports = tmp_path / "reports"
    reports.mkdir()
    report = reports / "report.json"
    for attempt in ("ran", "ended already"):
        p = run_workflow(emulator, tmp_path, workflow, state_dir, log, "--report", str(report),
                         stock=True)
        out, _ = p.communicate(timeout=RUN_TIMEOUT)
        assert p.returncode == 0, (attempt, log.read_text()[-3000:])
        assert out.startswith("DONE: 3/3 tasks done, 0 failed, 0 canceled;"), out
        assert "; 0 revocation(s): 0 released early, 0 forced; 0 restart(s), " in out
        data = json.loads(report.read_text())
        for entry in data["tasks"]:
            i = entry["task"].rsplit("-", 1)[1]
            stdout, stderr = reports / entry["stdout"], reports / entry["stderr"]
            assert stdout.read_text() == f"said-{i}\n" and stderr.read_text() == f"warned-{i}\n"
            assert stdout.resolve().parent == state_dir / "output"
        if attempt == "ran":
            assert nodes_in_slices(emulator) == 0
            assert_no_secret_left(state_dir)
    assert "ended already" in log.read_text() and nodes_in_slices(emulator) == 0
    # what the ended run's state dir tells a user to do: the same config with another
    # --state-dir reuses the slice the first run gave back (broke: refused, "slice exists
    # and was not created from the state directory")
    p = run_workflow(emulator, tmp_path, workflow, tmp_path / "second", log, stock=True)
    out, _ = p.communicate(timeout=RUN_TIMEOUT)
    assert p.returncode == 0, log.read_text()[-3000:]
    assert out.startswith("DONE: 3/3 tasks done"), out
    assert nodes_in_slices(emulator) == 0 and "--adopt" not in log.read_text()
