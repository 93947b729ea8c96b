"""A box of several clusters (``emulator init --cm utah --cm wisc``): one SA, a CM each, as
CloudLab's Utah and Wisconsin. One emulator for the module, one slice per test; the real
client (its config as init wrote it) over TLS."""
from __future__ import annotations

import dataclasses
import datetime as dt
import xmlrpc.client
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.config import load_config
from elasticslice.emulator import EmulatorServer, init_emulator
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.errors import ConfigError, RPCError
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import NodeSpec, build_request, parse
from tests.elasticslice.emulator.helpers import (FAST, CallbackEndpoint, RunningEmulator,
                                                 cluster_box, user_context)
from tests.helpers import wait_for

pytestmark = pytest.mark.slow  # it boots an emulator (tests/conftest.py)

UTAH = "urn:publicid:IDN+utah.emulab.test+authority+cm"
WISC = "urn:publicid:IDN+wisc.emulab.test+authority+cm"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with cluster_box(tmp_path_factory.mktemp("box") / "emu") as running:
        yield running


def client(box: RunningEmulator, slice_name: str) -> ProtoGeniServer:
    """The user's client as init configured it, for the slice ``slice_name``."""
    return ProtoGeniServer(dataclasses.replace(load_config(box.config_path),
                                               slice_name=slice_name))


def request(cm: str | None, *nodes: tuple[str, str | None], pin: str | None = None) -> str:
    return build_request([NodeSpec(cid, hardware_type=hw, component_manager_id=cm,
                                   component_id=pin) for cid, hw in nodes])


def fault(call) -> RPCError:  # type: ignore[no-untyped-def]
    with pytest.raises(RPCError) as err:
        call()
    return err.value


def test_the_client_config_lists_each_cluster_and_each_answers_as_its_own_cm(box):
    cfg = load_config(box.config_path)
    assert [u.split("/cluster/")[1] for u in cfg.cm_urls] == ["utah/protogeni/xmlrpc/cm",
                                                              "wisc/protogeni/xmlrpc/cm"]
    assert [u.split("/cluster/")[1] for u in cfg.dynslice_urls] == [
        "utah/protogeni/xmlrpc/dynslice", "wisc/protogeni/xmlrpc/dynslice"]
    assert cfg.sa_url == f"{box.url}/sa"
    with ProtoGeniServer(cfg) as c:
        assert [c.cm(i).get_version()["urn"] for i in (0, 1)] == [UTAH, WISC]
    # a cluster has no SA of its own, and there is no cluster the box was not made with
    ctx = user_context(box.dir)
    for path in ("/cluster/utah/protogeni/xmlrpc/sa", "/cluster/mars/protogeni/xmlrpc/cm"):
        url = box.url.replace("/protogeni/xmlrpc", "") + path
        with pytest.raises(xmlrpc.client.Fault, match="No such module"):
            xmlrpc.client.ServerProxy(url, context=ctx).GetVersion({})


def test_each_cm_advertises_its_own_nodes_and_hardware_types(box):
    with client(box, "ads") as c:
        ads = [parse(c.discover_resources(cm=i), "rspec") for i in (0, 1)]
    assert {n.hardware_type for n in ads[0].nodes} == {"m400", "m510", "xl170"}
    assert {n.hardware_type for n in ads[1].nodes} == {"c220g1", "c220g5", "c240g5"}
    for ad, cm, domain in ((ads[0], UTAH, "utah"), (ads[1], WISC, "wisc")):
        assert {n.component_manager_id for n in ad.nodes} == {cm}
        assert all(n.component_id.startswith(f"urn:publicid:IDN+{domain}.emulab.test+node+")
                   for n in ad.nodes)


