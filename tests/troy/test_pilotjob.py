"""The classic P* API (seed 002) over local and Dask pilots."""
from __future__ import annotations

import threading

import pytest

from tests.helpers import wait_for
from troy import BadParameter, DoesNotExist, NoSuccess, State
from troy.frameworks.dask import DaskFramework
from troy.pilotjob import (Callback, PilotJobDescription, PilotJobService, PilotJobType,
                           WorkUnitDescription, WorkUnitService)


@pytest.fixture(scope="module")
def dask_url():
    host = DaskFramework("pj-scheduler-host")
    host.start()
    yield host.scheduler_address.replace("tcp://", "dask://")
    host.close()


@pytest.fixture
def pjs():
    s = PilotJobService()
    yield s
    s.cancel()


def pjd(cores: int, **slots) -> PilotJobDescription:
    d = PilotJobDescription()
    d.total_cpu_count = cores  # the seed's style: slots set one by one
    for k, v in slots.items():
        setattr(d, k, v)
    return d


class Recorder(Callback):
    def __init__(self, keep: bool = True) -> None:
        self.seen: list[tuple[str, object]] = []
        self.keep = keep
        self.lock = threading.Lock()

    def cb(self, obj, member, value):
        with self.lock:
            self.seen.append((member, value))
        return self.keep


@pytest.mark.parametrize("rm", ["local://localhost", "dask"])
def test_pilot_job_runs_work_units(pjs, rm, dask_url, tmp_path):
    rm = dask_url if rm == "dask" else rm
    pj = pjs.create(rm, pjd(2))
    assert pj.rm == rm and pj.description.total_cpu_count == 2
    assert pj.pj_type is (PilotJobType.DASK if rm.startswith("dask") else PilotJobType.LOCAL)
    assert pj.wait(30) is State.RUNNING and pj.state is State.RUNNING
    assert "running" in pj.state_detail
    wus = WorkUnitService()
    wus.add(pjs)
    out = tmp_path / "out.txt"
    wud = WorkUnitDescription()
    wud.executable = "/bin/echo"
    wud.arguments = ["hello"]
    wud.output = str(out)
    wu = wus.submit(wud)
    failing = wus.submit({"executable": "/bin/sh", "arguments": ["-c", "exit 4"]})
    assert wu.wait(30) is State.DONE and out.read_text() == "hello\n"
    assert wu.state_detail == "exit status 0"
    assert failing.wait(30) is State.FAILED and failing.state_detail == "exit status 4"
    assert wus.work_units == [wu, failing]
    wus.cancel()


