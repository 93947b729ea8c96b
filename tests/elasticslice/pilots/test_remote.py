"""The manager daemon's view of the workload side over the local channel: the manager's
own PilotWatch and PilotDrainer, in front of a RemoteWorkload, drain, retire and lose the
pilots of a real Troy framework in another end of a real socket; nothing is lost."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import troy
from elasticslice.managers.policy import NodeState, NodeView
from elasticslice.managers.records import PendingDelete
from elasticslice.pilots.link import WorkloadLink
from elasticslice.pilots.drainer import PilotDrainer
from elasticslice.pilots.watch import PilotWatch
from elasticslice.pilots.remote import RemoteWorkload
from tests.helpers import wait_for
from troy import ComputeUnitDescription as CUD
from troy import PilotDescription, State


@pytest.fixture
def sides(tmp_path: Path):
    """(daemon's RemoteWorkload, workload's session, its local framework, the link)."""
    held = [("node-1", "100.64.0.2"), ("node-2", "100.64.0.3")]
    changes: list[float] = []
    remote = RemoteWorkload(tmp_path / "state", held=lambda: held,
                            on_change=lambda: changes.append(time.time()))
    (tmp_path / "state").mkdir(mode=0o700)
    remote.start()
    session = troy.Session(store_path=tmp_path / "troy.db")
    framework = session.add_framework("local", name="nodes")
    link = WorkloadLink(tmp_path / "state", framework, session, interval=0.1).start()
    yield remote, session, framework, link
    link.close()
    remote.stop()
    session.close()


def pilot_on(framework, client_id: str, size: int = 2):
    pilot = framework.submit_pilot(PilotDescription(size=size))
    pilot.worker_name = client_id   # a Dask pilot's is its node's name
    return pilot


def test_the_daemon_sees_pilots_and_demand_and_the_workload_its_nodes(sides) -> None:
    remote, session, framework, link = sides
    pilot_on(framework, "node-1")
    units = session.unit_service().submit_units(
        [CUD(executable="/bin/sleep", arguments=["30"]) for _ in range(3)])
    wait_for(lambda: remote.find_pilot("node-1") is not None
             and remote.find_pilot("node-1").busy, what="the busy pilot reported")
    seen = remote.find_pilot("node-1")
    assert (seen.size, seen.state) == (2, State.RUNNING)
    wait_for(lambda: remote.demand().running_cores == 2 and remote.demand().queued_cores == 1,
             what="the demand reported")
    # the workload knows the nodes the daemon holds, with their addresses
    wait_for(lambda: link.holds("node-2"), what="the held nodes told")
    assert link.address_of("node-1") == "100.64.0.2" and not link.holds("node-9")
    # the daemon's watch reads the remote pilots as it reads a framework's
    watch = PilotWatch(remote, clock=time.time)
    views = watch.decorate((NodeView("node-1", "cm", NodeState.READY, 0.0, node_id="pc1"),))
    assert views[0].busy is True
    for unit in units:
        unit.cancel()


def test_a_notice_drains_the_pilot_across_the_channel(sides) -> None:
    remote, session, framework, link = sides
    pilot = pilot_on(framework, "node-1")
    service = session.unit_service()
    short = service.submit_units([CUD(executable="/bin/sleep", arguments=["0.5"])
                                  for _ in range(2)])
    wait_for(lambda: all(u.state is State.RUNNING for u in short), what="units running")
    wait_for(lambda: remote.find_pilot("node-1") is not None, what="the pilot reported")
    released: list[tuple[str, str | None, str]] = []
    drainer = PilotDrainer(PilotWatch(remote, clock=time.time), margin=5.0,
                           release=lambda *args: released.append(args))
    try:
        drainer.start([PendingDelete("cm", "pc1", "node-1", time.time() + 120, time.time())])
        wait_for(lambda: released, timeout=30, what="the node released once drained")
        assert released == [("pc1", "node-1", "drained")]
        # they fitted before the deadline: they finished there, none was requeued
        wait_for(lambda: all(u.state is State.DONE for u in short), what="the units done")
        assert framework.unit_stats().requeued == 0
        assert pilot.draining and framework.drain_plan(pilot) is not None   # nothing new goes there
    finally:
        drainer.close()


def test_a_node_taken_without_notice_requeues_its_units(sides) -> None:
    remote, session, framework, link = sides
    doomed = pilot_on(framework, "node-1")
    service = session.unit_service()
    unit = service.submit_unit(CUD(executable="/bin/sleep", arguments=["1"]))
    wait_for(lambda: unit.state is State.RUNNING, what="the unit running on node-1")
    wait_for(lambda: remote.find_pilot("node-1") is not None, what="the pilot reported")
    drainer = PilotDrainer(PilotWatch(remote, clock=time.time), margin=5.0,
                           release=lambda *args: None)
    try:
        drainer.lose("node-1", "taken back by CloudLab")
        wait_for(lambda: doomed.state in (State.FAILED, State.CANCELED), what="pilot lost")
        pilot_on(framework, "node-2")   # its replacement
        service.wait_units(timeout=30)
        assert unit.state is State.DONE   # requeued, ran again: not lost
        assert framework.unit_stats().lost == 0
    finally:
        drainer.close()


def test_without_a_workload_there_is_nothing_to_drain(sides) -> None:
    remote, session, framework, link = sides
    pilot_on(framework, "node-1")
    wait_for(lambda: remote.find_pilot("node-1") is not None, what="the pilot reported")
    link.close()
    wait_for(lambda: not remote.attached, what="the daemon noticing")
    assert remote.find_pilot("node-1") is None and remote.list_pilots() == []
    released: list[tuple[str, str | None, str]] = []
    drainer = PilotDrainer(PilotWatch(remote, clock=time.time), margin=5.0,
                           release=lambda *args: released.append(args))
    drainer.start([PendingDelete("cm", "pc1", "node-1", time.time() + 120, time.time())])
    wait_for(lambda: released, what="the release (asked on the drainer's thread)")
    assert released == [("pc1", "node-1", "no pilot on it")]
    drainer.close()


def test_the_link_attaches_again_to_a_daemon_that_came_back(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    first = RemoteWorkload(state, held=lambda: [("node-1", None)]).start()
    session = troy.Session(store_path=tmp_path / "troy.db")
    framework = session.add_framework("local", name="nodes")
    pilot_on(framework, "node-1")
    link = WorkloadLink(state, framework, session, interval=0.1).start()
    try:
        wait_for(lambda: first.find_pilot("node-1") is not None, what="the first daemon")
        first.stop()
        wait_for(lambda: not link.attached, what="the link noticing")
        assert not link.holds("node-1")   # told again by the next daemon
        second = RemoteWorkload(state, held=lambda: [("node-1", "100.64.0.2")]).start()
        try:
            wait_for(lambda: second.find_pilot("node-1") is not None, timeout=15,
                     what="the link attached to the next daemon")
            # the link's report and the daemon's nodes cross on the channel: the daemon may
            # see the pilot a moment before the link has read what the daemon holds (a
            # fresh-clone run asserted in between)
            wait_for(lambda: link.address_of("node-1") == "100.64.0.2", timeout=15,
                     what="the next daemon's node address at the link")
            assert link.address_of("node-1") == "100.64.0.2"
        finally:
            second.stop()
    finally:
        link.close()
        session.close()


def test_a_workload_cannot_send_what_only_the_daemon_decides(sides, caplog) -> None:
    """The workload side's frames are reports: a `values` frame from it is refused and its
    connection closed (the link attaches again, with reports only)."""
    remote, session, framework, link = sides
    wait_for(lambda: remote.attached, what="attached")
    before = remote.server.workload
    assert link.channel is not None
    link.channel.send("values", values={"node-1": 0.5})
    wait_for(lambda: remote.server.workload is not before, what="the daemon refusing it")
    assert "values: not something the workload side sends" in caplog.text


STUCK_DECISION = """
import sys, threading
from elasticslice.pilots.link import WorkloadLink
link = WorkloadLink(sys.argv[1])
started = threading.Event()
def drain_stuck_in_dask():   # a run_on_scheduler whose scheduler went away with the Ctrl-C
    started.set()
    threading.Event().wait()
