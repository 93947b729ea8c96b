"""UnitService across frameworks: the contract snippet, schedulers, queuing, NoSuccess."""
from __future__ import annotations

import pytest

import troy
from tests.helpers import wait_for
from troy import ComputeUnitDescription as CUD
from troy import PilotDescription, State
from troy.errors import BadParameter, DoesNotExist, NoSuccess
from troy.schedulers import BaseScheduler, get_scheduler, known_schedulers


def test_python_contract_on_local(tmp_path):
    s = troy.Session(store_path=tmp_path / "s.sqlite")
    fw = s.add_framework("local", name="big")
    p = fw.submit_pilot(troy.PilotDescription(size=32))
    us = s.unit_service(scheduler="first_fit")
    u = us.submit_unit(troy.ComputeUnitDescription(executable="/bin/true", cores=32))
    us.wait_units()
    assert u.state is troy.State.DONE
    assert (u.framework, u.pilot) == ("big", p.id)
    s.close()
    s.close()  # idempotent


def _use_case_b(session: troy.Session, scheduler: str) -> None:
    """Seed 003, example (B): 32 one-core pilots in "small", one 32-core pilot in "big"."""
    small = session.add_framework("local", name="small")
    big = session.add_framework("local", name="big")
    for _ in range(32):
        small.submit_pilot(PilotDescription(size=1))
    big_pilot = big.submit_pilot(PilotDescription(size=32))
    us = session.unit_service(scheduler=scheduler)
    mpi = us.submit_unit(CUD(executable="/bin/sleep", arguments=["0.5"], cores=32))
    wait_for(lambda: mpi.state is State.RUNNING, 10, what="the 32-core unit running")
    singles = us.submit_units([CUD(executable="/bin/true") for _ in range(4)])
    us.wait_units(timeout=30)
    assert mpi.state is State.DONE
    assert (mpi.framework, mpi.pilot) == ("big", big_pilot.id)
    small_ids = {p.id for p in small.list_pilots()}
    for u in singles:
        assert u.state is State.DONE
        assert u.framework == "small" and u.pilot in small_ids


@pytest.mark.parametrize("scheduler", ["seed003", "first_fit", "backfill"])
def test_use_case_b(troy_session, scheduler):
    _use_case_b(troy_session, scheduler)


def test_seed003_scheduler_uses_the_public_api_only():
    import inspect

    import troy.schedulers.seed003 as mod
    code = inspect.getsource(mod.Seed003Scheduler)
    assert "._" not in code  # no private attribute of anything


def test_units_queue_until_a_pilot_appears(troy_session):
    fw = troy_session.add_framework("local")
    us = troy_session.unit_service(scheduler="first_fit")
    u = us.submit_unit(CUD(executable="/bin/true", cores=2))
    assert u.state is State.PENDING
    fw.submit_pilot(PilotDescription(size=1))
    assert u.wait(0.3) is State.PENDING  # too narrow: still queued in the service
    p = fw.submit_pilot(PilotDescription(size=2))
    assert u.wait(10) is State.DONE and u.pilot == p.id


def test_units_queue_until_a_framework_appears(troy_session):
    us = troy_session.unit_service(scheduler="round_robin")
    u = us.submit_unit({"executable": "/bin/true"})
    fw = troy_session.add_framework("local", name="late")
    fw.submit_pilot({"size": 1})
    assert u.wait(10) is State.DONE and u.framework == "late"


def test_no_success_when_told_not_to_wait(local_fw, troy_session):
    us = troy_session.unit_service(scheduler="first_fit", wait=False)
    with pytest.raises(NoSuccess, match="no suitable pilot"):
        us.submit_unit(CUD(executable="/bin/true", cores=64))
    assert us.submit_unit(CUD(executable="/bin/true")).wait(10) is State.DONE


def test_first_fit_keeps_submission_order(troy_session, tmp_path):
    fw = troy_session.add_framework("local")
    fw.submit_pilot(PilotDescription(size=2))
    log = tmp_path / "order"
    us = troy_session.unit_service(scheduler="first_fit")
    units = [us.submit_unit(CUD(executable="/bin/sh", cores=c,
                                arguments=["-c", f"echo {i} >> {log}; sleep 0.05"]))
             for i, c in enumerate([1, 2, 1])]
    us.wait_units(timeout=30)
    assert all(u.state is State.DONE for u in units)
    # the 2-core unit waits for the pilot to empty; the last 1-core unit waits behind it
    assert log.read_text().split() == ["0", "1", "2"]


def test_backfill_lets_small_units_pass_a_waiting_wide_one(troy_session, tmp_path):
    fw = troy_session.add_framework("local")
    fw.submit_pilot(PilotDescription(size=2))
    gate = tmp_path / "gate"
    us = troy_session.unit_service(scheduler="backfill")
    blocker = us.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]))
    wait_for(lambda: blocker.state is State.RUNNING, 10, what="blocker running")
    wide = us.submit_unit(CUD(executable="/bin/true", cores=2))
    small = us.submit_unit(CUD(executable="/bin/true"))
    assert small.wait(10) is State.DONE
    assert wide.state is State.PENDING
    gate.touch()
    assert wide.wait(10) is State.DONE


