"""The pilot framework contract, run on every framework (``local`` and ``dask``); the drain
contract is in test_contract_drain.py."""
from __future__ import annotations


import pytest

import troy
from troy import ComputeUnitDescription as CUD
from troy import State
from tests.helpers import process_alive, wait_for
from tests.troy.frameworks.nodes import running_pilot


def square(x: int) -> int:
    return x * x


def boom() -> None:
    raise ValueError("no luck")


def test_pilot_lifecycle_and_free_cores(framework, tmp_path):
    seen: list[State] = []
    p = framework.submit_pilot(troy.PilotDescription(size=3))
    p.add_callback(lambda pilot, s: seen.append(s))
    assert p.state in (State.PENDING, State.RUNNING)
    assert p.wait_running(30) is State.RUNNING
    assert p.size == 3 and p.free_cores == 3 and p.native_id
    assert framework.list_pilots() == [p]
    gate = tmp_path / "gate"
    u = framework.submit_unit(CUD(executable="/bin/sh", cores=2, arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]))
    wait_for(lambda: u.state is State.RUNNING, 30, what="unit running")
    assert p.free_cores == 1 and framework.free_cores == 1
    gate.touch()
    assert u.wait(30) is State.DONE
    wait_for(lambda: p.free_cores == 3, 10, what="cores back")
    p.cancel()
    assert p.state is State.CANCELED and p.free_cores == 0
    assert seen[-1] is State.CANCELED


def test_executable_unit_done(framework, tmp_path):
    running_pilot(framework, 1)
    out = tmp_path / "out.txt"
    u = framework.submit_unit(CUD(executable="/bin/echo", arguments=["hello"], stdout=str(out)))
    assert u.wait(30) is State.DONE
    assert u.result.exit_code == 0 and u.result.error is None
    assert out.read_text() == "hello\n"
    assert u.framework == framework.name and u.pilot is not None
    assert u.start <= u.end


def test_failing_unit_failed_with_error(framework):
    running_pilot(framework, 1)
    bad = framework.submit_unit(CUD(executable="/bin/sh", arguments=["-c", "exit 3"]))
    missing = framework.submit_unit(CUD(executable="/nonexistent/program"))
    raising = framework.submit_unit(CUD(function=boom))
    assert bad.wait(30) is State.FAILED and bad.result.exit_code == 3
    assert "exit status 3" in bad.result.error
    assert missing.wait(30) is State.FAILED and "cannot start" in missing.result.error
    assert raising.wait(30) is State.FAILED and "ValueError: no luck" in raising.result.error


def test_callable_unit_returns_value(framework):
    running_pilot(framework, 2)
    units = [framework.submit_unit(CUD(function=square, args=(i,))) for i in range(20)]
    assert [u.wait(30) for u in units] == [State.DONE] * 20
    assert [u.result.value for u in units] == [i * i for i in range(20)]


def test_cores_respected(framework):
    """Two 2-core units on a 2-core pilot never overlap (their own start/end times)."""
    running_pilot(framework, 2)
    units = [framework.submit_unit(CUD(executable="/bin/sleep", arguments=["0.2"], cores=2))
             for _ in range(2)]
    assert [u.wait(30) for u in units] == [State.DONE] * 2
    first, second = sorted(units, key=lambda u: u.result.start)
    assert first.result.end <= second.result.start


def test_early_binding_to_a_chosen_pilot(framework):
    pilots = [running_pilot(framework, 1) for _ in range(2)]
    units = [framework.submit_unit(CUD(executable="/bin/true"), pilot=pilots[1])
             for _ in range(3)]
    units.append(framework.submit_unit(CUD(executable="/bin/true"), pilot=pilots[0].id))
    assert [u.wait(30) for u in units] == [State.DONE] * 4
    assert [u.pilot for u in units] == [pilots[1].id] * 3 + [pilots[0].id]


def test_early_binding_to_a_too_small_pilot_is_refused(framework):
    p = running_pilot(framework, 1)
    with pytest.raises(troy.BadParameter, match="needs 2 cores"):
        framework.submit_unit(CUD(executable="/bin/true", cores=2), pilot=p)


def test_cancel_running_unit_kills_its_process(framework, tmp_path):
    running_pilot(framework, 1)
    pidfile = tmp_path / "pid"
    u = framework.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 60"]))
    wait_for(pidfile.exists, 30, what="unit started")
    pid = int(pidfile.read_text())
    # (on Dask, RUNNING is an event from the worker: under load it can trail the pid file)
    wait_for(lambda: u.state is State.RUNNING, 30, what="unit RUNNING")
    assert process_alive(pid)
    u.cancel()
    assert u.state is State.CANCELED
    wait_for(lambda: not process_alive(pid), 10, what="unit process gone")
    after = framework.submit_unit(CUD(executable="/bin/true"))  # the core came back
    assert after.wait(30) is State.DONE


def test_cancel_queued_unit_never_starts(framework, tmp_path):
    running_pilot(framework, 1)
    gate = tmp_path / "gate"
    blocker = framework.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]))
    marker = tmp_path / "ran"
    queued = framework.submit_unit(CUD(executable="/bin/touch", arguments=[str(marker)]))
    wait_for(lambda: blocker.state is State.RUNNING, 30, what="blocker running")
    queued.cancel()
    gate.touch()
    assert blocker.wait(30) is State.DONE
    assert queued.state is State.CANCELED
    last = framework.submit_unit(CUD(executable="/bin/true"))
    assert last.wait(30) is State.DONE
    assert not marker.exists()


