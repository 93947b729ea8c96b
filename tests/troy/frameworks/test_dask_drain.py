"""Pilots leaving the ``dask`` framework, with real node agents joining over mutual TLS:
deadline-aware drains, lost pilots, long units kept off low-valued pilots, adoption filters.
No timing is asserted: deadlines are generous and every wait is a deadline-wait."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import troy
from elasticslice.rpc.pki import make_ca
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask import DaskFramework
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import member, nodes

pytestmark = pytest.mark.slow

WAIT = 120


@pytest.fixture(scope="module")
def ca() -> tuple[bytes, bytes]:
    return make_ca("troy drain test CA", key_type="ec")


@pytest.fixture
def fw(tmp_path, ca):  # noqa: ANN001, ANN201
    f = DaskFramework("elastic", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                      tls=member(tmp_path / "control", ca, "control"),
                      adopt_filter=lambda name, addr, res: not name.startswith("intruder"))
    f.start()
    yield f
    f.close()


class Starts:
    """Every RUNNING transition seen: (unit id, pilot id, the unit's start time)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, float | None]] = []
        self.lock = threading.Lock()

    def __call__(self, unit: troy.ComputeUnit, state: State) -> None:
        if state is State.RUNNING:
            with self.lock:
                self.seen.append((unit.id, unit.pilot, unit.start))

    def on(self, pilot: troy.Pilot) -> list[tuple[str, float | None]]:
        with self.lock:
            return [(u, s) for u, p, s in self.seen if p == pilot.id]


def sleeper(seconds: float, hint: float | None = None, cores: int = 1) -> CUD:
    return CUD(executable="/bin/sleep", arguments=[str(seconds)], runtime=hint, cores=cores)


def submit(fw: DaskFramework, cuds: list[CUD], starts: Starts | None = None,
           pilot: troy.Pilot | None = None) -> list[troy.ComputeUnit]:
    units = []
    for cud in cuds:
        u = troy.ComputeUnit(cud)
        if starts is not None:
            u.add_callback(starts)
        units.append(fw.submit_unit(u, pilot))
    return units


def assert_no_new_dispatch(starts: Starts, pilot: troy.Pilot, plan: troy.DrainPlan) -> None:
    """Nothing started on ``pilot`` once its dispatch stopped, but the units Dask had handed
    it before (the drain found them there: kept or moved; a busy machine may start one a
    moment late)."""
    held = set(plan.kept + plan.requeued + plan.late_requeued)
    late = {u for u, s in starts.on(pilot) if s is None or s >= plan.dispatch_stopped_at}
    assert late <= held, late - held


def all_done(units: list[troy.ComputeUnit]) -> None:
    for u in units:
        assert u.wait(WAIT) is State.DONE, (u, u.result)


def test_drain_keeps_units_ending_before_the_deadline_and_moves_the_others(fw, ca,
                                                                           tmp_path) -> None:
    with nodes(fw, ca, tmp_path, ["node-a", "node-b"]):
        pa, pb = fw.find_pilot("node-a"), fw.find_pilot("node-b")
        starts = Starts()
        short, long = submit(fw, [sleeper(3, hint=3), sleeper(3, hint=600)], starts, pa)
        wait_for(lambda: short.state is State.RUNNING and long.state is State.RUNNING, WAIT,
                 what="both units running on node-a")
        queued = submit(fw, [sleeper(0.5, hint=0.5) for _ in range(3)], starts, pa)
        emptied = []
        plan = fw.drain_pilot(pa, time.time() + 300, margin=5, on_empty=emptied.append)
        assert plan.kept == [short.id] and long.id in plan.requeued
        assert plan.dispatch_stopped_at is not None
        all_done([short, long] + queued)
        assert short.pilot == pa.id and short.attempts == 1
        assert long.pilot == pb.id and long.attempts == 2
        assert {u.pilot for u in queued} == {pb.id}
        assert_no_new_dispatch(starts, pa, plan)
        wait_for(lambda: emptied == [pa], WAIT, what="on_empty")
        assert pa.state is State.RUNNING and pa.draining and not pa.busy
        stats = fw.unit_stats()
        assert stats.lost == 0 and stats.requeued >= 1
        # a drained pilot takes nothing new, even bound late
        more = submit(fw, [sleeper(0.1) for _ in range(4)])
        all_done(more)
        assert {u.pilot for u in more} == {pb.id}


def test_no_new_unit_reaches_a_pilot_once_its_drain_began(fw, ca, tmp_path) -> None:
    with nodes(fw, ca, tmp_path, ["node-a", "node-b"]):
        pa = fw.find_pilot("node-a")
        starts = Starts()
        units = submit(fw, [sleeper(0.3, hint=0.3) for _ in range(40)], starts)
        wait_for(lambda: len(starts.on(pa)) >= 2, WAIT, what="units running on node-a")
        emptied = threading.Event()
        plan = fw.drain_pilot(pa, None, on_empty=lambda p: emptied.set())
        all_done(units)
        assert_no_new_dispatch(starts, pa, plan)
        assert emptied.wait(WAIT)
        assert fw.unit_stats().lost == 0


def test_the_watchdog_moves_what_still_runs_at_deadline_minus_margin(fw, ca,
                                                                      tmp_path) -> None:
    marker = tmp_path / "first-attempt"
    # the first attempt overruns its hint; the second (elsewhere) ends at once
    stubborn = CUD(executable="/bin/sh", runtime=1, arguments=[
        "-c", f"[ -e {marker} ] && exit 0; touch {marker}; sleep 600"])
    with nodes(fw, ca, tmp_path, ["node-a", "node-b"]):
        pa, pb = fw.find_pilot("node-a"), fw.find_pilot("node-b")
        (u,) = submit(fw, [stubborn], pilot=pa)
        wait_for(lambda: u.state is State.RUNNING and marker.exists(), WAIT,
                 what="the unit running")
        emptied = []
        plan = fw.drain_pilot(pa, time.time() + 8, margin=2, on_empty=emptied.append)
        assert plan.kept == [u.id]   # its hint says it ends well before the deadline
        assert u.wait(WAIT) is State.DONE and u.pilot == pb.id
        assert plan.late_requeued == [u.id] and u.attempts == 2
        wait_for(lambda: emptied == [pa], WAIT, what="on_empty")


def test_a_drain_asked_again_only_brings_the_deadline_closer(fw, ca, tmp_path) -> None:
    with nodes(fw, ca, tmp_path, ["node-a"]):
        pa = fw.find_pilot("node-a")
        far = time.time() + 600
        first = fw.drain_pilot(pa, far)
        calls = []
        again = fw.drain_pilot(pa, far + 600, on_empty=calls.append)
        assert again is first and first.deadline == far
        wait_for(lambda: calls == [pa], WAIT, what="the second on_empty (already empty)")


def test_a_lost_pilot_requeues_everything_and_the_workload_finishes(tmp_path, ca) -> None:
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        fw = s.add_framework("dask", name="elastic", sandbox=str(tmp_path / "sb"),
                             adopt_workers=True, tls=member(tmp_path / "c", ca, "control"))
        w = troy.Workload()
        w.add_task([{"executable": "/bin/sleep", "arguments": ["1"], "runtime": 1}
                    for _ in range(12)])
        result: list[State] = []
        runner = threading.Thread(target=lambda: result.append(troy.execute_workload(
            s, w, troy.Overlay.following(fw), bundle=False, timeout=WAIT * 3)))
        runner.start()  # no pilot yet: the units wait
        with nodes(fw, ca, tmp_path, ["node-a", "node-b"]) as procs:
            pa = fw.find_pilot("node-a")
            wait_for(lambda: pa.busy and any(u.state is State.RUNNING and u.pilot == pa.id
                                             for t in w.tasks.values() for u in t.units),
                     WAIT, what="units running on node-a")
            procs["node-a"].send_signal(signal.SIGKILL)   # the machine is gone
            moved = fw.lose_pilot(pa, "node reclaimed")
            assert moved and pa.state is State.FAILED
            assert fw.lose_pilot(pa) == []                 # idempotent
            runner.join(WAIT * 3)
        assert result == [State.DONE]
        units = [u for t in w.tasks.values() for u in t.units]
        assert {u.state for u in units} == {State.DONE}
        assert {u.id for u in moved} <= {u.id for u in units if u.attempts >= 2}
        stats = s.unit_stats()
        assert stats.lost == 0 and stats.requeued >= len(moved)


def test_demand_counts_queued_running_and_held_units(tmp_path, ca) -> None:
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        fw = s.add_framework("dask", name="elastic", sandbox=str(tmp_path / "sb"),
                             adopt_workers=True, tls=member(tmp_path / "c", ca, "control"))
        gate = tmp_path / "go"
        wait_gate = {"executable": "/bin/sh", "cores": 2, "runtime": 5,
                     "arguments": ["-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]}
        w = troy.Workload()
        a, c, d = w.add_task([wait_gate, wait_gate, wait_gate])
        b = w.add_task({"executable": "/bin/true", "runtime": 1})
        w.add_relation(troy.Relation(a, b))
        assert s.demand() == troy.Demand()
        runner = threading.Thread(target=lambda: troy.execute_workload(
            s, w, troy.Overlay.following(fw), bundle=False, timeout=WAIT * 3))
        runner.start()
        wait_for(lambda: s.demand().units_queued == 3, WAIT, what="three units queued")
        dm = s.demand()
        assert (dm.queued_cores, dm.waiting_cores, dm.units_waiting, dm.max_unit_cores,
                dm.cores) == (6, 1, 1, 2, 6)
        with nodes(fw, ca, tmp_path, ["node-a", "node-b"]):
            wait_for(lambda: s.demand().units_running == 2, WAIT, what="two units running")
            dm = s.demand()
            assert (dm.running_cores, dm.queued_cores, dm.units_queued) == (4, 2, 1)
            gate.touch()
            runner.join(WAIT * 3)
            assert w.state is State.DONE
        dm = s.demand()
        assert (dm.cores, dm.waiting_cores, dm.units_done) == (0, 0, 4)


def test_long_units_stay_off_low_valued_pilots_while_another_can_take_them(fw, ca,
                                                                          tmp_path) -> None:
    with nodes(fw, ca, tmp_path, ["node-a", "node-b"]):
        pa, pb = fw.find_pilot("node-a"), fw.find_pilot("node-b")
        fw.set_pilot_values({"node-a": 0.1, "node-b": 0.9})
        assert (pa.value, pb.value) == (0.1, 0.9)
        long = submit(fw, [sleeper(0.2, hint=3600) for _ in range(6)])
        all_done(long)
        assert {u.pilot for u in long} == {pb.id}
        # the valued pilot is drained: long units then go to the one left
        fw.drain_pilot(pb, None)
        more = submit(fw, [sleeper(0.2, hint=3600) for _ in range(2)])
        all_done(more)
        assert {u.pilot for u in more} == {pa.id}


def test_a_worker_the_filter_refuses_is_never_given_a_unit(fw, ca, tmp_path) -> None:
    with nodes(fw, ca, tmp_path, ["intruder-1"], cores=8, adopted=False), \
            nodes(fw, ca, tmp_path, ["node-a"], cores=1):
        wait_for(lambda: len(fw.workers_info()) == 2, WAIT, what="both workers joined")
        assert fw.find_pilot("intruder-1") is None
        pa = fw.find_pilot("node-a")
        units = submit(fw, [sleeper(0.05) for _ in range(12)])
        all_done(units)
        assert {u.pilot for u in units} == {pa.id}
        # even a unit as wide as only the intruder is waits instead of going there
        (wide,) = submit(fw, [sleeper(0.05, cores=4)])
        assert wide.wait(3) is State.DISPATCHED
        wide.cancel()
        busy = fw.client.processing()
        intruder = [a for a, info in fw.workers_info().items()
                    if info.get("name") == "intruder-1"]
        assert intruder and not any(busy.get(a) or fw._processing(a) for a in intruder)
        assert not any(fw._links.connected(a) for a in intruder)   # never asked to connect


def test_a_unit_killed_with_its_draining_node_is_requeued_not_failed(fw, ca,
                                                                     tmp_path) -> None:
    """Regression: a node given back after its drain kills the units still on it; such a
    unit ended FAILED (seen in the demo) instead of running elsewhere."""
    pidfile = tmp_path / "pid"
    cud = CUD(executable="/bin/sh", arguments=[
        "-c", f"[ -e {pidfile} ] && exit 0; echo $$ > {pidfile}.new; "
              f"mv {pidfile}.new {pidfile}; exec sleep 600"])
    with nodes(fw, ca, tmp_path, ["node-a", "node-b"]):
        pa, pb = fw.find_pilot("node-a"), fw.find_pilot("node-b")
        (u,) = submit(fw, [cud], pilot=pa)
        wait_for(lambda: u.state is State.RUNNING and pidfile.exists(), WAIT,
                 what="the unit running")
        plan = fw.drain_pilot(pa, None)      # no hint, no deadline: it may run on
        assert plan.kept == [u.id]
        os.kill(int(pidfile.read_text()), signal.SIGKILL)   # the node goes: so does it
        assert u.wait(WAIT) is State.DONE and u.pilot == pb.id and u.attempts == 2
        assert fw.unit_stats().lost == 0


def test_a_member_posing_as_another_node_is_not_adopted(fw, ca, tmp_path) -> None:
    """A worker with a valid cluster certificate for node-b that calls itself node-a."""
    from tests.troy.frameworks.nodes import node_agent, stop
    poser = node_agent(fw.scheduler_address, 4, member(tmp_path / "p", ca, "node-b"),
                       tmp_path / "poser.log", name="node-a")
    try:
        wait_for(lambda: len(fw.workers_info()) == 1, WAIT, what="the poser to connect")
        with nodes(fw, ca, tmp_path, ["node-c"], cores=1):
            assert fw.find_pilot("node-a") is None and len(fw.list_pilots()) == 1
            units = submit(fw, [sleeper(0.05) for _ in range(6)])
            all_done(units)
            assert {u.pilot for u in units} == {fw.find_pilot("node-c").id}
    finally:
        stop(poser)
