"""``troy.WorkloadRun`` (execute_workload on a thread: a future and progress events) and
``Session.resume_workload`` (a dispatched workload rebuilt from the store), on the
``local`` framework with real processes."""
from __future__ import annotations

from pathlib import Path

import pytest

import troy
from troy import State
from troy.errors import DoesNotExist, IncorrectState, NoSuccess
from tests.helpers import wait_for

WAIT = 60


def gated_chain(tmp_path: Path) -> tuple[troy.Workload, Path, Path]:
    """``first`` (records each run in ``ran``), then ``waits`` (until ``gate`` exists)."""
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    w = troy.Workload()
    first = w.add_task({"executable": "/bin/sh", "arguments": ["-c", f"echo x >> {ran}"]},
                       uid="first")
    waits = w.add_task({"executable": "/bin/sh", "arguments": [
        "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]}, uid="waits")
    w.add_relation(troy.Relation(first, waits))
    return w, gate, ran


def test_a_run_gives_every_task_event_and_its_final_state(troy_session, local_fw):
    w = troy.Workload()
    w.add_task({"executable": "/bin/true", "cardinality": 5})
    run = troy.WorkloadRun(troy_session, w, troy.Overlay([{"size": 2}]), bundle=False).start()
    assert len(w.tasks) == 5 and w.state is not State.DESCRIBED  # planned before it starts
    events = list(run.events())
    assert run.done() and run.result() is State.DONE and not run.resumed
    finals = {tid for tid, state in events if state.is_final}
    assert finals == set(w.tasks) and all(isinstance(e, troy.TaskEvent) for e in events)
    assert run.progress() == troy.RunProgress(5, 5, 0, 0, 0)


def test_a_run_without_events_keeps_none(troy_session, local_fw):
    w = troy.Workload()
    w.add_task({"executable": "/bin/true", "cardinality": 3})
    run = troy.WorkloadRun(troy_session, w, troy.Overlay([{"size": 2}]), events=False).start()
    assert run.result(WAIT) is State.DONE and run.progress().done == 3
    with pytest.raises(IncorrectState, match="events=False"):
        next(run.events())


def test_a_run_raises_what_execute_workload_raised(troy_session, local_fw):
    overlay = troy.Overlay([{"size": 1}])
    overlay.cancel()                     # its pilots are gone: execute_workload refuses
    w = troy.Workload()
    w.add_task({"executable": "/bin/true"})
    run = troy.WorkloadRun(troy_session, w, overlay).start()
    assert list(run.events()) == [] and run.wait(WAIT)
    assert isinstance(run.exception(), IncorrectState)
    with pytest.raises(IncorrectState, match="describe a new overlay"):
        run.result()


def test_a_run_past_its_timeout_raises_no_success_and_the_tasks_go_on(troy_session,
                                                                     local_fw, tmp_path):
    w, gate, _ = gated_chain(tmp_path)
    run = troy.WorkloadRun(troy_session, w, troy.Overlay([{"size": 1}]), timeout=0.5).start()
    with pytest.raises(NoSuccess, match="not finished after"):
        run.result(WAIT)
    assert not w.finished
    gate.touch()
    assert w.wait(WAIT) is State.DONE


def test_resume_workload_rebuilds_the_store_s_last_workload(tmp_path):
    store = tmp_path / "troy.sqlite"
    with troy.Session(store_path=store) as s:
        with pytest.raises(DoesNotExist, match="holds no dispatched workload"):
            s.resume_workload()
        s.add_framework("local", sandbox=str(tmp_path))
        w = troy.Workload()
        w.add_task({"executable": "/bin/true", "cardinality": 3})
        assert troy.execute_workload(s, w, troy.Overlay([{"size": 2}])) is State.DONE
    with troy.Session(store_path=store) as again:
        rebuilt = again.resume_workload()
        assert rebuilt.id == w.id and set(rebuilt.tasks) == set(w.tasks)
        assert rebuilt.state is State.DONE and again.workloads[w.id] is rebuilt
        assert again.resume_workload(w.id) is rebuilt      # once
        with pytest.raises(DoesNotExist, match="no dispatched workload 'nope'"):
            again.resume_workload("nope")


def test_a_run_of_a_resumed_workload_runs_only_what_had_not_ended(tmp_path):
    """The workload of a session stopped mid-way (``close(keep_unfinished=True)``, as
    ``troy run`` and ``elasticslice run`` do) goes on in a new session: what ended is not
    run again."""
    store = tmp_path / "troy.sqlite"
    w, gate, ran = gated_chain(tmp_path)
    s = troy.Session(store_path=store)
    s.add_framework("local", sandbox=str(tmp_path))
    first = troy.WorkloadRun(s, w, troy.Overlay([{"size": 1}])).start()
    wait_for(lambda: w.tasks["waits"].state is State.RUNNING, WAIT, what="the second task")
    s.close(keep_unfinished=True)
    assert first.wait(WAIT)
    with troy.Session(store_path=store) as again:
        again.add_framework("local", sandbox=str(tmp_path))
        rebuilt = again.resume_workload()
        assert rebuilt.tasks["first"].state is State.DONE
        assert rebuilt.tasks["waits"].state is not State.CANCELED   # left unfinished
        run = troy.WorkloadRun(again, rebuilt, troy.Overlay([{"size": 1}])).start()
        assert run.resumed
        events = run.events()
        assert next(events) == ("first", State.DONE)        # ended before: said first
        wait_for(lambda: rebuilt.tasks["waits"].state is State.RUNNING, WAIT,
                 what="the second task running again")
        gate.touch()
        assert run.result(WAIT) is State.DONE
    assert ran.read_text() == "x\n"                        # the first task ran once


def test_run_numbers_are_checked() -> None:
    from troy.runs import run_numbers_problem
    assert run_numbers_problem(1.0, None) is None
    assert "--time-scale" in run_numbers_problem(float("nan"), None)
    assert "--timeout" in run_numbers_problem(1.0, 0)
