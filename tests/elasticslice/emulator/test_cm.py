"""The component manager v2: slivers from real RSpecs, status, AddNodes/DeleteNodes, refusals."""
from __future__ import annotations

import datetime as dt
import zlib

import geni.rspec.pg as pg
import pytest

from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.credential import parse_credential
from elasticslice.rspec import parse, validate
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import REQUEST, Session, free_node, ok


def _genilib_request() -> str:
    req = pg.Request()
    a = pg.RawPC("a")
    a.hardware_type = "xl170"
    b = pg.RawPC("b")
    lan = pg.LAN("lan0")
    lan.addInterface(a.addInterface("if1"))
    lan.addInterface(b.addInterface("if1"))
    for res in (a, b, lan):
        req.addResource(res)
    xml = req.toXMLString(pretty_print=True)
    return xml.decode() if isinstance(xml, bytes) else xml


def _ready(s: Session, urn: str, cred: str) -> dict:
    return wait_for(lambda: (st := s.status(urn, cred))["status"] == "ready" and st,
                    timeout=20, what="sliver ready")


def test_create_sliver_from_genilib_rspec_boots_to_ready(emulator):
    s = Session(emulator)
    urn, cred, (sliver_cred, manifest) = s.create(rspec=_genilib_request())
    assert validate(manifest) == []
    m = parse(manifest)
    assert m.type == "manifest" and {n.client_id for n in m.nodes} == {"a", "b"}
    a = m.node("a")
    assert a.hardware_type == "xl170" and a.component_id.endswith("+node+hp01")
    assert a.logins and a.logins[0].username == "elastic"
    assert m.links[0].client_id == "lan0" and a.interfaces[0].ip.startswith("10.")
    first = s.status(urn, cred)
    assert first["status"] in ("notready", "changing", "ready")
    status = _ready(s, urn, cred)
    assert status["state"] == "started"
    details = list(status["details"].values())
    assert {d["client_id"] for d in details} == {"a", "b"}
    assert all(d["rawstate"] == "ISUP" for d in details)
    # a sliver credential works for GetSliver and SliverStatus (classic clients)
    assert parse_credential(sliver_cred).target_urn.startswith("urn:publicid:IDN+emulab.test+sliver+")
    assert ok(s.cm.SliverStatus({"slice_urn": urn, "credentials": [sliver_cred]}))["status"] == "ready"
    again = ok(s.cm.GetSliver({"slice_urn": urn, "credentials": [sliver_cred]}))
    assert parse_credential(again).target_urn == parse_credential(sliver_cred).target_urn
    # and with no slice_urn at all: the CM takes the slice from the credential
    assert ok(s.cm.SliverStatus({"credentials": [sliver_cred]}))["status"] == "ready"


