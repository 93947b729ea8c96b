"""Dynamic slices: endpoint registration, reclamation countdowns, early and forced takes,
LIFO and CLIENT policies, tenant load; callbacks go to a real HTTPS endpoint."""
from __future__ import annotations

import pytest

from elasticslice.emulator.adminclient import AdminClient
from elasticslice.errors import RPCError
from elasticslice.rpc.codes import GeniCode
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session, dynamic_slice, ok

CM_URN = "urn:publicid:IDN+emulab.test+authority+cm"


def _client_ids(s, urn, cred):
    return sorted(d["client_id"] for d in s.status(urn, cred)["details"].values())


def test_server_defaults_and_endpoint_checks(emulator, endpoint_factory):
    s = Session(emulator)
    assert ok(s.dyn.GetVersion({})) == 1
    assert ok(s.dyn.GetServerDefaults({})) == {"maxwaittime": 5, "policy": "LIFO"}
    urn, cred, _ = s.create()
    args = {"slice_urn": urn, "credentials": [cred]}
    remote = s.dyn.SetSliceClientEndpoint({**args, "url": "https://10.1.2.3:9/"})
    assert remote["code"] == GeniCode.BADARGS and "127.0.0.1" in remote["output"]
    toolong = s.dyn.SetSliceClientEndpoint({**args, "url": "https://127.0.0.1:9/",
                                            "defwaittime": 6})
    assert toolong["code"] == GeniCode.BADARGS
    ep = endpoint_factory(emulator)
    # documented positional form works too
    assert s.dyn.SetSliceClientEndpoint(urn, ep.url, [cred], "CLIENT", 2)["code"] == 0
    assert ok(s.dyn.RemoveSliceClientEndpoint(args)) == 1
    assert s.dyn.RemoveSliceClientEndpoint(args)["code"] == GeniCode.SEARCHFAILED


def test_revoke_with_early_release(emulator, endpoint_factory):
    ep = endpoint_factory(emulator, early=True, user_cert=True)
    s, urn, cred = dynamic_slice(emulator, ep)
    node_id = next(d["component_urn"] for d in s.status(urn, cred)["details"].values()
                   if d["client_id"] == "n2").rsplit("+", 1)[-1]
    assert AdminClient(emulator.dir).call("Revoke", nodes=[node_id]) == {node_id: "reclaiming"}
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20, what="delete complete")
    pending = [p for m, p, _ in ep.calls if m == "NotifyDeletePending"]
    assert pending[0]["nodelist"][0]["node_id"] == node_id
    assert pending[0]["nodelist"][0]["client_id"] == "n2"
    assert all(urn_ == CM_URN for _, _, urn_ in ep.calls)  # called with the CM certificate
    assert _client_ids(s, urn, cred) == ["n1"]
    report = AdminClient(emulator.dir).call("Report")
    assert [(r["node_id"], r["outcome"]) for r in report] == [(node_id, "early")]
    assert report[0]["released_at"] >= report[0]["notified_at"]


def test_countdown_then_forced_delete(emulator_factory, endpoint_factory):
    emu = emulator_factory(max_wait=1, notify_interval=0.3)
    ep = endpoint_factory(emu, early=False)
    s, urn, cred = dynamic_slice(emu, ep, wait=1)
    node_id = next(iter(s.status(urn, cred)["details"].values()))["component_urn"].rsplit("+", 1)[-1]
    AdminClient(emu.dir).call("Revoke", nodes=[node_id])
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20, what="forced delete")
    waits = [p["nodelist"][0]["max_wait_time"] for m, p, _ in ep.calls
             if m == "NotifyDeletePending"]
    assert waits[0] == 1 and waits[-1] == 0 and waits == sorted(waits, reverse=True)
    assert len(_client_ids(s, urn, cred)) == 1
    (event,) = AdminClient(emu.dir).call("Report")
    assert event["outcome"] == "forced" and event["notifications"] == len(waits)


