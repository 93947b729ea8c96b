"""The drain contract (``PilotFramework.drain_pilot``, one template for every framework), run
on ``local`` and ``dask`` like the rest of the framework contract (test_contract.py).

Units wait on gate files, so what a test checks never depends on how fast the machine is;
deadlines are absolute (epoch seconds), as a revocation notice gives them."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import troy
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.states import FINAL_STATES
from tests.helpers import holds_for, processes_of, wait_for
from tests.troy.frameworks.nodes import running_pilot

WAIT = 60


def gated(gate: Path, hint: float) -> CUD:
    """A one-core unit that runs until ``gate`` exists; ``hint``: its runtime hint."""
    return CUD(executable="/bin/sh", runtime=hint, arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])


def running_on(unit: troy.ComputeUnit, pilot: troy.Pilot) -> bool:
    return unit.state is State.RUNNING and unit.pilot == pilot.id


def test_a_drain_keeps_what_ends_in_time_and_requeues_the_rest(framework, tmp_path):
    a = running_pilot(framework, 2)
    gate = tmp_path / "gate"
    short = framework.submit_unit(gated(gate, 1), pilot=a)
    long = framework.submit_unit(gated(gate, 600), pilot=a)
    wait_for(lambda: running_on(short, a) and running_on(long, a), WAIT, what="both on a")
    b = running_pilot(framework, 2)
    emptied: list[troy.Pilot] = []
    plan = framework.drain_pilot(a, time.time() + 300, margin=5, on_empty=emptied.append)
    assert plan.kept == [short.id] and plan.requeued == [long.id]
    assert plan.dispatch_stopped_at is not None and framework.drain_plan(a) is plan
    assert a.draining and a.free_cores == 0
    wait_for(lambda: running_on(long, b), WAIT, what="the long unit running on b")
    gate.touch()
    assert short.wait(WAIT) is State.DONE and short.pilot == a.id and short.attempts == 1
    assert long.wait(WAIT) is State.DONE and long.pilot == b.id and long.attempts == 2
    wait_for(lambda: emptied == [a], WAIT, what="on_empty")
    assert a.state is State.RUNNING and not a.busy
    stats = framework.unit_stats()
    assert stats.requeued == 1 and stats.lost == 0


def test_a_second_drain_with_an_earlier_deadline_keeps_on_empty_and_decides_again(
        framework, tmp_path):
    """Broke on ``local``: a second drain with an earlier deadline dropped its on_empty (the
    ``dask`` copy of the drain kept it)."""
    a = running_pilot(framework, 2)
    gate = tmp_path / "gate"
    slow = framework.submit_unit(gated(gate, 100), pilot=a)
    quick = framework.submit_unit(gated(gate, 1), pilot=a)
    wait_for(lambda: running_on(slow, a) and running_on(quick, a), WAIT, what="both on a")
    b = running_pilot(framework, 2)
    first: list[troy.Pilot] = []
    second: list[troy.Pilot] = []
    far = time.time() + 600
    plan = framework.drain_pilot(a, far, margin=5, on_empty=first.append)
    assert plan.kept == sorted([slow.id, quick.id]) and plan.requeued == []
    near = time.time() + 60    # the notice's countdown: now only 60 s are left
    again = framework.drain_pilot(a, near, margin=5, on_empty=second.append)
    assert again is plan and plan.deadline == near
    assert plan.requeued == [slow.id] and plan.kept == [quick.id]
    later = framework.drain_pilot(a, far + 600, margin=1)   # never pushed back
    assert later is plan and (plan.deadline, plan.margin) == (near, 5)
    wait_for(lambda: running_on(slow, b), WAIT, what="the slow unit running on b")
    gate.touch()
    assert quick.wait(WAIT) is State.DONE and quick.pilot == a.id
    assert slow.wait(WAIT) is State.DONE and slow.pilot == b.id
    wait_for(lambda: first == [a] and second == [a], WAIT, what="both on_empty called")


def test_no_new_unit_reaches_a_draining_pilot(framework):
    """Broke on ``local``: a unit bound early to a draining pilot waited for it forever."""
    a, b = running_pilot(framework, 1), running_pilot(framework, 1)
    emptied = threading.Event()
    plan = framework.drain_pilot(a, None, on_empty=lambda p: emptied.set())
    assert emptied.wait(WAIT) and plan.kept == plan.requeued == []
    late = [framework.submit_unit(CUD(executable="/bin/true")) for _ in range(6)]
    early = [framework.submit_unit(CUD(executable="/bin/true"), pilot=a) for _ in range(2)]
    assert [u.wait(WAIT) for u in late + early] == [State.DONE] * 8
    assert {u.pilot for u in late + early} == {b.id}


def test_the_watchdog_requeues_what_still_runs_at_deadline_minus_margin(framework, tmp_path):
    marker = tmp_path / "first-attempt"
    # its hint says it ends at once; its first attempt overruns, the second ends at once
    stubborn = CUD(executable="/bin/sh", runtime=1, arguments=[
        "-c", f"[ -e {marker} ] && exit 0; touch {marker}; sleep 600"])
    a = running_pilot(framework, 1)
    u = framework.submit_unit(stubborn, pilot=a)
    wait_for(lambda: running_on(u, a) and marker.exists(), WAIT, what="the unit running")
    b = running_pilot(framework, 1)
    emptied: list[troy.Pilot] = []
    plan = framework.drain_pilot(a, time.time() + 4, margin=2, on_empty=emptied.append)
    assert plan.kept == [u.id] and plan.requeued == []
    assert u.wait(WAIT) is State.DONE and u.pilot == b.id and u.attempts == 2
    assert plan.late_requeued == [u.id] and plan.kept == []
    wait_for(lambda: emptied == [a], WAIT, what="on_empty")
    assert framework.unit_stats().lost == 0


def test_a_unit_canceled_on_a_draining_pilot_lets_it_empty_and_leaves_no_process(
        framework, tmp_path):
    """Broke on ``dask``: a canceled unit stayed in the drain's count, so on_empty never
    came. Its process (gated on a file nobody makes: it never ends by itself) outlived its
    pilot once: a canceled unit's processes are killed, and none is left once the pilot is
    gone (checked in ``/proc``)."""
    a = running_pilot(framework, 1)
    gate = tmp_path / "gate"
    u = framework.submit_unit(gated(gate, 1), pilot=a)
    wait_for(lambda: running_on(u, a), WAIT, what="the unit running")
    sessions = set(wait_for(lambda: processes_of(str(gate)), WAIT, what="its process"))
    emptied: list[troy.Pilot] = []
    plan = framework.drain_pilot(a, None, on_empty=emptied.append)
    assert plan.kept == [u.id]
    u.cancel()
    wait_for(lambda: emptied == [a], WAIT, what="on_empty")
    wait_for(lambda: not processes_of(str(gate), sessions), WAIT,
             what="the canceled unit's processes killed")
    framework.cancel_pilot(a.id)
    wait_for(lambda: a.state in FINAL_STATES, WAIT, what="the pilot gone")
    holds_for(lambda: not processes_of(str(gate), sessions), 0.5)


def test_units_canceled_at_any_moment_leave_no_process_once_their_pilot_is_gone(
        framework, tmp_path):
    """Units canceled while queued, while being handed to the pilot, just started or running
    (each gated on a file nobody makes): once the pilot is gone, no process of any is left."""
    a = running_pilot(framework, 2)
    marker = str(tmp_path / "never")
    units = []
    for i in range(24):
        units.append(framework.submit_unit(gated(Path(f"{marker}-{i}"), 1), pilot=a))
        if i % 3 == 0:
            units[-1].cancel()          # at once: queued, or being dispatched
        elif i % 3 == 1:
            time.sleep(0.005 * (i % 7))  # in flight: maybe starting on the pilot
            units[-1].cancel()
    # (a canceled unit's process left running holds its core: then this never comes)
    try:
        wait_for(lambda: sum(u.state is State.RUNNING for u in units) == 2, WAIT,
                 what="two units running")
    except pytest.fail.Exception:
        pytest.fail(f"not two units running; states {[u.state.name for u in units]}, "
                    f"processes {sorted(processes_of(marker).values())}")
    for u in units:
        u.cancel()
    assert {u.state for u in units} == {State.CANCELED}
    wait_for(lambda: not processes_of(marker), WAIT, what="every canceled unit's process killed")
    framework.cancel_pilot(a.id)
    wait_for(lambda: a.state in FINAL_STATES, WAIT, what="the pilot gone")
    holds_for(lambda: not processes_of(marker), 0.5)


def test_a_pilot_lost_while_draining_requeues_its_units_and_never_calls_on_empty(
        framework, tmp_path):
    a = running_pilot(framework, 1)
    gate = tmp_path / "gate"
    u = framework.submit_unit(gated(gate, 1), pilot=a)
    wait_for(lambda: running_on(u, a), WAIT, what="the unit running")
    b = running_pilot(framework, 1)
    emptied: list[troy.Pilot] = []
    framework.drain_pilot(a, time.time() + 300, margin=5, on_empty=emptied.append)
    assert [m.id for m in framework.lose_pilot(a, "machine gone")] == [u.id]
    assert a.state is State.FAILED
    wait_for(lambda: running_on(u, b), WAIT, what="the unit running on b")
    gate.touch()
    assert u.wait(WAIT) is State.DONE
    framework.drain_pilot(a, time.time() + 10, on_empty=emptied.append)  # too late
    holds_for(lambda: not emptied, 0.5)
    assert framework.unit_stats().lost == 0


def test_retire_lets_a_drained_pilot_leave_and_loses_nothing(framework, tmp_path):
    """``PilotFramework.retire`` is on the contract (the elastic manager reached Dask's
    ``retire_worker`` through ``getattr`` once): True for a drained pilot; on ``local``
    (the base's) it has nothing to finish, on ``dask`` its worker leaves and the pilot ends
    DONE, not FAILED; the other pilots run on."""
    a, b = running_pilot(framework, 1), running_pilot(framework, 1)
    gate = tmp_path / "gate"
    u = framework.submit_unit(gated(gate, 1), pilot=a)
    wait_for(lambda: running_on(u, a), WAIT, what="the unit running")
    emptied = threading.Event()
    framework.drain_pilot(a, time.time() + 300, margin=5, on_empty=lambda p: emptied.set())
    gate.touch()
    assert u.wait(WAIT) is State.DONE and emptied.wait(WAIT)
    assert framework.retire(a, time.time() + WAIT) is True
    if framework.kind == "dask":
        wait_for(lambda: a.state is State.DONE, WAIT, what="the retired pilot DONE")
    else:
        assert a.state is State.RUNNING and a.draining
    v = framework.submit_unit(CUD(executable="/bin/true"))
    assert v.wait(WAIT) is State.DONE and v.pilot == b.id
    assert framework.unit_stats().lost == 0


@pytest.mark.parametrize("deadline, margin, says", [
    (float("nan"), 5.0, "deadline"), ("soon", 5.0, "deadline"), (None, -1.0, "margin"),
    (None, True, "margin")])
def test_bad_drain_numbers_are_named(framework, deadline, margin, says):
    a = running_pilot(framework, 1)
    with pytest.raises(troy.BadParameter, match=f"drain_pilot {says}"):
        framework.drain_pilot(a, deadline, margin=margin)
    assert not a.draining