link._work.post(drain_stuck_in_dask)
assert started.wait(30)
link.close()
print("closed", flush=True)
"""


@pytest.mark.slow
def test_a_decision_stuck_in_a_dask_call_never_holds_the_run_s_exit(tmp_path: Path) -> None:
    """The demo once hung at exit after a Ctrl-C during a revocation: a drain decision sat in
    a Dask call with no answer to come, and Python's exit joined its pool's thread for good.
    The link's decisions run on threads the exit does not wait for."""
    import subprocess
    import sys
    try:
        done = subprocess.run([sys.executable, "-c", STUCK_DECISION, str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the workload's process never exited: a stuck decision held it")
    assert (done.returncode, done.stdout) == (0, "closed\n"), done.stderr


def test_a_retire_waits_until_the_workload_side_has_retired_the_pilot(
        sides, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon gives an idle node back only once its pilot is retired (on Dask: the data
    only its worker holds moved to the others): the retirement is a round trip."""
    remote, session, framework, link = sides
    pilot_on(framework, "node-1")
    wait_for(lambda: remote.find_pilot("node-1") is not None, what="the pilot reported")
    finished: list[float] = []

    def slow_retire(pilot, until=None):   # Dask copying a worker's data away
        time.sleep(0.5)
        finished.append(pilot.worker_name)
        return True

    monkeypatch.setattr(framework, "retire", slow_retire)
    assert remote.retire(remote.find_pilot("node-1"), time.time() + 10) is True
    assert finished, "the daemon went on before the pilot was retired"
    # a workload side that does not answer in time: the daemon goes on without it
    monkeypatch.setattr(framework, "retire", lambda pilot, until=None: time.sleep(3) or True)
    assert remote.retire(remote.find_pilot("node-1"), time.time() + 0.2) is False


def test_a_retired_nobody_asked_for_changes_nothing(sides, caplog) -> None:
    """The workload side may say a node retired when no retirement was asked (a late
    answer, or a confused peer): the daemon notes it and waits for nothing more."""
    remote, session, framework, link = sides
    pilot_on(framework, "node-1")
    wait_for(lambda: remote.find_pilot("node-1") is not None, what="the pilot reported")
    with caplog.at_level("INFO", logger="elasticslice.pilots.remote"):
        link._send_back("retired", client_id="node-1", done=True)
        wait_for(lambda: "no retirement was asked of it" in caplog.text,
                 what="the unasked answer noted")
    assert remote._retiring == {} and remote.attached
    assert remote.find_pilot("node-1") is not None   # the link is up, the pilot still there