def test_a_forced_delete_tells_0_s_left_before_it_tells_the_nodes_are_gone(
        emulator_factory, endpoint_factory):
    """The last notice of a forced delete (max_wait_time 0) and NotifyDeleteComplete went
    out on two workers at once: a client whose last notice was slow to arrive heard "gone",
    then "0 s left" for a node it no longer had (a fresh-clone run saw it)."""
    emu = emulator_factory(max_wait=1, notify_interval=0.3)
    ep = endpoint_factory(emu, early=False)
    ep.last_notice_delay = 1.0
    s, urn, cred = dynamic_slice(emu, ep, wait=1)
    node_id = next(iter(s.status(urn, cred)["details"].values()))["component_urn"].rsplit("+", 1)[-1]
    AdminClient(emu.dir).call("Revoke", nodes=[node_id])
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20, what="forced delete")
    methods = [m for m, _, _ in ep.calls if m.startswith("NotifyDelete")]
    assert methods[-1] == "NotifyDeleteComplete" and methods.count("NotifyDeleteComplete") == 1
    last = [p for m, p, _ in ep.calls if m == "NotifyDeletePending"][-1]
    assert last["nodelist"][0]["max_wait_time"] == 0


def _small_inventory(tmp_path, count=4):
    path = tmp_path / "inv.ini"
    path.write_text(f"[inventory]\ndefault_hardware_type = m510\n\n[m510]\ncount = {count}\n"
                    "cores = 8\nmemory = 1024\nprefix = ms\n")
    return path


def test_lifo_reclaims_the_newest_node_for_tenant_load(emulator_factory, endpoint_factory,
                                                       tmp_path):
    emu = emulator_factory(inventory=_small_inventory(tmp_path))
    ep = endpoint_factory(emu)
    s, urn, cred = dynamic_slice(emu, ep)
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {"n3": {}}}))
    AdminClient(emu.dir).call("SetLoad", busy=2)  # one free node, one must come from us
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20, what="reclaim")
    assert _client_ids(s, urn, cred) == ["n1", "n2"]
    status = AdminClient(emu.dir).call("Status")
    assert status["pool"]["m510"] == {"free": 0, "slice": 2, "tenant": 2}
    AdminClient(emu.dir).call("SetLoad", busy=0)
    wait_for(lambda: AdminClient(emu.dir).call("Status")["pool"]["m510"]["free"] == 2,
             timeout=20, what="tenants leave")


def test_client_policy_reclaims_the_lowest_value(emulator_factory, endpoint_factory, tmp_path):
    emu = emulator_factory(inventory=_small_inventory(tmp_path, count=3))
    ep = endpoint_factory(emu)
    s, urn, cred = dynamic_slice(emu, ep, policy="CLIENT")
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {"n3": {}}}))
    bad = s.dyn.SetResourceValues({"slice_urn": urn, "credentials": [cred],
                                   "nodelist": [{"client_id": "n1", "value": 3.0}]})
    assert bad["code"] == GeniCode.BADARGS
    ok(s.dyn.SetResourceValues({"slice_urn": urn, "credentials": [cred], "nodelist": [
        {"client_id": "n1", "value": 0.1}, {"client_id": "n3", "value": 0.9}]}))
    AdminClient(emu.dir).call("SetLoad", busy=1)
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20, what="reclaim")
    assert _client_ids(s, urn, cred) == ["n2", "n3"]


def test_tenant_load_model_takes_nodes_back(emulator_factory, endpoint_factory, tmp_path):
    emu = emulator_factory(inventory=_small_inventory(tmp_path, count=10), seed=3)
    ep = endpoint_factory(emu)
    s, urn, cred = dynamic_slice(emu, ep)
    settings = emu.server.ctx.settings
    settings.tenant_interval = 0.1
    settings.tenant_load = 0.95  # other tenants now want nearly the whole pool
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20, what="tenant pressure")
    assert len(_client_ids(s, urn, cred)) < 2


def test_admin_errors_are_clear(emulator, tmp_path):
    with pytest.raises(RPCError) as info:
        AdminClient(emulator.dir).call("Revoke", nodes=["nosuch"])
    assert info.value.code == GeniCode.SEARCHFAILED
    (tmp_path / "x").mkdir()
    with pytest.raises(Exception) as info:
        AdminClient(tmp_path / "x").call("Status")
    assert "no emulator is running" in str(info.value)


# ---- SetResourceValues: the emulator tells the client what its nodes are worth

def _details(s, urn, cred):
    return {d["client_id"]: d for d in s.status(urn, cred)["details"].values()}