@pytest.mark.parametrize("bound", [False, True], ids=["late", "early"])
def test_cancel_pilot_requeues_its_units(framework, tmp_path, bound):
    """A unit running on a canceled pilot runs again, to completion, on another pilot."""
    first = running_pilot(framework, 1)
    gate, runs = tmp_path / "gate", tmp_path / "runs"
    u = framework.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"echo run >> {runs}; while [ ! -e {gate} ]; do sleep 0.02; done"]),
        pilot=first if bound else None)
    wait_for(lambda: u.state is State.RUNNING and runs.exists(), 30, what="first attempt")
    assert u.pilot == first.id
    second = running_pilot(framework, 1)
    first.cancel()
    assert first.state is State.CANCELED
    wait_for(lambda: u.state is State.RUNNING and u.pilot == second.id, 30,
             what="second attempt on the other pilot")
    gate.touch()
    assert u.wait(30) is State.DONE
    assert u.pilot == second.id
    assert runs.read_text() == "run\nrun\n"


def test_staging_in_and_out(framework, tmp_path):
    running_pilot(framework, 1)
    src, dst = tmp_path / "input.txt", tmp_path / "results" / "copy.txt"
    src.write_text("payload\n")
    work = tmp_path / "work"
    u = framework.submit_unit(CUD(
        executable="/bin/sh", arguments=["-c", "tr a-z A-Z < in.txt > out.txt"],
        working_directory=str(work), inputs=[f"{src} > in.txt"], outputs=[f"out.txt > {dst}"]))
    assert u.wait(30) is State.DONE
    assert (work / "in.txt").read_text() == "payload\n"
    assert dst.read_text() == "PAYLOAD\n"
    missing = framework.submit_unit(CUD(executable="/bin/true", working_directory=str(work),
                                        inputs=[str(tmp_path / "nope")]))
    assert missing.wait(30) is State.FAILED and "staging in failed" in missing.result.error


def test_walltime_kills_the_unit(framework):
    running_pilot(framework, 1)
    u = framework.submit_unit(CUD(executable="/bin/sleep", arguments=["30"], walltime=0.3))
    assert u.wait(30) is State.FAILED
    assert "walltime" in u.result.error
    assert u.result.end - u.result.start < 30


def test_callbacks_receive_every_state_in_order(framework):
    running_pilot(framework, 1)
    seen: dict[str, list[State]] = {}
    units = []
    for cud in (CUD(executable="/bin/true"), CUD(executable="/bin/false"),
                CUD(function=square, args=(3,))):
        u = troy.ComputeUnit(cud)
        u.add_callback(lambda unit, s: seen.setdefault(unit.id, []).append(s))
        units.append(framework.submit_unit(u))
    for u in units:
        u.wait(30)
    expected = [State.DONE, State.FAILED, State.DONE]
    for u, final in zip(units, expected):
        states = [s for s in seen[u.id] if s is not State.PENDING]
        assert states == [State.DISPATCHED, State.RUNNING, final], (u, seen[u.id])


def test_unit_wider_than_every_pilot_waits_for_one(framework):
    running_pilot(framework, 1)
    u = framework.submit_unit(CUD(executable="/bin/true", cores=2))
    assert u.state in (State.DISPATCHED, State.PENDING)
    running_pilot(framework, 2)
    assert u.wait(30) is State.DONE


def test_close_cancels_what_is_left(framework, tmp_path):
    p = running_pilot(framework, 1)
    u = framework.submit_unit(CUD(executable="/bin/sleep", arguments=["30"]))
    wait_for(lambda: u.state is State.RUNNING, 30, what="unit running")
    framework.close()
    assert u.state is State.CANCELED and p.state is State.CANCELED


@pytest.mark.slow
def test_pilot_walltime_ends_it_done_and_its_units_move(framework, tmp_path):
    gate, runs = tmp_path / "gate", tmp_path / "runs"
    short = framework.submit_pilot(troy.PilotDescription(size=1, walltime=2.0))
    assert short.wait_running(30) is State.RUNNING
    u = framework.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"echo run >> {runs}; while [ ! -e {gate} ]; do sleep 0.02; done"]))
    wait_for(lambda: u.state is State.RUNNING and u.pilot == short.id, 30, what="unit on it")
    spare = running_pilot(framework, 1)
    wait_for(lambda: short.state is State.DONE, 30, what="walltime over")
    wait_for(lambda: u.state is State.RUNNING and u.pilot == spare.id, 30, what="moved")
    gate.touch()
    assert u.wait(30) is State.DONE and runs.read_text() == "run\nrun\n"


def exits() -> None:
    raise SystemExit(3)


def test_callable_calling_sys_exit_fails_only_its_unit(framework):
    running_pilot(framework, 1)
    u = framework.submit_unit(CUD(function=exits))
    assert u.wait(30) is State.FAILED and "SystemExit: 3" in u.result.error
    assert framework.submit_unit(CUD(function=square, args=(2,))).wait(30) is State.DONE


def test_canceled_bundle_stops_before_its_next_member(framework, tmp_path):
    """Broke on local: a canceled bundle started (and killed) each remaining member."""
    running_pilot(framework, 1)
    gate, started = tmp_path / "gate", tmp_path / "started"
    first = CUD(executable="/bin/sh", arguments=[
        "-c", f"touch {started}; while [ ! -e {gate} ]; do sleep 0.02; done"])
    # a started member opens its stdout file, even if it is killed at once
    rest = [CUD(executable="/bin/true", stdout=str(tmp_path / f"m{i}")) for i in range(3)]
    u = framework.submit_unit(CUD(bundle=[first, *rest]))
    wait_for(started.exists, 30, what="first member running")
    u.cancel()
    assert u.state is State.CANCELED
    after = framework.submit_unit(CUD(executable="/bin/true"))  # runs once the bundle let go
    assert after.wait(30) is State.DONE
    assert not any((tmp_path / f"m{i}").exists() for i in range(3))