def test_callbacks_on_state_and_state_detail(pjs, tmp_path):
    pj = pjs.create("local://localhost", pjd(1))
    pj.wait(10)
    wus = WorkUnitService()
    wus.add(pjs)
    states, details = Recorder(), Recorder(keep=False)
    gate = tmp_path / "gate"
    wud = WorkUnitDescription(executable="/bin/sh",
                              arguments=["-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])
    wu = wus.submit(wud)
    wait_for(lambda: wu.state is State.RUNNING, 10, what="running")
    wu.set_callback("state", states)
    wu.set_callback("state_detail", details)
    gate.touch()
    assert wu.wait(10) is State.DONE
    assert states.seen == [("state", State.DONE)]
    assert details.seen == [("state_detail", "exit status 0")]
    assert "state_detail" not in wu._cbs  # it returned False: removed
    pj_seen = []
    pj.set_callback("state", lambda obj, member, value: pj_seen.append(value))
    pj.cancel()
    assert pj.state is State.CANCELED and pj_seen == [State.CANCELED]
    with pytest.raises(BadParameter, match="member must be one of"):
        pj.set_callback("colour", states)


def test_unset_callback_stops_calls(pjs):
    pjs.create("local://localhost", pjd(1)).wait(10)
    wus = WorkUnitService()
    wus.add(pjs)
    rec = Recorder()
    wu = wus.submit({"executable": "/bin/sleep", "arguments": ["0.2"]})
    wu.set_callback("state", rec)
    wu.unset_callback("state")
    wu.wait(10)
    assert rec.seen == []


def test_cancel_work_unit_and_service(pjs, tmp_path):
    pjs.create("local://localhost", pjd(1)).wait(10)
    wus = WorkUnitService()
    wus.add(pjs)
    wu = wus.submit({"executable": "/bin/sleep", "arguments": ["30"]})
    wait_for(lambda: wu.state is State.RUNNING, 10, what="running")
    wu.cancel()
    assert wu.state is State.CANCELED
    more = [wus.submit({"executable": "/bin/sleep", "arguments": ["30"]}) for _ in range(2)]
    wus.cancel()
    assert [u.state for u in more] == [State.CANCELED] * 2


def test_work_unit_service_wait_timeout_is_overall_not_per_unit(pjs):
    """Broke: wait(timeout) waited up to ``timeout`` for each unit in turn (20 units that
    never end: 20 x 0.5 s = 10 s); the timeout bounds the whole wait: once the first unit
    used it up, the others are given nothing more."""
    pjs.create("local://localhost", pjd(1)).wait(10)
    wus = WorkUnitService()
    wus.add(pjs)
    units = [wus.submit({"executable": "/bin/sleep", "arguments": ["60"]}) for _ in range(20)]
    given: list[float | None] = []
    for wu in units:
        def wait(timeout=None, _inner=wu.wait):  # noqa: ANN001, ANN202 - what each is given
            given.append(timeout)
            return _inner(timeout)
        wu.wait = wait
    try:
        wus.wait(timeout=0.5)
        assert len(given) == 20 and 0 < given[0] <= 0.5
        assert given[1:] == [0.0] * 19, given
        assert all(u.state not in (State.DONE, State.FAILED) for u in units)
    finally:
        wus.cancel()


def test_reinitialize_replaces_the_pilot(pjs):
    pj = pjs.create("local://localhost", pjd(1))
    pj.wait(10)
    first = pj.pilot
    pj.reinitialize(pjd(3))
    assert pj.wait(10) is State.RUNNING and pj.pilot is not first
    assert pj.pilot.size == 3 and first.state is State.CANCELED


def test_descriptions_map_onto_troy(tmp_path):
    d = pjd(4, wall_time_limit=2, queue="batch")
    pd = d.to_pilot_description("local")
    assert pd.size == 4 and pd.walltime == 120
    w = WorkUnitDescription(executable="/bin/cat", number_of_processes=2, input="in",
                            error="err", file_transfer=["a > b", "c < d"],
                            wall_time_limit=0.5, environment={"X": "1"})
    cud = w.to_unit_description()
    assert (cud.cores, cud.stdin, cud.stderr, cud.walltime) == (2, "in", "err", 30)
    assert cud.inputs == ["a > b"] and cud.outputs == ["d > c"]
    assert cud.environment == {"X": "1"}
    with pytest.raises(AttributeError):
        d.total_cpu_cont = 3  # a typo in a slot name is caught (slots, as in the seed)
    with pytest.raises(BadParameter, match="unknown slot"):
        WorkUnitDescription.coerce({"exe": "/bin/true"})


@pytest.mark.parametrize("rm, message", [
    ("ftp://x", "unknown scheme 'ftp'"),
    ("dask://example.org", "give the scheduler's port"),
    ("local://elsewhere", "localhost only"),
])
def test_bad_resource_manager_urls(pjs, rm, message):
    with pytest.raises(BadParameter, match=message):
        pjs.create(rm, pjd(1))


def test_no_suitable_pilot_and_reconnect(pjs):
    pjs.create("local://localhost", pjd(1)).wait(10)
    wus = WorkUnitService()
    wus.add(pjs)
    with pytest.raises(NoSuccess, match="no suitable pilot"):
        wus.submit({"executable": "/bin/true", "total_cpu_count": 8})
    assert PilotJobService(pjs.id) is pjs and WorkUnitService(wus.id) is wus
    with pytest.raises(DoesNotExist):
        PilotJobService("pjs.nope")
    wus.remove(pjs)
    with pytest.raises(Exception, match="no pilot job service"):
        wus.submit({"executable": "/bin/true"})


@pytest.mark.slow
def test_dask_localhost_starts_its_own_scheduler(pjs, tmp_path, monkeypatch):
    """Broke: a relative ``output`` landed in the Dask framework's temporary sandbox (gone
    on cancel), not where the user submitted from, as it does on local pilots."""
    monkeypatch.chdir(tmp_path)
    pj = pjs.create("dask://localhost", pjd(1), pj_type=PilotJobType.DASK)
    assert pj.wait(30) is State.RUNNING
    assert pj.framework.scheduler_address.startswith("tcp://127.0.0.1:")
    wus = WorkUnitService()
    wus.add(pjs)
    assert wus.submit({"executable": "/bin/echo", "arguments": ["hi"],
                       "output": "hello.txt"}).wait(30) is State.DONE
    assert (tmp_path / "hello.txt").read_text() == "hi\n"
    with pytest.raises(BadParameter, match="does not match"):
        pjs.create("local://localhost", pjd(1), pj_type=PilotJobType.DASK)
