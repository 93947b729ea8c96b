"""Overlays (seed 000): states, framework choice, provisioning, cancel."""
from __future__ import annotations

import pytest

import troy
from troy import Overlay, OverlayManager, State
from troy.errors import BadParameter, IncorrectState


def test_overlay_lifecycle(troy_session):
    seen = []
    o = Overlay()
    o.add_callback(lambda ov, st: seen.append(st))
    pid = o.add_pilot({"size": 2})
    o.add_pilot(troy.PilotDescription(size=1))
    assert o.pilots[pid].state is State.DESCRIBED and o.size == 3
    om = OverlayManager(troy_session)
    om.translate_overlay(o)
    with pytest.raises(IncorrectState):
        o.add_pilot({"size": 1})
    om.schedule_overlay(o)
    assert o.state is State.SCHEDULED
    assert o.pilots[pid].framework == "local"  # none in the session: a local one is added
    om.provision_overlay(o)
    assert o.state is State.PROVISIONED
    p = o.pilots[pid]
    assert p.state is State.RUNNING and p.free_cores == 2 and p.pilot.size == 2
    o.cancel()
    assert o.state is State.COMPLETED
    assert all(x.state is State.CANCELED for x in o.pilots.values())
    assert seen == [State.TRANSLATED, State.SCHEDULED, State.PROVISIONED, State.COMPLETED]


def test_pilots_go_to_the_framework_they_name(troy_session):
    troy_session.add_framework("local", name="a")
    troy_session.add_framework("local", name="b")
    o = Overlay([{"size": 1, "framework": "b"}, {"size": 1}, {"size": 1, "framework": "local"}])
    OverlayManager(troy_session).manage_overlay(o)
    assert [p.framework for p in o.pilots.values()] == ["b", "a", "a"]
    bad = Overlay([{"size": 1, "framework": "nowhere"}])
    with pytest.raises(BadParameter, match="'nowhere' is neither"):
        OverlayManager(troy_session).schedule_overlay(bad)


def test_overlay_lock_and_pilot_cancel_before_provisioning(troy_session):
    o = Overlay()
    o.lock()
    with pytest.raises(IncorrectState, match="locked"):
        o.add_pilot({"size": 1})
    o.unlock()
    a = o.add_pilot({"size": 1})
    o.add_pilot({"size": 1})
    o.pilots[a].cancel()
    assert o.pilots[a].state is State.CANCELED
    OverlayManager(troy_session).manage_overlay(o)
    assert o.pilots[a].pilot is None and o.state is State.PROVISIONED


def test_a_failed_pilot_fails_the_overlay(troy_session):
    o = Overlay([{"size": 1}])
    OverlayManager(troy_session).manage_overlay(o)
    o.pilots["opilot.0000"].pilot._set_state(State.FAILED)  # as a framework would push it
    assert o.state is State.FAILED


@pytest.mark.parametrize("late_binding", ["overlay", "session"])
def test_late_bound_units_of_an_overlay_stay_on_its_pilots(tmp_path, late_binding):
    """Broke: late-bound units of a workload executed on an overlay went to any framework
    of the session (round robin put every other one on a framework the overlay does not
    use); seed 001 schedules them onto the overlay's pilots. ``late_binding="session"``
    is the old way, kept as an option."""
    with troy.Session(store_path=tmp_path / "s.sqlite",
                      config={"late_binding": late_binding}) as s:
        s.add_framework("local", name="a", sandbox=str(tmp_path / "a"))
        other = s.add_framework("local", name="b", sandbox=str(tmp_path / "b"))
        assert other.submit_pilot(troy.PilotDescription(size=4)).wait_running(10) \
            is State.RUNNING
        o = Overlay([{"size": 2, "framework": "a"}])
        w = troy.Workload()
        w.add_task([{"executable": "/bin/true"} for _ in range(8)])
        assert troy.execute_workload(s, w, o, scheduler="round_robin", bundle=False,
                                     timeout=120) is State.DONE
        pilots = {op.pilot.id for op in o.pilots.values()}
        units = [u for t in w.tasks.values() for u in t.units]
        if late_binding == "overlay":
            assert {u.framework for u in units} == {"a"}
            assert {u.pilot for u in units} <= pilots
        else:
            assert "b" in {u.framework for u in units}
        o.cancel()


def test_late_binding_config_is_checked():
    with pytest.raises(BadParameter, match="late_binding 'pilots': expected 'overlay' or"):
        troy.Session(config={"late_binding": "pilots"})
