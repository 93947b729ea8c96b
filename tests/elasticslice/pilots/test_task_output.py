"""Task output from a node agent: the unit runs on an emulated CloudLab node (a real node
agent, a Dask worker over TLS); the end of its stdout/stderr comes back with its result and
is written on the Troy side, bounded, a bundle member's apart."""
from __future__ import annotations

from pathlib import Path

import pytest

import troy
from tests.elasticslice.pilots.helpers import RUN_TIMEOUT
from troy.execution import TAIL_BYTES
from troy.output import OutputKeeper
from troy.report import task_entries

pytestmark = pytest.mark.slow


def test_output_of_tasks_on_node_agents_comes_back_bounded(emulator, make_cluster,
                                                           tmp_path: Path) -> None:
    cluster = make_cluster(emulator)
    w = troy.Workload()
    w.add_task({"executable": "/bin/sh", "arguments": [
        "-c", "head -c 300000 /dev/zero | tr '\\0' y; echo; echo fails here >&2; exit 4"]},
        uid="big")
    w.add_task([{"executable": "/bin/sh", "runtime": 0.01,
                 "arguments": ["-c", f"echo member-{i}"]} for i in range(8)])
    keeper = OutputKeeper(tmp_path / "out").open()
    keeper.watch(w)
    state = troy.execute_workload(cluster.session, w, cluster.overlay(), bind_mode="late",
                                  timeout=RUN_TIMEOUT, bundle=4)
    assert state is troy.State.FAILED  # "big" failed
    entries = {e["task"]: e for e in task_entries(w, keeper, str(tmp_path))}
    big = entries["big"]
    assert big["state"] == "FAILED" and big["error"] == "exit status 4"
    assert big["framework"] == "cloudlab"  # ran on a node agent
    kept = (tmp_path / big["stdout"]).read_bytes()
    assert kept.startswith(f"[troy: {300001 - TAIL_BYTES} of 300001 bytes dropped".encode())
    assert kept.endswith(b"y" * 100 + b"\n")
    assert (tmp_path / big["stderr"]).read_text() == "fails here\n"
    members = [e for tid, e in entries.items() if tid != "big"]
    assert len({e["unit"] for e in members}) < len(members)  # bundled
    assert sorted((tmp_path / e["stdout"]).read_text() for e in members) == \
        sorted(f"member-{i}\n" for i in range(8))