def test_a_full_framework_scope_does_not_hold_back_units_of_another(troy_session, tmp_path):
    """Units that may only use framework "a" wait while it is full; a unit that may use
    any framework, queued behind them, runs on "b" meanwhile (with a scheduler that need
    not keep submission order)."""
    for name in ("a", "b"):
        troy_session.add_framework("local", name=name).submit_pilot({"size": 1})
    gate = tmp_path / "gate"
    us = troy_session.unit_service(scheduler="backfill")
    blocker, waiting = us.submit_units([CUD(executable="/bin/sh", arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]) for _ in range(2)],
        frameworks=["a"])
    try:
        wait_for(lambda: blocker.state is State.RUNNING, 10, what="blocker running")
        anywhere = us.submit_unit(CUD(executable="/bin/true"))
        assert anywhere.wait(10) is State.DONE and anywhere.framework == "b"
        assert waiting.state is State.PENDING
    finally:
        gate.touch()
    assert waiting.wait(10) is State.DONE and waiting.framework == "a"


def test_round_robin_alternates_frameworks(troy_session):
    for name in ("a", "b"):
        troy_session.add_framework("local", name=name).submit_pilot({"size": 2})
    us = troy_session.unit_service(scheduler="round_robin")
    units = us.submit_units([{"executable": "/bin/true"} for _ in range(4)])
    us.wait_units(timeout=30)
    assert sorted(u.framework for u in units) == ["a", "a", "b", "b"]


def test_early_binding_service_names_the_pilot(troy_session):
    fw = troy_session.add_framework("local")
    fw.submit_pilot({"size": 1})
    wide = fw.submit_pilot({"size": 4})
    us = troy_session.unit_service(scheduler="backfill", early_binding=True)
    u = us.submit_unit(CUD(executable="/bin/true", cores=3))
    assert u.wait(10) is State.DONE and u.pilot == wide.id
    target = fw.submit_pilot({"size": 4})
    v = us.submit_unit(CUD(executable="/bin/true"), pilot=target.id)
    assert v.wait(10) is State.DONE and v.pilot == target.id


class OnlyNamed(BaseScheduler):
    """A user scheduler: units tagged "b" go to framework "b", others nowhere."""

    name = "only_named"

    def schedule(self, unit_service, cud):
        if cud.tag is None:
            return None
        return unit_service.get_framework(cud.tag), None


def test_user_scheduler_by_class(troy_session):
    for name in ("a", "b"):
        troy_session.add_framework("local", name=name).submit_pilot({"size": 1})
    us = troy_session.unit_service(scheduler=OnlyNamed)
    u = us.submit_unit(CUD(executable="/bin/true", tag="b"))
    stuck = us.submit_unit(CUD(executable="/bin/true"))
    assert u.wait(10) is State.DONE and u.framework == "b"
    assert stuck.state is State.PENDING
    us.cancel_units([stuck])
    assert stuck.state is State.CANCELED


def test_scheduler_registry_checks_the_base_class():
    assert {"round_robin", "first_fit", "backfill", "seed003"} <= set(known_schedulers())
    with pytest.raises(BadParameter, match="unknown scheduler 'nope'"):
        get_scheduler("nope")
    with pytest.raises(BadParameter, match="not a BaseScheduler"):
        get_scheduler(dict)


def test_get_framework_and_listing(troy_session, local_fw):
    us = troy_session.unit_service()
    assert us.list_pilot_frameworks() == [local_fw]
    assert us.get_framework("local") is local_fw
    with pytest.raises(DoesNotExist, match="no pilot framework named 'x'"):
        us.get_framework("x")
    with pytest.raises(BadParameter, match="already exists"):
        troy_session.add_framework("local", name="local")
    assert troy_session.add_framework("local").name == "local.2"


def test_every_unit_and_state_is_recorded(troy_session, local_fw):
    us = troy_session.unit_service()
    ok = us.submit_unit(CUD(executable="/bin/true"))
    bad = us.submit_unit(CUD(executable="/bin/false"))
    us.wait_units(timeout=10)
    troy_session.store.flush()
    recs = {r.id: r for r in troy_session.store.units()}
    assert recs[ok.id].state is State.DONE and recs[ok.id].exit_code == 0
    assert recs[bad.id].state is State.FAILED and recs[bad.id].exit_code == 1
    assert recs[ok.id].framework == "local" and recs[ok.id].pilot == ok.pilot