def test_one_slice_a_sliver_and_a_manifest_at_each_cm(box):
    with client(box, "both") as c:
        c.register_slice()
        u_cred, u_manifest = c.create_sliver(request(UTAH, ("u1", "m510"), ("u2", None)), cm=0)
        w_cred, w_manifest = c.create_sliver(request(WISC, ("w1", "c220g5")), cm=1)
        for text, cm, wanted in ((u_manifest, UTAH, {"u1", "u2"}), (w_manifest, WISC, {"w1"})):
            nodes = parse(text, "rspec").nodes
            assert {n.client_id for n in nodes} == wanted
            assert {n.component_manager_id for n in nodes} == {cm}
            assert {n.sliver_id.split("+")[1] for n in nodes} == {cm.split("+")[1]}
        assert parse(u_manifest, "rspec").node("u2").hardware_type in {"m400", "m510", "xl170"}
        assert set(c.resolve_slice()["component_managers"]) == {UTAH, WISC}
        status = [c.sliver_status(cm=i) for i in (0, 1)]
        assert sorted(n.client_id for n in status[0].nodes) == ["u1", "u2"]
        assert [n.client_id for n in status[1].nodes] == ["w1"]
        # each CM signs its own sliver credentials: utah's is no credential at wisc
        slice_urn = c.slice_urn()
        wisc = xmlrpc.client.ServerProxy(c.config.cm_urls[1], context=user_context(box.dir))
        refused = wisc.SliverStatus({"slice_urn": slice_urn, "credentials": [u_cred]})
        assert refused["code"] == GeniCode.FORBIDDEN, refused
        assert wisc.SliverStatus({"slice_urn": slice_urn, "credentials": [w_cred]})["code"] == 0
        # and a sliver at one CM is no sliver at the other
        c.delete_slice(cm=0, cancel=True, blocking=True)
        assert set(c.resolve_slice()["component_managers"]) == {WISC}
        assert [n.client_id for n in c.sliver_status(cm=1).nodes] == ["w1"]


def test_a_cm_refuses_nodes_bound_to_another_cm(box):
    with client(box, "foreign") as c:
        c.register_slice()
        err = fault(lambda: c.create_sliver(request(UTAH, ("u1", "m510")), cm=1))
        assert err.code == GeniCode.BADARGS and UTAH in str(err) and WISC in str(err)
        mixed = build_request([NodeSpec("w1", component_manager_id=WISC),
                               NodeSpec("u1", component_manager_id=UTAH)])
        assert fault(lambda: c.create_sliver(mixed, cm=1)).code == GeniCode.BADARGS
        utah_node = "urn:publicid:IDN+utah.emulab.test+node+ms1001"
        pinned = fault(lambda: c.create_sliver(request(None, ("w1", None), pin=utah_node), cm=1))
        assert pinned.code == GeniCode.BADARGS and utah_node in str(pinned)
        # another cluster's hardware type is no type here
        assert "m510" in str(fault(lambda: c.create_sliver(request(None, ("w1", "m510")),
                                                         cm=1)))
        assert fault(lambda: c.sliver_status(cm=1)).code == GeniCode.SEARCHFAILED  # nothing held
        _, manifest = c.create_sliver(request(WISC, ("w1", None)), cm=1)  # its own node: yes
        assert parse(manifest, "rspec").node("w1").component_manager_id == WISC
        c.delete_slice(cm=1, cancel=True, blocking=True)


def test_renewed_at_the_sa_then_at_each_cm(box):
    with client(box, "renew") as c:
        c.register_slice()
        c.create_sliver(request(UTAH, ("u1", None)), cm=0)
        c.create_sliver(request(WISC, ("w1", None)), cm=1)
        later = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2)).replace(microsecond=0)
        err = fault(lambda: c.renew_slice(later, cm=0))
        assert err.code == GeniCode.ERROR and "renew the slice at the SA first" in str(err)
        c.renew_slice_sa(later)
        c.renew_slice(later, cm=0)

        def expires(i: int) -> dt.datetime | None:
            return parse(c.cm(i).resolve()["manifest"], "rspec").expires

        assert expires(0) == later and expires(1) < later  # wisc not renewed yet
        c.renew_slice(later, cm=1)
        assert expires(1) == later
        for i in (0, 1):
            c.delete_slice(cm=i, cancel=True, blocking=True)


