"""The node agent outlives the process that held its scheduler: when the scheduler is
SIGKILLed it kills the units it ran, rejoins the same address under the same name once a
scheduler serves there again, and gives up (one line, non-zero exit) after its bound."""
from __future__ import annotations

from pathlib import Path

import pytest

from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask import DaskFramework
from troy.frameworks.dask.node import RECONNECT_ENV, reconnect_seconds
from tests.helpers import process_alive, wait_for
from tests.elasticslice.pilots.helpers import SchedulerProcess
from tests.troy.frameworks.nodes import member, node_agent, stop


@pytest.mark.slow
def test_agent_rejoins_a_scheduler_restarted_on_the_same_port_and_kills_its_units(
        tmp_path: Path, cluster_ca: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RECONNECT_ENV, "120")
    first = SchedulerProcess(tmp_path, cluster_ca)
    pidfile = tmp_path / "unit.pid"
    with first.joined(tmp_path, cluster_ca, "node-r") as (agent, fw, _):
        fw.submit_unit(CUD(executable="/bin/sh", arguments=[
            "-c", f"echo $$ > {pidfile}; exec sleep 300"], cores=1))
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60,
                 what="the unit to run")
        unit_pid = int(pidfile.read_text())
        first.kill()   # the cluster process dies with its scheduler
        wait_for(lambda: not process_alive(unit_pid), 60,
                 what="the unit of the lost scheduler to be killed")
        assert agent.poll() is None, "the agent left instead of waiting for its scheduler"

        again = SchedulerProcess(tmp_path, cluster_ca, port=first.port)
        fw2 = again.framework("after")
        try:
            wait_for(lambda: (p := fw2.find_pilot("node-r")) is not None
                     and p.state is State.RUNNING, 120, what="the agent to rejoin")
            u = fw2.submit_unit(CUD(executable="/bin/true", cores=2))
            assert u.wait(60) is State.DONE
        finally:
            fw2.close()
            again.proc.stop()


@pytest.mark.slow
def test_units_of_a_lost_scheduler_are_killed_before_they_end_their_work(
        tmp_path: Path, cluster_ca: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """Broke (chaos: duplicate runs): the units of an agent whose scheduler died ran on until
    the worker had closed, about 30 s, so a unit ended its work, reported to nobody, and the
    resumed cluster ran it again. They are killed as the worker starts closing: a unit ten
    seconds from the end of its work never gets there."""
    monkeypatch.setenv(RECONNECT_ENV, "5")
    first = SchedulerProcess(tmp_path, cluster_ca)
    pidfile, worked = tmp_path / "unit.pid", tmp_path / "worked"
    with first.joined(tmp_path, cluster_ca, "node-k") as (_, fw, _):
        fw.submit_unit(CUD(executable="/bin/sh", arguments=[
            "-c", f"echo $$ > {pidfile}; sleep 10; touch {worked}"], cores=1))
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60,
                 what="the unit to run")
        unit_pid = int(pidfile.read_text())
        first.kill()
        wait_for(lambda: not process_alive(unit_pid), 60, what="the unit to be killed")
        assert not worked.exists(), "the unit of a lost scheduler ran to the end of its work"


@pytest.mark.slow
def test_agent_whose_scheduler_never_comes_back_exits_within_its_bound(
        tmp_path: Path, cluster_ca: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RECONNECT_ENV, "2")
    first = SchedulerProcess(tmp_path, cluster_ca)
    log = tmp_path / "agent.log"
    with first.joined(tmp_path, cluster_ca, "node-g", cores=1, log=log) as (agent, _, _):
        first.kill()
        code = agent.wait(120)   # bounded: 2 s of retries (each attempt polls up to 30 s)
    assert code == 1
    last = log.read_text().strip().splitlines()[-1]
    assert last == (f"troy node agent: scheduler {first.address} did not come back within "
                    f"2 s (last: {last.split('(last: ', 1)[1]}")
    assert last.endswith("; exiting")


def test_reconnect_bound_is_checked() -> None:
    assert reconnect_seconds({}) == 300
    assert reconnect_seconds({RECONNECT_ENV: "0"}) == 0
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match=RECONNECT_ENV):
            reconnect_seconds({RECONNECT_ENV: bad})


@pytest.mark.slow
def test_agent_with_a_bad_reconnect_bound_says_so_in_one_line(tmp_path: Path,
                                                               cluster_ca: tuple[bytes, bytes],
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setenv(RECONNECT_ENV, "soon")
    log = tmp_path / "agent.log"
    agent = node_agent("tls://127.0.0.1:9", 1, member(tmp_path / "n", cluster_ca, "n"), log, "n")
    assert agent.wait(60) == 1
    assert log.read_text().strip() == (f"troy node agent: {RECONNECT_ENV}='soon': expected a "
                                       f"number of seconds >= 0")


@pytest.mark.slow
def test_agents_that_rejoined_before_the_manager_was_ready_are_adopted(
        tmp_path: Path, cluster_ca: tuple[bytes, bytes]) -> None:
    """A restarted cluster serves its scheduler before its manager exists: the agents that
    rejoin in between were refused for good (found by test_run: a node whose agent had
    rejoined was replaced after agent_timeout). ``adopt_joined`` offers them again."""
    ready: list[bool] = []
    fw = DaskFramework("restarting", adopt_workers=True, tls=member(tmp_path / "c", cluster_ca,
                                                                     "control"),
                       adopt_filter=lambda name, address, resources=None: bool(ready))
    fw.start()
    agent = node_agent(fw.scheduler_address, 1, member(tmp_path / "n", cluster_ca, "node-e"),
                       tmp_path / "agent.log", "node-e")
    try:
        wait_for(lambda: any(i.get("name") == "node-e" for i in fw.workers_info().values()),
                 120, what="the agent to join")
        assert fw.find_pilot("node-e") is None   # refused: its owner was not ready
        ready.append(True)
        fw.adopt_joined()
        wait_for(lambda: (p := fw.find_pilot("node-e")) is not None
                 and p.state is State.RUNNING, 60, what="the agent's pilot")
        assert fw.submit_unit(CUD(executable="/bin/true", cores=1)).wait(60) is State.DONE
    finally:
        stop(agent)
        fw.close()