def test_second_create_sliver_is_refused(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    again = s.cm.CreateSliver({"slice_urn": urn, "rspec": REQUEST, "credentials": [cred]})
    assert again["code"] == GeniCode.REFUSED


def test_credentials_must_be_an_array(emulator):
    s = Session(emulator)
    urn, cred = s.register()
    got = s.cm.CreateSliver({"slice_urn": urn, "rspec": REQUEST, "credentials": cred})
    assert got["code"] == GeniCode.BADARGS and "array" in got["output"]
    assert s.cm.DiscoverResources({"credentials": s.user_cred})["code"] == GeniCode.BADARGS


def test_credential_for_another_slice_is_forbidden(emulator):
    s = Session(emulator)
    urn_a, cred_a, _ = s.create("slicea")
    urn_b, _ = s.register("sliceb")
    got = s.cm.SliverStatus({"slice_urn": urn_b, "credentials": [cred_a]})
    assert got["code"] == GeniCode.FORBIDDEN
    got = s.cm.CreateSliver({"slice_urn": urn_b, "rspec": REQUEST, "credentials": [cred_a]})
    assert got["code"] == GeniCode.FORBIDDEN
    assert s.cm.SliverStatus({"slice_urn": urn_a, "credentials": [s.user_cred]})["code"] \
        == GeniCode.FORBIDDEN


def test_discover_resources_plain_compressed_and_available(emulator):
    s = Session(emulator)
    ad_v2 = ok(s.cm.DiscoverResources({"credentials": [s.user_cred]}))
    assert "protogeni.net/resources/rspec/2" in ad_v2
    packed = ok(s.cm.DiscoverResources({"credentials": [s.user_cred], "compress": True,
                                        "rspec_version": "3"}))
    ad = parse(zlib.decompress(packed.data))
    assert ad.total_by_type == {"m400": 40, "m510": 20, "xl170": 10, "d430": 8}
    s.create()
    avail = parse(ok(s.cm.DiscoverResources({"credentials": [s.user_cred], "available": True,
                                             "rspec_version": "3"})))
    assert sum(avail.available_by_type.values()) == 78 - 2
    assert len(avail.nodes) == 76


def test_not_enough_nodes_and_unknown_types(emulator):
    s = Session(emulator)
    urn, cred = s.register()
    nodes = "".join(f'<node client_id="x{i}"><hardware_type name="d430"/></node>' for i in range(9))
    big = f'<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">{nodes}</rspec>'
    got = s.cm.CreateSliver({"slice_urn": urn, "rspec": big, "credentials": [cred]})
    assert got["code"] == GeniCode.INSUFFICIENT_NODES
    odd = big.replace("d430", "z999")
    assert s.cm.CreateSliver({"slice_urn": urn, "rspec": odd, "credentials": [cred]})["code"] \
        == GeniCode.SEARCHFAILED
    assert s.cm.CreateSliver({"slice_urn": urn, "rspec": "<nope/>", "credentials": [cred]})[
        "code"] == GeniCode.BADARGS
    assert s.cm.SliverStatus({"slice_urn": urn, "credentials": [cred]})["code"] \
        == GeniCode.SEARCHFAILED


def test_add_nodes_and_delete_nodes(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    args = {"slice_urn": urn, "credentials": [cred]}
    pc = free_node(emulator)   # a machine by name (the sliver's are drawn at random)
    manifest = ok(s.cm.AddNodes({**args, "nodes": {
        "n3": {"lans": ["lan0"]},
        "n4": {"node": pc, "startup": "exit 0", "lans": ["lan0"]},
    }}))
    m = parse(manifest)
    assert {n.client_id for n in m.nodes} == {"n1", "n2", "n3", "n4"}
    assert m.node("n4").component_id.endswith(f"+node+{pc}")
    assert m.node("n4").interfaces[0].client_id == "n4:lan0"  # the CM's name for it
    assert m.node("n4").interfaces[0].ip.startswith("10.")  # the CM's address
    assert len(m.links[0].interfaces) == 4
    dup = s.cm.AddNodes({**args, "nodes": {"n3": {}}})
    assert dup["code"] == GeniCode.BADARGS and "n3" in dup["output"]
    nolan = s.cm.AddNodes({**args, "nodes": {"n5": {"lans": ["nolan"]}}})
    assert nolan["code"] == GeniCode.BADARGS and "No such nolan" in nolan["output"]
    taken = s.cm.AddNodes({**args, "nodes": {"n6": {"node": pc}}})
    assert taken["code"] == GeniCode.BADARGS and f"{pc} is not available" in taken["output"]
    _ready(s, urn, cred)
    m = parse(ok(s.cm.DeleteNodes({**args, "nodes": ["n3"]})))
    assert {n.client_id for n in m.nodes} == {"n1", "n2", "n4"}
    assert "n3:lan0" not in m.links[0].interfaces
    unknown = s.cm.DeleteNodes({**args, "nodes": ["ghost"]})
    assert unknown["code"] == GeniCode.BADARGS
    everything = s.cm.DeleteNodes({**args, "nodes": ["n1", "n2", "n4"]})
    assert everything["code"] == GeniCode.BADARGS
    assert len(s.status(urn, cred)["details"]) == 3


def test_add_nodes_needs_a_sliver(emulator):
    s = Session(emulator)
    urn, cred = s.register()
    got = s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {"n1": {}}})
    assert got["code"] == GeniCode.SEARCHFAILED


def test_delete_slice_is_busy_while_booting_then_frees_nodes(emulator_factory):
    emu = emulator_factory(boot_delay=30)
    s = Session(emu)
    urn, cred, _ = s.create()
    args = {"slice_urn": urn, "credentials": [cred]}
    assert s.cm.DeleteSlice(args)["code"] == GeniCode.BUSY
    emu.server.ctx.settings.boot_delay = 0.05  # let the boot finish now
    for node in emu.server.ctx.store.nodes(slice_urn=urn):
        emu.server.ctx.boot.schedule(node)
    wait_for(lambda: s.cm.DeleteSlice(args)["code"] == 0, timeout=20, what="DeleteSlice")
    assert s.cm.SliverStatus(args)["code"] == GeniCode.SEARCHFAILED
    # the nodes are free again: a new sliver can have them
    assert s.cm.CreateSliver({**args, "rspec": REQUEST})["code"] == 0


def test_renew_and_resolve(emulator):
    s = Session(emulator)
    urn, cred, (sliver_cred, _) = s.create()
    args = {"slice_urn": urn, "credentials": [cred]}
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ok(s.cm.RenewSlice({**args, "expiration": soon})).endswith(" GMT")
    too_far = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=3)).isoformat()
    assert s.cm.RenewSlice({**args, "expiration": too_far})["code"] == GeniCode.ERROR
    past = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)).isoformat()
    assert s.cm.RenewSlice({**args, "expiration": past})["code"] == GeniCode.ERROR
    got = ok(s.cm.Resolve({"urn": urn, "credentials": [cred]}))
    assert got["sliver_urn"] == parse_credential(sliver_cred).target_urn
    assert parse(got["manifest"]).type == "manifest"
    node_urn = parse(got["manifest"]).node("n1").component_id
    node = ok(s.cm.Resolve({"urn": node_urn, "credentials": [s.user_cred]}))
    assert node["role"] == "node" and node["hardware_type"] == "m510"
    sliver = ok(s.cm.Resolve({"urn": got["sliver_urn"], "credentials": [sliver_cred]}))
    assert sliver["urn"] == got["sliver_urn"]


@pytest.mark.parametrize("method", ["DeleteSliver"])
def test_delete_sliver_by_sliver_urn(emulator, method):
    s = Session(emulator)
    urn, cred, (sliver_cred, _) = s.create()
    _ready(s, urn, cred)
    sliver_urn = parse_credential(sliver_cred).target_urn
    assert ok(getattr(s.cm, method)({"sliver_urn": sliver_urn, "credentials": [sliver_cred]}))
    assert s.cm.SliverStatus({"slice_urn": urn, "credentials": [cred]})["code"] \
        == GeniCode.SEARCHFAILED
