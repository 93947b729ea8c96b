"""`elasticslice run` stopped before its end, as a real subprocess on the emulator: --timeout
keeps the nodes for a resume (exit 1, one line), so does SIGTERM (exit 130, the agents wait
for their scheduler), and a Ctrl-C of a run with --release gives them back (exit 130);
whichever way, nothing in flight is recorded CANCELED."""
from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.elasticslice.helpers import (RUN_TIMEOUT, a_unit_running_since, nodes_in_slices,
                                        run_agents, run_workflow, sleepers_workflow, stop,
                                        tracked, unit_states, wait_running_on_nodes)
from tests.helpers import process_alive, wait_for

pytestmark = pytest.mark.slow


def test_a_timeout_and_sigterm_keep_the_nodes_and_ctrl_c_with_release_gives_them_back(
        emulator: Any, tmp_path: Path) -> None:
    """What broke: a run stopped before its end (Ctrl-C, SIGTERM, --timeout) gave its nodes
    back, although docs/pilots.md says it stops as a killed one does (resumable on the same
    nodes); now it keeps them for a resume unless --release."""
    workflow = sleepers_workflow(tmp_path / "sleepers.json", 2)
    state_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    first = run_workflow(emulator, tmp_path, workflow, state_dir, log, "--timeout", "30")
    out, _ = first.communicate(timeout=RUN_TIMEOUT)
    held = tracked(state_dir)
    assert first.returncode == 1 and out == ""
    assert held and nodes_in_slices(emulator) == len(held)   # kept at the CM
    assert log.read_text().strip().splitlines()[-1] == (
        f"Error: not finished within --timeout 30 s: run the same command again to resume "
        f"({state_dir}); its {len(held)} node(s) kept for it (--release gives them back)")
    assert "CANCELED" not in unit_states(state_dir)

    # resumed, then SIGTERM: kept again, the agents wait for their scheduler
    restarted = time.time()
    second = run_workflow(emulator, tmp_path, workflow, state_dir, log)
    try:
        wait_for(lambda: a_unit_running_since(state_dir, restarted), RUN_TIMEOUT, 0.1,
                 what="a unit running again after the restart")
        assert set(held) <= set(tracked(state_dir))            # the same nodes serve
        wait_for(lambda: run_agents(state_dir), RUN_TIMEOUT, 0.2, what="the run's agents")
    finally:
        out = stop(second, signal.SIGTERM)
    held, agents = tracked(state_dir), run_agents(state_dir)
    assert second.returncode == 130 and out == ""
    assert held and nodes_in_slices(emulator) == len(held)   # still ours at the CM
    assert (f"interrupted: run the same command again to resume ({state_dir}); its "
            f"{len(held)} node(s) kept for it (--release gives them back)") in log.read_text()
    assert "CANCELED" not in unit_states(state_dir)
    assert all(process_alive(pid) for pid in agents)         # waiting for their scheduler

    # resumed with --release, then Ctrl-C: given back
    restarted = time.time()
    third = run_workflow(emulator, tmp_path, workflow, state_dir, log, "--release")
    try:
        wait_for(lambda: a_unit_running_since(state_dir, restarted), RUN_TIMEOUT, 0.1,
                 what="a unit running again after the second restart")
        assert set(agents) <= set(run_agents(state_dir))      # their agents rejoined
        wait_running_on_nodes(state_dir, 2)
        agents = run_agents(state_dir)
        held = tracked(state_dir)
    finally:
        out = stop(third, signal.SIGINT)
    text = log.read_text()
    assert third.returncode == 130 and out == ""
    assert "resuming the run in" in text and "Traceback" not in text
    assert (f"interrupted: run the same command again to resume ({state_dir}); its "
            f"{len(held)} node(s) given back (--release)") in text
    assert nodes_in_slices(emulator) == 0 and "CANCELED" not in unit_states(state_dir)
    wait_for(lambda: not set(agents) & set(run_agents(state_dir)), 60,
             what="the agents of the nodes given back to end")
