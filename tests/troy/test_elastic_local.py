"""Elastic pilots on the ``local`` framework: drains, losses, values, the following
overlay, and bad values named. (The ``dask`` ones: frameworks/test_dask_drain.py.)"""
from __future__ import annotations

import threading
import time

import pytest

import troy
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.errors import BadParameter
from tests.helpers import wait_for

WAIT = 60


@pytest.fixture
def local(tmp_path):  # noqa: ANN001, ANN201
    s = troy.Session(store_path=tmp_path / "s.sqlite")
    yield s, s.add_framework("local", name="nodes", sandbox=str(tmp_path))
    s.close()


def test_a_local_drain_lets_short_units_finish_and_moves_long_ones(local) -> None:
    s, fw = local
    a, b = fw.submit_pilot({"size": 2}), fw.submit_pilot({"size": 2})
    short = fw.submit_unit(CUD(executable="/bin/sleep", arguments=["1"], runtime=1), a)
    long = fw.submit_unit(CUD(executable="/bin/sleep", arguments=["600"], runtime=600), a)
    wait_for(lambda: short.state is State.RUNNING and long.state is State.RUNNING, WAIT)
    emptied = []
    plan = fw.drain_pilot(a, time.time() + 300, margin=5, on_empty=emptied.append)
    assert plan.kept == [short.id] and plan.requeued == [long.id]
    assert short.wait(WAIT) is State.DONE and short.pilot == a.id
    wait_for(lambda: long.state is State.RUNNING and long.pilot == b.id, WAIT,
             what="the long unit running on the other pilot")
    wait_for(lambda: emptied == [a], WAIT, what="on_empty")
    assert a.free_cores == 0 and not a.busy and a.idle_since is not None
    lost = fw.lose_pilot(b, "crashed")
    assert [u.id for u in lost] == [long.id] and b.state is State.FAILED
    assert fw.lose_pilot(b) == []
    assert fw.unit_stats().requeued >= 1 and fw.unit_stats().lost == 0
    long.cancel()


def test_long_units_prefer_valued_pilots_on_local(local) -> None:
    s, fw = local
    low, high = fw.submit_pilot({"size": 4}), fw.submit_pilot({"size": 1})
    fw.set_pilot_values({low.id: 0.2, high.native_id: 0.8})
    assert fw.find_pilot(high.native_id) is high and high.value == 0.8
    units = [fw.submit_unit(CUD(executable="/bin/true", runtime=100)) for _ in range(3)]
    assert all(u.wait(WAIT) is State.DONE for u in units)
    assert {u.pilot for u in units} == {high.id}   # waited for it, though low was free
    wide = fw.submit_unit(CUD(executable="/bin/true", runtime=100, cores=2))
    assert wide.wait(WAIT) is State.DONE and wide.pilot == low.id  # only low is that wide


def test_bad_pilot_values_and_options_are_named(local) -> None:
    s, fw = local
    with pytest.raises(BadParameter, match="value of 'x': expected a number"):
        fw.set_pilot_values({"x": "high"})
    with pytest.raises(BadParameter, match="long_unit: expected a number >= 0"):
        s.add_framework("local", name="bad", long_unit=-1)


def test_a_following_overlay_waits_for_pilots_and_follows_them(local) -> None:
    s, fw = local
    w = troy.Workload()
    w.add_task([{"executable": "/bin/true", "runtime": 1} for _ in range(6)])
    overlay = troy.Overlay.following(fw)
    assert overlay.state is State.PROVISIONED and overlay.pilots == {}
    done: list[State] = []
    t = threading.Thread(target=lambda: done.append(
        troy.execute_workload(s, w, overlay, bundle=False, timeout=WAIT)))
    t.start()
    wait_for(lambda: s.demand().units_queued == 6, WAIT, what="units queued, no pilot")
    p = fw.submit_pilot({"size": 2})
    t.join(WAIT)
    assert done == [State.DONE] and list(overlay.pilots) == [p.id]
    fw.lose_pilot(p)
    assert overlay.pilots == {} and overlay.state is State.PROVISIONED
