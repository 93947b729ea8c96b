"""A node agent that stops leaves no unit's process behind, even one that was starting as it
stopped (regression: with cancels acked one by one, a cancel made room for the next unit,
whose thread was starting its process when the pilot went; the worker exited before the
process was registered, and it ran on, an orphan)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from troy import ComputeUnitDescription as CUD
from troy.frameworks.dask import agent
from tests.helpers import processes_of, wait_for


@pytest.fixture
def agent_state():
    """The agent's module state as a fresh worker has it, and again afterwards."""
    agent._stopping.clear()
    agent._canceled.clear()
    yield
    agent._stopping.clear()
    agent._canceled.clear()
    agent._procs.clear()


def test_a_unit_starting_as_the_agent_stops_is_killed_before_the_stop_returns(
        tmp_path: Path, agent_state) -> None:
    marker = str(tmp_path / "orphan")
    outcome: list[object] = []

    def started() -> None:   # the unit is about to start its process: the stop begins now
        wait_for(agent._stopping.is_set, 30, what="the agent stopping")

    def unit() -> None:
        try:
            outcome.append(agent.run_tracked(
                CUD(executable="/bin/sh", arguments=["-c", f"sleep 60 # {marker}"]), "u1",
                str(tmp_path), started))
        except agent.Stopped as err:
            outcome.append(err)

    t = threading.Thread(target=unit)
    t.start()
    wait_for(lambda: "u1" in agent._procs, 30, what="the unit's thread in run_tracked")
    agent._kill_all(wait=10)
    assert not processes_of(marker), "the unit's process outlived the stop"
    t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], agent.Stopped)
    time.sleep(0.2)
    assert not processes_of(marker)
    # and once stopping, nothing starts at all
    with pytest.raises(agent.Stopped):
        agent.run_tracked(CUD(executable="/bin/true"), "u2", str(tmp_path), lambda: None)
    assert "u2" not in agent._procs


def test_a_bundle_is_known_by_the_member_running_now_not_by_those_reaped(
        tmp_path: Path, agent_state) -> None:
    """A member that ended was reaped, and its pid may belong to another process by the
    time a cancel comes: the agent keeps only the running member for ``kill_unit``, which
    then stops the bundle."""
    marker = str(tmp_path / "member")
    bundle = CUD(bundle=[CUD(executable="/bin/true")] * 5 + [
        CUD(executable="/bin/sh", arguments=["-c", f"sleep 60 # {marker}"])] * 2)
    outcome: list[object] = []
    t = threading.Thread(target=lambda: outcome.append(
        agent.run_tracked(bundle, "u1", str(tmp_path), lambda: None)))
    t.start()
    wait_for(lambda: processes_of(marker), 30, what="the sleeping member")
    with agent._procs_lock:
        tracked = list(agent._procs["u1"])
    assert len(tracked) == 1 and list(processes_of(marker)) == [tracked[0].pid]
    assert agent.kill_unit("u1")
    t.join(30)
    result = outcome[0]
    assert [m.ok for m in result.members] == [True] * 5 + [False, False]
    assert result.members[5].error == "killed by signal 9"
    assert result.members[6].error == "canceled"
    assert not processes_of(marker)
