"""Seeded fault injection (BUSY, 503, slow answers, failed boots) and restart persistence."""
from __future__ import annotations

import xmlrpc.client

from elasticslice.emulator import EmulatorServer
from elasticslice.emulator.faults import Fault, FaultInjector
from elasticslice.rpc.codes import GeniCode
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session, ok, proxy


def _outcomes(emu, n=40):
    sa = proxy(emu, "sa")
    seen = []
    for _ in range(n):
        try:
            seen.append(sa.GetVersion({})["code"])
        except xmlrpc.client.ProtocolError as err:
            seen.append(err.errcode)
    return seen


def test_busy_storm_and_503s_are_seeded(emulator_factory):
    emu = emulator_factory(fault_rate=0.5, seed=7, slow_seconds=0.01)
    seen = _outcomes(emu)
    assert GeniCode.BUSY in seen and 503 in seen and 0 in seen
    counts = emu.server.faults.counts
    assert counts[Fault.SLOW] > 0
    again = emulator_factory(fault_rate=0.5, seed=7, slow_seconds=0.01)
    assert _outcomes(again) == seen


def test_fault_injector_alone():
    faults = FaultInjector(0.0)
    assert {faults.for_call("x") for _ in range(20)} == {Fault.NONE}
    faults = FaultInjector(1.0, seed=1)
    assert Fault.NONE not in {faults.for_call("x") for _ in range(20)}


def test_boot_failures_show_in_sliver_status(emulator_factory):
    emu = emulator_factory(boot_failure_rate=1.0)
    s = Session(emu)
    urn, cred, _ = s.create()
    status = wait_for(lambda: (st := s.status(urn, cred))["status"] == "failed" and st,
                      timeout=20, what="boot failure")
    assert all(d["rawstate"] == "TBFAILED" for d in status["details"].values())
    assert "boot failed" in status["error"]


def test_restarted_emulator_keeps_slices_slivers_and_nodes(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    before = wait_for(lambda: (st := s.status(urn, cred))["status"] == "ready" and st,
                      timeout=20, what="ready")
    directory = emulator.dir
    emulator.server.stop()
    with EmulatorServer(directory, port=0, boot_delay=0.2) as again:
        emulator.server = again  # so the fixture's cleanup stops the right one
        s2 = Session(type(emulator)(directory, again))
        after = s2.status(urn, cred)
        assert after["details"] == before["details"]
        assert s2.cm.CreateSliver({"slice_urn": urn, "rspec": "<x/>",
                                   "credentials": [cred]})["code"] == GeniCode.REFUSED
        got = ok(s2.sa.Resolve({"credential": s2.user_cred, "type": "Slice", "urn": urn}))
        assert got["urn"] == urn


def test_expired_sliver_is_reaped_and_its_nodes_freed(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    store = emulator.server.ctx.store
    sliver = store.get_sliver(urn)
    sliver.expires = emulator.server.ctx.clock() - 1  # as if its time had run out
    store.put_sliver(sliver)
    emulator.server.reclaimer.wake()
    wait_for(lambda: s.cm.SliverStatus({"slice_urn": urn, "credentials": [cred]})["code"]
             == GeniCode.SEARCHFAILED, timeout=20, what="sliver reaped")
    assert not store.nodes(slice_urn=urn)


def test_pending_reclamation_survives_a_restart(emulator_factory, tmp_path):
    from elasticslice.emulator.adminclient import AdminClient
    from tests.elasticslice.emulator.helpers import CallbackEndpoint
    emu = emulator_factory(max_wait=2, notify_interval=5)
    ep = CallbackEndpoint(emu.dir, tmp_path, early=False)
    try:
        s = Session(emu)
        urn, cred, _ = s.create()
        ok(s.dyn.SetSliceClientEndpoint({"slice_urn": urn, "url": ep.url,
                                         "credentials": [cred], "policy": "LIFO"}))
        node = next(iter(s.status(urn, cred)["details"].values()))["component_urn"]
        AdminClient(emu.dir).call("Revoke", nodes=[node.rsplit("+", 1)[-1]])
        wait_for(lambda: "NotifyDeletePending" in ep.methods(), timeout=20, what="notice")
        emu.server.stop()
        with EmulatorServer(emu.dir, port=0, max_wait=2, notify_interval=0.2) as again:
            emu.server = again
            wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20,
                     what="forced after restart")
            (event,) = AdminClient(emu.dir).call("Report")
            assert event["outcome"] == "forced"
    finally:
        ep.close()
