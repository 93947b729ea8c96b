"""The order a unit service offers its queued units in (``troy.order``): the longest
``runtime`` hint first by default, first come first served with ``order="fifo"``; a bad
order is one line naming it."""
from __future__ import annotations

import pytest

import troy
from tests.helpers import wait_for
from troy import ComputeUnitDescription as CUD
from troy import PilotDescription, State
from troy.errors import BadParameter
from troy.order import longest_first

HINTS = (("short", 1.0), ("none", None), ("long", 9.0), ("mid", 3.0))


def started_in_order(session: troy.Session, tmp_path, order: str | None,
                     one_by_one: bool = False) -> list[str]:
    """Four units queued behind a running one on a one-core pilot (in one submission, or
    ``one_by_one``): the order they ran in."""
    fw = session.add_framework("local", name="one", sandbox=str(tmp_path / "sandbox"))
    assert fw.submit_pilot(PilotDescription(size=1)).wait_running(10) is State.RUNNING
    us = session.unit_service(scheduler="backfill", order=order)
    gate, log = tmp_path / "gate", tmp_path / "ran"
    blocker = us.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]))
    wait_for(lambda: blocker.state is State.RUNNING, 10, what="the first unit running")
    cuds = [CUD(executable="/bin/sh", arguments=["-c", f"echo {n} >> {log}"], runtime=hint)
            for n, hint in HINTS]
    units = [us.submit_unit(c) for c in cuds] if one_by_one else us.submit_units(cuds)
    assert {u.state for u in units} == {State.PENDING}   # queued: the core is taken
    gate.touch()
    assert us.wait_units(units, timeout=30) == [State.DONE] * 4
    return log.read_text().split()


@pytest.mark.parametrize("one_by_one", [False, True], ids=["one-batch", "one-by-one"])
def test_the_longest_hint_runs_first_and_units_without_one_keep_their_turn(tmp_path,
                                                                          one_by_one):
    """A unit submitted later passes the shorter ones already queued."""
    with troy.Session(store_path=tmp_path / "troy.db") as s:
        assert started_in_order(s, tmp_path, None, one_by_one) == [
            "long", "mid", "short", "none"]


def test_fifo_runs_them_as_they_came(tmp_path):
    with troy.Session(store_path=tmp_path / "troy.db", config={"order": "fifo"}) as s:
        assert started_in_order(s, tmp_path, None) == ["short", "none", "long", "mid"]


def test_a_bad_order_is_one_line_naming_it(tmp_path):
    with pytest.raises(BadParameter, match="session config: order 'lifo': expected one of "
                                           "longest_first, fifo"):
        troy.Session(config={"order": "lifo"})
    with troy.Session(store_path=tmp_path / "troy.db") as s:
        with pytest.raises(BadParameter, match="order 'random'"):
            s.unit_service(order="random")


def test_longest_first_is_stable_and_counts_no_hint_as_zero():
    items = [("a", None), ("b", 2.0), ("c", 0.0), ("d", 2.0), ("e", 5.0)]
    assert [n for n, _ in longest_first(items, lambda i: i[1])] == ["e", "b", "d", "a", "c"]