def test_a_revocation_is_called_back_by_the_cm_holding_the_node(box, tmp_path):
    ep = CallbackEndpoint(box.dir, tmp_path, early=True, user_cert=True)
    try:
        with client(box, "revoke") as c:
            c.register_slice()
            c.create_sliver(request(UTAH, ("u1", None)), cm=0)
            c.create_sliver(request(WISC, ("w1", None), ("w2", None)), cm=1)
            for i in (0, 1):
                c.cm(i).set_slice_client_endpoint(ep.url, defwaittime=5)
            ids = {n.client_id: n.component_id.rsplit("+", 1)[-1]
                   for i in (0, 1) for n in c.sliver_status(cm=i).nodes}
            wisc = AdminClient(box.dir, cluster="wisc")
            with pytest.raises(RPCError, match="No such node"):  # utah's node is not wisc's
                wisc.call("Revoke", nodes=[ids["u1"]])
            assert wisc.call("Revoke", nodes=[ids["w2"]]) == {ids["w2"]: "reclaiming"}
            wait_for(lambda: "NotifyDeleteComplete" in ep.methods(), timeout=20,
                     what="NotifyDeleteComplete")
            notices = [(m, p, urn) for m, p, urn in ep.calls if m.startswith("NotifyDelete")]
            assert {urn for _, _, urn in notices} == {WISC}  # signed by wisc's CM only
            assert {n["client_id"] for _, p, _ in notices for n in p["nodelist"]} == {"w2"}
            values = {urn: {n["client_id"] for n in p["nodelist"]}
                      for m, p, urn in ep.calls if m == "SetResourceValues"}
            assert values[UTAH] == {"u1"} and values[WISC] <= {"w1", "w2"}
            assert [n.client_id for n in c.sliver_status(cm=1).nodes] == ["w1"]
            assert [n.client_id for n in c.sliver_status(cm=0).nodes] == ["u1"]
            assert [r["node_id"] for r in wisc.call("Report")] == [ids["w2"]]
            assert AdminClient(box.dir, cluster="utah").call("Report") == []
            for i in (0, 1):
                c.delete_slice(cm=i, cancel=True, blocking=True)
    finally:
        ep.close()


def test_other_tenants_load_one_cluster_only(box):
    utah, wisc = (AdminClient(box.dir, cluster=n) for n in ("utah", "wisc"))

    def tenants(admin: AdminClient) -> int:
        return sum(row["tenant"] for row in admin.call("Status")["pool"].values())

    before = tenants(utah), tenants(wisc), wisc.call("Status")["tenant_target"]
    try:
        assert utah.call("SetLoad", busy=before[0] + 5) == before[0] + 5
        wait_for(lambda: tenants(utah) == before[0] + 5, timeout=20, what="utah's tenants")
        assert (tenants(wisc), wisc.call("Status")["tenant_target"]) == before[1:]
    finally:
        utah.call("SetLoad", busy=0)
    wait_for(lambda: tenants(utah) == 0, timeout=20, what="utah's tenants gone")


def test_bad_cluster_names_are_one_line_and_exit_1(tmp_path: Path, box):
    runner = CliRunner()
    for args, says in ((["--cm", "utah", "--cm", "utah"], "cluster 'utah' given twice"),
                       (["--cm", "Utah"], "invalid cluster name 'Utah'"),
                       (["--cm", "mars"], "unknown cluster 'mars'"),
                       (["--cm", "mars="], "no inventory file")):
        result = runner.invoke(cli, ["emulator", "init", "--dir", str(tmp_path / "x"), *args])
        assert result.exit_code == 1 and says in result.output, result.output
        assert "Traceback" not in result.output and len(result.output.splitlines()) == 1
    assert not (tmp_path / "x").exists()
    result = runner.invoke(cli, ["emulator", "status", "--dir", str(box.dir), "--cm", "mars"])
    assert result.exit_code == 1 and "no cluster 'mars' (this box has: utah, wisc)" in \
        result.output and "Traceback" not in result.output
    result = runner.invoke(cli, ["emulator", "status", "--dir", str(box.dir), "--cm", "wisc",
                                 "--json"])
    assert result.exit_code == 0 and "c220g5" in result.output and "m510" not in result.output


def test_a_restarted_box_keeps_each_clusters_slivers(tmp_path: Path):
    d = init_emulator(tmp_path / "emu", 0, clusters=("utah", "wisc"))
    with EmulatorServer(d, port=0, **FAST) as server:
        with client(RunningEmulator(d, server), "again") as c:
            c.register_slice()
            c.create_sliver(request(WISC, ("w1", "c240g5")), cm=1)
    assert (d / "cms" / "wisc" / "state.db").exists()
    with pytest.raises(ConfigError, match="cluster 'mars', which this box does not have"):
        EmulatorServer(d, port=0, busy={"mars/AddNodes": 0.5}, **FAST).start()
    with EmulatorServer(d, port=0, **FAST) as server:
        with client(RunningEmulator(d, server), "again") as c:
            assert set(c.resolve_slice()["component_managers"]) == {WISC}
            status = c.sliver_status(cm=1)
            assert [n.client_id for n in status.nodes] == ["w1"]
            assert "+wisc.emulab.test+node+c240g5n" in status.nodes[0].component_id
            assert fault(lambda: c.sliver_status(cm=0)).code == GeniCode.SEARCHFAILED


