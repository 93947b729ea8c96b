"""The local framework's own promises (the shared contract suite is tests/troy/frameworks)."""
from __future__ import annotations


from tests.helpers import process_alive, wait_for
from troy import ComputeUnitDescription as CUD
from troy import PilotDescription, State


def test_units_run_as_real_processes_with_their_exit_status(local_fw, tmp_path):
    out = tmp_path / "out.txt"
    ok = local_fw.submit_unit(CUD(executable="/bin/sh", arguments=["-c", f"echo hi > {out}"]))
    bad = local_fw.submit_unit(CUD(executable="/bin/sh", arguments=["-c", "exit 3"]))
    assert ok.wait(10) is State.DONE and bad.wait(10) is State.FAILED
    assert out.read_text() == "hi\n"
    assert bad.result.exit_code == 3 and "exit status 3" in bad.result.error
    assert ok.framework == "local" and ok.pilot == local_fw.list_pilots()[0].id


def test_cores_are_reserved_while_a_unit_runs(local_fw, tmp_path):
    pilot = local_fw.list_pilots()[0]
    gate = tmp_path / "gate"
    u = local_fw.submit_unit(CUD(executable="/bin/sh", cores=3,
                                 arguments=["-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]))
    wait_for(lambda: u.state is State.RUNNING, 10, what="unit running")
    assert pilot.free_cores == 1
    gate.touch()
    assert u.wait(10) is State.DONE
    wait_for(lambda: pilot.free_cores == 4, 10, what="cores released")


def test_a_unit_wider_than_every_pilot_waits_for_a_wide_pilot(local_fw):
    wide = local_fw.submit_unit(CUD(executable="/bin/true", cores=8))
    narrow = local_fw.submit_unit(CUD(executable="/bin/true", cores=1))
    assert narrow.wait(10) is State.DONE  # the wide unit does not block the queue
    assert wide.state is State.DISPATCHED
    big = local_fw.submit_pilot(PilotDescription(size=8))
    assert wide.wait(10) is State.DONE and wide.pilot == big.id


def test_late_binding_prefers_the_tightest_pilot(troy_session):
    fw = troy_session.add_framework("local")
    small = fw.submit_pilot(PilotDescription(size=1))
    fw.submit_pilot(PilotDescription(size=8))
    u = fw.submit_unit(CUD(executable="/bin/true"))
    assert u.wait(10) is State.DONE and u.pilot == small.id


def test_early_binding_is_honoured(troy_session):
    fw = troy_session.add_framework("local")
    fw.submit_pilot(PilotDescription(size=1))
    wanted = fw.submit_pilot(PilotDescription(size=8))
    u = fw.submit_unit(CUD(executable="/bin/true"), pilot=wanted)
    assert u.wait(10) is State.DONE and u.pilot == wanted.id


def test_cancel_unit_kills_its_process(local_fw, tmp_path):
    pidfile = tmp_path / "pid"
    u = local_fw.submit_unit(CUD(executable="/bin/sh",
                                 arguments=["-c", f"echo $$ > {pidfile}; exec sleep 30"]))
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="pid file")
    pid = int(pidfile.read_text())
    u.cancel()
    assert u.state is State.CANCELED
    wait_for(lambda: not process_alive(pid), 10, what="process killed")
    wait_for(lambda: local_fw.list_pilots()[0].free_cores == 4, 10, what="cores back")


def test_a_bundle_is_tracked_by_the_member_running_now(local_fw, tmp_path):
    """The members that ended were reaped (their pids free for other processes): a cancel
    kills the running member alone, and the rest of the bundle never starts."""
    pidfile = tmp_path / "pid"
    bundle = CUD(bundle=[CUD(executable="/bin/true")] * 5 + [
        CUD(executable="/bin/sh", arguments=["-c", f"echo $$ > {pidfile}; exec sleep 30"])] * 2)
    u = local_fw.submit_unit(bundle)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="pid file")
    pid = int(pidfile.read_text())
    with local_fw._lock:
        tracked = [p.pid for p in local_fw._running[u.id].procs]
    assert tracked == [pid]
    u.cancel()
    wait_for(lambda: not process_alive(pid), 10, what="the running member killed")
    wait_for(lambda: local_fw.list_pilots()[0].free_cores == 4, 10, what="cores back")
    assert pidfile.read_text().strip() == str(pid)   # the last member did not start


def test_cancel_pilot_requeues_its_units_onto_other_pilots(troy_session, tmp_path):
    fw = troy_session.add_framework("local")
    first = fw.submit_pilot(PilotDescription(size=1))
    u = fw.submit_unit(CUD(executable="/bin/sleep", arguments=["30"]))
    wait_for(lambda: u.state is State.RUNNING, 10, what="unit running")
    assert u.pilot == first.id
    second = fw.submit_pilot(PilotDescription(size=1))
    u2 = fw.submit_unit(CUD(executable="/bin/true"))  # second is free, so this runs there
    assert u2.wait(10) is State.DONE
    seen = []
    u.add_callback(lambda unit, st: seen.append(st))
    first.cancel()
    assert first.state is State.CANCELED
    wait_for(lambda: u.pilot == second.id and u.state is State.RUNNING, 10,
             what="unit requeued on the second pilot")
    assert State.DISPATCHED in seen
    u.cancel()
    assert u.wait(10) is State.CANCELED


def test_pilot_walltime_ends_the_pilot_and_requeues(troy_session):
    fw = troy_session.add_framework("local")
    short = fw.submit_pilot(PilotDescription(size=1, walltime=0.3))
    u = fw.submit_unit(CUD(executable="/bin/sleep", arguments=["30"]))
    wait_for(lambda: u.state is State.RUNNING, 10, what="unit running")
    wait_for(lambda: short.state is State.DONE, 10, what="pilot walltime over")
    wait_for(lambda: u.state is State.DISPATCHED, 10, what="unit back in the queue")
    assert u.attempts == 2
    fw.submit_pilot(PilotDescription(size=1))
    wait_for(lambda: u.state is State.RUNNING, 10, what="unit running again")
    u.cancel()


def test_callable_units_run_in_thread(local_fw):
    u = local_fw.submit_unit(CUD(function=lambda x: x * 2, args=(21,)))
    assert u.wait(10) is State.DONE and u.result.value == 42
    boom = local_fw.submit_unit(CUD(function=lambda: 1 / 0))
    assert boom.wait(10) is State.FAILED and "ZeroDivisionError" in boom.result.error


def test_close_cancels_queued_and_running_units(troy_session):
    fw = troy_session.add_framework("local")
    fw.submit_pilot(PilotDescription(size=1))
    running = fw.submit_unit(CUD(executable="/bin/sleep", arguments=["30"]))
    queued = fw.submit_unit(CUD(executable="/bin/sleep", arguments=["30"]))
    wait_for(lambda: running.state is State.RUNNING, 10, what="unit running")
    fw.close()
    assert running.state is State.CANCELED and queued.state is State.CANCELED
    assert all(p.state is State.CANCELED for p in fw.list_pilots())
    fw.close()  # idempotent


def gated(gate, runtime: float | None) -> CUD:
    """A unit that runs until ``gate`` exists, hinted at ``runtime`` seconds."""
    return CUD(executable="/bin/sh", runtime=runtime,
               arguments=["-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])


def test_a_late_bound_unit_goes_where_the_work_ends_with_it_not_best_fit(troy_session,
                                                                          tmp_path):
    """A short unit runs on a 2-core pilot, a long one on a 3-core pilot; another long
    unit goes to the long one's pilot (best fit would take the other's last core)."""
    fw = troy_session.add_framework("local", sandbox=str(tmp_path))
    short_pilot = fw.submit_pilot(PilotDescription(size=2))
    long_pilot = fw.submit_pilot(PilotDescription(size=3))
    gate = tmp_path / "gate"
    short = fw.submit_unit(gated(gate, 1.0), pilot=short_pilot)
    long = fw.submit_unit(gated(gate, 600.0), pilot=long_pilot)
    wait_for(lambda: short.state is long.state is State.RUNNING, 10, what="both running")
    other = fw.submit_unit(gated(gate, 600.0))
    wait_for(lambda: other.state is State.RUNNING, 10, what="the second long unit running")
    assert other.pilot == long_pilot.id
    blind = fw.submit_unit(gated(gate, None))   # no hint: best fit, the tightest pilot
    wait_for(lambda: blind.state is State.RUNNING, 10, what="the unit without a hint")
    assert blind.pilot == short_pilot.id
    gate.touch()
    assert [u.wait(10) for u in (short, long, other, blind)] == [State.DONE] * 4


def test_long_units_expose_no_more_pilots_than_the_work_needs(troy_session, tmp_path):
    """Two 1-core pilots, two units of 100 s and forty of 5 s (``long_unit`` 10) through a
    unit service: all of it takes 200 s on two cores, the long work needs one core for
    that long, so the second long unit waits while the short ones run on the other pilot."""
    fw = troy_session.add_framework("local", sandbox=str(tmp_path), long_unit=10)
    pilots = [fw.submit_pilot(PilotDescription(size=1)) for _ in range(2)]
    assert all(p.wait_running(10) is State.RUNNING for p in pilots)
    gate = tmp_path / "gate"
    us = troy_session.unit_service(scheduler="backfill")
    first, second, *shorts = us.submit_units([gated(gate, 100.0), gated(gate, 100.0)]
                                             + [gated(gate, 5.0) for _ in range(40)])
    wait_for(lambda: first.state is State.RUNNING
             and any(u.state is State.RUNNING for u in shorts), 10,
             what="a long and a short unit running")
    short = next(u for u in shorts if u.state is State.RUNNING)
    assert {first.pilot, short.pilot} == {p.id for p in pilots}
    assert second.state is not State.RUNNING   # best fit would have started it
    gate.touch()
    assert us.wait_units([first, second, *shorts], timeout=30) == [State.DONE] * 42
