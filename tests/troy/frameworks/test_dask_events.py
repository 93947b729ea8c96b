"""How the Dask framework learns of its units' states: workers send their events in
batches (one message per loop turn), futures are watched without a callback thread, and
every unit of a burst still passes DISPATCHED, RUNNING and its final state in order,
whichever way its outcome arrives (its ``end`` event, which carries every result as data,
or a task that errs inside Dask)."""
from __future__ import annotations

import logging
import time

import pytest

import troy
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask import DaskFramework, agent
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import running_pilot

pytestmark = pytest.mark.slow


def big_value() -> str:
    return "x" * 100_000  # carried in the ``end`` event, as every result (data, never a pickle)


def not_data() -> object:
    return {1, 2}   # a set: not data a unit on a pilot can return (msgpack has no sets)


class Escape(BaseException):
    """Not an Exception: ``execute`` lets it through, so the Dask task itself errs and
    only its future reports the outcome."""


def escape() -> None:
    raise Escape("out of the unit")


def watch(units: list[troy.ComputeUnit]) -> dict[str, list[State]]:
    seen: dict[str, list[State]] = {u.id: [] for u in units}
    for u in units:
        u.add_callback(lambda unit, s: seen[unit.id].append(s))
    return seen


def test_burst_of_mixed_units_pass_every_state_in_order(session, dask_scheduler, tmp_path):
    fw = session.add_framework("dask", name="ev", scheduler_address=dask_scheduler,
                               sandbox=str(tmp_path / "sb"))
    running_pilot(fw, 2)
    kinds = [(CUD(executable="/bin/true"), State.DONE),
             (CUD(executable="/bin/false"), State.FAILED),
             (CUD(function=big_value), State.DONE),
             (CUD(function=escape), State.FAILED),
             (CUD(function=not_data), State.FAILED)] * 12
    units = [troy.ComputeUnit(cud) for cud, _ in kinds]
    seen = watch(units)
    for u in units:
        fw.submit_unit(u)
    for u, (_, final) in zip(units, kinds):
        assert u.wait(60) is final, (u, u.result)
        states = [s for s in seen[u.id] if s is not State.PENDING]
        assert states == [State.DISPATCHED, State.RUNNING, final], (u, seen[u.id])
    assert units[2].result.value == big_value()
    assert "out of the unit" in units[3].result.error
    assert units[1].result.error == "exit status 1"
    assert "its value is a set" in units[4].result.error and units[4].result.value is None


def test_long_unit_is_running_before_it_ends(session, dask_scheduler, tmp_path):
    """A unit still running after the announce delay is RUNNING (with the worker's start
    time) while its process runs, not only when its end arrives."""
    fw = session.add_framework("dask", name="long", scheduler_address=dask_scheduler,
                               sandbox=str(tmp_path / "sb"))
    p = running_pilot(fw, 1)
    gate = tmp_path / "gate"
    before = time.time()
    u = fw.submit_unit(CUD(executable="/bin/sh",
                           arguments=["-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]))
    wait_for(lambda: u.state is State.RUNNING, 30, what="unit RUNNING")
    assert u.result is None and u.pilot == p.id and u.start >= before - 1
    gate.write_text("go")
    assert u.wait(30) is State.DONE


@pytest.fixture
def distributed_level():
    """Dask's ``distributed`` logger level, restored after the test (frameworks set it)."""
    import distributed  # noqa: F401  (configures its loggers on import)
    logger = logging.getLogger("distributed")
    saved = logger.level
    logger.setLevel(logging.INFO)  # Dask's own default
    yield logger
    logger.setLevel(saved)


def test_dask_chatter_is_quiet_by_default_in_this_process_and_the_pilot_logs(
        distributed_level, tmp_path):
    fw = DaskFramework("quiet", sandbox=str(tmp_path / "sb"))
    fw.start()
    try:
        assert distributed_level.level == logging.WARNING
        p = running_pilot(fw, 1)
        assert fw.submit_unit(CUD(executable="/bin/true")).wait(30) is State.DONE
        log_text = (tmp_path / "sb" / f"{p.id}.log").read_text()
    finally:
        fw.close()
    assert "INFO" not in log_text


def test_dask_log_level_option_keeps_dask_info(distributed_level, tmp_path):
    fw = DaskFramework("chatty", sandbox=str(tmp_path / "sb"), dask_log_level="info")
    fw.start()
    try:
        assert distributed_level.level == logging.INFO
        p = running_pilot(fw, 1)
        log_text = (tmp_path / "sb" / f"{p.id}.log").read_text()
    finally:
        fw.close()
    assert "INFO:distributed.worker" in log_text


def test_bad_dask_log_level_is_one_clear_error():
    with pytest.raises(troy.BadParameter, match="framework 'x': dask_log_level: expected a "
                                                "logging level"):
        DaskFramework("x", dask_log_level="loud")