def test_cancel_units_cancels_everything_not_final(troy_session, local_fw):
    us = troy_session.unit_service()
    units = us.submit_units([CUD(executable="/bin/sleep", arguments=["30"])
                             for _ in range(6)])
    wait_for(lambda: sum(u.state is State.RUNNING for u in units) == 4, 10,
             what="four units running")
    us.cancel_units()
    assert us.wait_units(timeout=10) == [State.CANCELED] * 6


class TooNarrow(BaseScheduler):
    """A faulty user scheduler: binds every unit to the narrowest pilot."""

    name = "too_narrow"

    def schedule(self, unit_service, cud):
        fw = unit_service.list_pilot_frameworks()[0]
        return fw, min(fw.list_pilots(), key=lambda p: p.size)


def test_a_unit_the_framework_refuses_fails_with_the_reason(troy_session):
    fw = troy_session.add_framework("local")
    fw.submit_pilot({"size": 1})
    us = troy_session.unit_service(scheduler=TooNarrow)
    u = us.submit_unit(CUD(executable="/bin/true", cores=2))
    assert u.wait(10) is State.FAILED
    assert "refused" in u.result.error and "needs 2 cores" in u.result.error


def test_a_task_that_ends_finds_its_unit_s_end_queued_for_the_store(troy_session, local_fw):
    """What broke (``troy run --store`` resumed, then run again: "resuming: 6/7 tasks
    already done"): a task heard of its unit's end before the store did, so a run woken by
    its last task closed the store before that unit's DONE was queued, and lost it."""
    seen: list[str] = []

    def on_task(task: troy.Task, state: State) -> None:
        if state.is_final:
            troy_session.store.flush()
            seen.extend(r.state.value for r in troy_session.store.units()
                        if task.id in r.task_ids)

    w = troy.Workload()
    w.add_task({"executable": "/bin/true"}, uid="one")
    troy.Planner(troy_session).plan(w)
    w.tasks["one"].add_callback(on_task)
    assert troy.execute_workload(troy_session, w, troy.Overlay([{"size": 1}])) is State.DONE
    assert seen == ["DONE"]


@pytest.mark.parametrize("bundle", [False, "auto"])
def test_a_done_workload_let_go_is_freed_while_the_session_keeps_its_units(
        troy_session, local_fw, bundle) -> None:
    """What leaked: the unit service keeps every unit for ``list_units()`` and the manager
    every plan for ``units()``; each unit kept its callbacks, which held its tasks, and each
    plan its workload: a session running workload after workload grew by all of them
    (70,000 objects a 5,000-task workload). A final unit now lets its callbacks go and the
    manager a final workload; the units stay, with their results."""
    import gc
    import weakref
    w = troy.Workload()
    w.add_task([{"executable": "/bin/true", "runtime": 0.001}] * 6)
    task = next(iter(w.tasks.values()))
    refs = [weakref.ref(w), weakref.ref(task)]
    seen: list[State] = []
    task.add_callback(lambda t, state: seen.append(state))
    us = troy_session.unit_service()
    manager = troy.WorkloadManager(troy_session, unit_service=us, bundle=bundle)
    assert troy.execute_workload(troy_session, w, troy.Overlay([{"size": 1}]),
                                 manager=manager) is State.DONE
    assert seen[-1] is State.DONE   # the callbacks ran to the end first
    unit_ids = {u.id for u in task.units}
    wid, plan_units = w.id, manager.units(w)
    del w, task
    gc.collect()
    assert [r() for r in refs] == [None, None]
    kept = [u for u in us.list_units() if u.id in unit_ids]
    assert kept and all(u.state is State.DONE and u.result.ok for u in kept)
    assert [u.id for u in manager.units(troy.Workload(uid=wid))] == \
        [u.id for u in plan_units]


def test_the_demand_counts_live_units_and_those_done_from_the_service_s_own_books(
        troy_session, local_fw) -> None:
    """The session's demand (read every manager cycle) comes from each service's live units
    and its count of those DONE, not from every unit it ever ran: the same figures."""
    us = troy_session.unit_service()
    quick = us.submit_units([CUD(executable="/bin/true")] * 5 + [CUD(executable="/bin/false")])
    assert us.wait_units(quick, timeout=30) == [State.DONE] * 5 + [State.FAILED]
    slow = us.submit_unit(CUD(executable="/bin/sleep", arguments=["30"]))
    wait_for(lambda: slow.state is State.RUNNING, 30, what="the slow unit running")
    demand = troy_session.demand()
    assert (demand.units_done, demand.units_running, demand.units_queued) == (5, 1, 0)
    assert us.live_units() == [slow] and us.units_done == 5
    us.cancel_units([slow])
    assert slow.wait(30) is State.CANCELED
    demand = troy_session.demand()   # (broke: the framework still listed it, as queued)
    assert (demand.units_done, demand.units_running, demand.cores) == (5, 0, 0)
    assert us.live_units() == [] and len(us.list_units()) == 7
