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
