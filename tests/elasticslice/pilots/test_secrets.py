"""Nothing secret is left behind by a finished `elasticslice run`: no tarball, no token, no
node key on the control node's disk (only the cluster CA's key and its control members');
the run's nodes enrolled through the new path (no node certificate issued on this side)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.elasticslice.helpers import RUN_TIMEOUT, nodes_in_slices, run_workflow

pytestmark = pytest.mark.slow

CONTROL_KEYS = {"ca.key", "scheduler.key", "enrolment.key", "wheelhouse.key"}


def test_a_finished_run_leaves_no_tarball_token_or_node_key(emulator: Any,
                                                           tmp_path: Path) -> None:
    workflow = tmp_path / "two.json"
    workflow.write_text(json.dumps({"tasks": [
        {"id": f"t-{i}", "executable": "/bin/true"} for i in range(2)]}))
    state_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    p = run_workflow(emulator, tmp_path, workflow, state_dir, log, stock=True)
    out, _ = p.communicate(timeout=RUN_TIMEOUT)
    assert p.returncode == 0 and out.startswith("DONE: 2/2 tasks done"), log.read_text()[-3000:]
    assert nodes_in_slices(emulator) == 0
    private = sorted(str(f.relative_to(state_dir)) for f in state_dir.rglob("*")
                     if f.is_file() and b"PRIVATE KEY" in f.read_bytes())
    assert {name.rsplit("/", 1)[-1] for name in private} <= CONTROL_KEYS, private
    members = {f.stem for f in (state_dir / "pki" / "members").iterdir()}
    assert members <= {"scheduler", "enrolment", "wheelhouse"}, members  # nodes were never issued here
    assert not list((state_dir / "tarballs").glob("*")), "tarballs left behind"