def test_nodes_are_added_and_deleted_at_the_cm_that_holds_the_sliver(box):
    with client(box, "grow") as c:
        c.register_slice()
        c.create_sliver(request(UTAH, ("u1", None)), cm=0)
        c.create_sliver(request(WISC, ("w1", None)), cm=1)
        wisc_free = next(n.component_id.rsplit("+", 1)[-1]
                         for n in parse(c.discover_resources(available=True, cm=1),
                                        "rspec").nodes)
        err = fault(lambda: c.add_nodes({"u2": {"node": wisc_free}}, cm=0))
        assert err.code == GeniCode.BADARGS and f"{wisc_free} does not exist" in str(err)
        manifest = parse(c.add_nodes({"w2": {"node": wisc_free}}, cm=1), "rspec")
        assert {n.client_id for n in manifest.nodes} == {"w1", "w2"}
        assert manifest.node("w2").component_id.endswith(f"+wisc.emulab.test+node+{wisc_free}")
        assert {n.component_manager_id for n in manifest.nodes} == {WISC}
        assert "w1" in str(fault(lambda: c.delete_nodes(["w1"], cm=0)))  # not utah's
        assert [n.client_id for n in parse(c.delete_nodes(["w1"], cm=1), "rspec").nodes] == \
            ["w2"]
        assert [n.client_id for n in c.sliver_status(cm=0).nodes] == ["u1"]
        for i in (0, 1):
            c.delete_slice(cm=i, cancel=True, blocking=True)


def test_another_users_config_lists_every_cluster_too(box):
    from elasticslice.emulator.setup import issue_user
    files = issue_user(box.dir, "carol")
    cfg = load_config(files.config)
    assert cfg.cm_urls == load_config(box.config_path).cm_urls
    assert len(cfg.dynslice_urls) == 2 and cfg.slice_name == "carol"


def test_a_busy_cluster_leaves_the_other_alone(box):
    ctx = user_context(box.dir)
    cms = {name: xmlrpc.client.ServerProxy(url, context=ctx) for name, url in
           (("utah", load_config(box.config_path).cm_urls[0]),
            ("wisc", load_config(box.config_path).cm_urls[1]), ("plain", f"{box.url}/cm"))}

    def codes() -> dict[str, int]:
        return {name: cm.GetVersion({})["code"] for name, cm in cms.items()}

    try:
        box.server.pressure.set(busy={"wisc/GetVersion": 1.0})
        assert codes() == {"utah": 0, "wisc": GeniCode.BUSY, "plain": 0}
        box.server.pressure.set(busy={"utah/cm.GetVersion": 1.0})  # also at the SA's paths
        assert codes() == {"utah": GeniCode.BUSY, "wisc": 0, "plain": GeniCode.BUSY}
    finally:
        box.server.pressure.set(slow={}, busy={})
    assert codes() == {"utah": 0, "wisc": 0, "plain": 0}


def test_offline_commands_read_the_clusters_own_state(box):
    runner = CliRunner()
    utah_node = "ms1001"  # utah's (the built-in inventory), no node of wisc
    result = runner.invoke(cli, ["emulator", "log", "--dir", str(box.dir), "--cm", "wisc",
                                 utah_node])
    assert result.exit_code == 1 and f"no node {utah_node} in {box.dir / 'cms' / 'wisc'}" \
        in result.output
    result = runner.invoke(cli, ["emulator", "log", "--dir", str(box.dir), "--cm", "utah",
                                 utah_node])
    assert result.exit_code == 1 and "has no runlog" in result.output
    result = runner.invoke(cli, ["emulator", "report", "--dir", str(box.dir), "--cm", "mars"])
    assert result.exit_code == 1 and "no cluster 'mars'" in result.output
