"""`elasticslice run --cm utah --cm wisc` on a box of two clusters (issue 37 items 2 and 4):
a sliver at each, the run SIGKILLed and resumed with both, the live line, the summary and
the report naming each CM's nodes. The wisc nodes' agents cannot reach this machine yet
(the box's second cluster has no route to the first's control address: pilot networking,
another item of issue 37), so the tasks run on utah's pilots; what is checked is the
slice: its slivers, its nodes per CM, nothing added twice."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticslice.managers.sites import site_counts
from elasticslice.managers.state import ManagerState
from tests.elasticslice.emulator.helpers import RunningEmulator, cluster_box
from tests.elasticslice.helpers import ever_held, run_workflow, sleepers_workflow, units
from tests.helpers import wait_for

pytestmark = pytest.mark.slow  # a real run of pilots on a box of two clusters


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with cluster_box(tmp_path_factory.mktemp("box") / "emu") as running:
        yield running


def sites(state_dir: Path) -> dict[str, dict]:
    if not (state_dir / "state" / "manager.db").is_file():
        return {}
    state = ManagerState.read_only(state_dir / "state")
    try:
        return site_counts(state)
    finally:
        state.close()


def held_at(state_dir: Path) -> dict[str, list[str]]:
    """client_ids held now at each CM, by the CM's name (the manager's state)."""
    state = ManagerState.read_only(state_dir / "state")
    try:
        out: dict[str, list[str]] = {}
        for rec in state.nodes():
            out.setdefault(rec.cm.split("/cluster/")[1].split("/")[0], []).append(
                rec.client_id)
        return {k: sorted(v) for k, v in out.items()}
    finally:
        state.close()


def test_a_run_on_two_cms_is_sigkilled_and_resumes_with_both_slivers(
        box: RunningEmulator, tmp_path: Path) -> None:
    flow = sleepers_workflow(tmp_path / "sleepers.json", 2, seconds=4)
    state, log, report = tmp_path / "run", tmp_path / "run.log", tmp_path / "report.json"
    args = ("--cm", "utah", "--cm", "wisc", "--node-cores", "1", "--report", str(report))
    proc = run_workflow(box, tmp_path, flow, state, log, *args)
    try:
        wait_for(lambda: {"utah", "wisc"} <= {k for k, v in sites(state).items() if v["nodes"]}
                 and "RUNNING" in [s for s, _ in units(state).values()], 120, 0.2,
                 what="a node at each CM and a task running")
        before = held_at(state)
    finally:
        proc.kill()           # SIGKILL: the manager daemon stays, holding both slivers
        proc.wait()
    assert set(before) == {"utah", "wisc"}
    proc = run_workflow(box, tmp_path, flow, state, log, *args)
    out, _ = proc.communicate(timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "resuming the run" in text
    # the live line after the resume names both CMs' nodes
    resumed = text[text.index("resuming the run"):]
    assert re.search(r"\[utah \d+ nodes?, 0 revoked; wisc \d+ nodes?, 0 revoked\]", resumed)
    assert out.startswith("DONE: 2/2 tasks done") and "; per CM: utah " in out, out
    data = json.loads(report.read_text())
    assert set(data["sites"]) == {"utah", "wisc"}
    # the nodes held before the kill were kept, none added twice: each client_id once, and
    # wisc (whose agents cannot join) never grew past its sliver's first node
    ever = ever_held(state)
    assert len(ever) == len(set(ever)) and set(sum(before.values(), [])) <= set(ever)
    assert data["sites"]["wisc"]["held_ever"] == len(before["wisc"]) == 1