def test_values_are_pushed_to_the_endpoint_on_registration(emulator, endpoint_factory):
    ep = endpoint_factory(emulator)
    s, urn, cred = dynamic_slice(emulator, ep)
    wait_for(lambda: ep.values(), timeout=20, what="SetResourceValues")
    (method, params, caller), = [c for c in ep.calls if c[0] == "SetResourceValues"][:1]
    assert caller == CM_URN  # the emulator calls, with the CM certificate
    details = _details(s, urn, cred)
    assert sorted(n["client_id"] for n in params["nodelist"]) == sorted(details) == ["n1", "n2"]
    for item in params["nodelist"]:
        assert 0.0 <= item["value"] <= 1.0
        assert item["component_urn"] == details[item["client_id"]]["component_urn"]
        assert item["node_id"] == item["component_urn"].rsplit("+", 1)[-1]


@pytest.mark.parametrize("policy", ["LIFO", "CLIENT"])
def test_the_node_with_the_lowest_pushed_value_is_reclaimed_next(emulator_factory,
                                                                  endpoint_factory, tmp_path,
                                                                  policy):
    emu = emulator_factory(inventory=_small_inventory(tmp_path))
    ep = endpoint_factory(emu)
    s, urn, cred = dynamic_slice(emu, ep, policy=policy)
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {"n3": {}}}))
    if policy == "CLIENT":  # the emulator extension: the client ranks its own nodes
        ok(s.dyn.SetResourceValues({"slice_urn": urn, "credentials": [cred], "nodelist": [
            {"client_id": "n1", "value": 0.8}, {"client_id": "n2", "value": 0.1}]}))
    admin = AdminClient(emu.dir)
    # a push computed before these calls can land after them: wait until the emulator has
    # answered every push it was asked for, then count (what follows is the load's push)
    wait_for(emu.server.reclaimer.values.idle, timeout=20, what="the earlier pushes answered")
    before = len(ep.values())
    admin.call("SetLoad", busy=1)  # the free node is enough: nothing reclaimed yet
    pushed = wait_for(lambda: [v for v in ep.values()[before:] if len(v) == 3], timeout=20,
                      what="values after the load changed")[-1]
    assert "NotifyDeletePending" not in ep.methods()
    lowest = min(pushed, key=pushed.get)
    assert lowest == ("n3" if policy == "LIFO" else "n2")
    assert sorted(pushed.values()) == sorted(set(pushed.values()))  # a strict order
    admin.call("SetLoad", busy=2)  # now one node must come from the slice
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20, what="reclaim")
    (notice,) = {p["nodelist"][0]["client_id"] for m, p, _ in ep.calls
                 if m == "NotifyDeletePending"}
    assert notice == lowest
    assert lowest not in _details(s, urn, cred)


def test_values_are_pushed_before_a_revokes_first_notice(emulator, endpoint_factory):
    ep = endpoint_factory(emulator, early=True)
    s, urn, cred = dynamic_slice(emulator, ep)
    wait_for(lambda: ep.values(), timeout=20, what="values on registration")
    node_id = _details(s, urn, cred)["n1"]["component_urn"].rsplit("+", 1)[-1]
    AdminClient(emulator.dir).call("Revoke", nodes=[node_id])
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20, what="revoke")
    methods = ep.methods()
    first_notice = methods.index("NotifyDeletePending")
    before = [i for i, m in enumerate(methods[:first_notice]) if m == "SetResourceValues"]
    assert len(before) >= 2  # registration, then the one before the notice
    values = {n["client_id"]: n["value"] for n in ep.calls[before[-1]][1]["nodelist"]}
    assert values["n1"] == 0.0 < values["n2"]  # being reclaimed: worth nothing


def test_a_slow_endpoint_does_not_stall_reclamation_and_values_are_retried(emulator_factory,
                                                                           endpoint_factory):
    emu = emulator_factory(max_wait=1, notify_interval=0.2)
    values = emu.server.reclaimer.values
    emu.server.ctx.settings.values_timeout = 0.3
    ep = endpoint_factory(emu, early=False)
    ep.values_delay = 3.0  # far longer than the emulator waits
    s, urn, cred = dynamic_slice(emu, ep, wait=1)
    wait_for(lambda: values.failures >= 1, timeout=20, what="a failed push")
    node_id = _details(s, urn, cred)["n2"]["component_urn"].rsplit("+", 1)[-1]
    AdminClient(emu.dir).call("Revoke", nodes=[node_id])
    # The countdown and the forced delete go on although every push times out.
    wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=30, what="forced delete")
    assert values.pushes == 0 and values.failures >= 2
    ep.values_delay = 0.0  # the client recovers: a retry gets through
    wait_for(lambda: values.pushes >= 1, timeout=30, what="a retried push")
    assert sorted(_details(s, urn, cred)) == ["n1"]
