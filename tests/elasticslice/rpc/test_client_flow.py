"""ProtoGeniServer against the emulator over real TLS: the whole life of a slice."""
from __future__ import annotations

import datetime as dt

import pytest

from elasticslice.commands.client import add_nodes_arguments
from elasticslice.errors import RPCError
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.credential import expires_of, parse_credential
from elasticslice.rspec import BadAddNodesArgs, parse
from elasticslice.rspec.parse import count_nodes
from tests.helpers import wait_for

from .helpers import genilib_request, hours


def _ready(server, count):
    def check():
        status = server.sliver_status()
        return status if status.ready and len(status.nodes) == count else None
    return check


def test_slice_life_through_the_api(emu):
    with emu.client() as server:
        assert str(server.get_version()) == "1.01"
        assert server.cm().get_version()["api"] == 2
        cred = server.register_slice(expiration=hours(4))
        slice_urn = server.slice_urn()
        assert slice_urn.endswith(":elasticslice+slice+elastic")
        assert parse_credential(cred).target_urn == slice_urn
        assert server.resolve_slice()["urn"] == slice_urn

        sliver_cred, manifest = server.create_sliver(genilib_request("node0", "node1"))
        assert {n.client_id for n in parse(manifest).nodes} == {"node0", "node1"}
        assert parse_credential(sliver_cred).owner_urn == server.user_urn
        status = wait_for(_ready(server, 2), timeout=20, what="two nodes ready")
        assert {n.client_id for n in status.nodes} == {"node0", "node1"}
        assert all(n.component_id.startswith("urn:publicid:IDN+") for n in status.nodes)

        free = count_nodes(server.discover_resources(available=True)).free_by_type
        args = add_nodes_arguments(["node2", "node3"], "m400", None, free)
        assert all(set(a) == {"node"} and a["node"] in free["m400"] for a in args.values())
        manifest = server.add_nodes(args)  # AddNodes has no type: free m400s by name
        assert {"node2", "node3"} <= {n.client_id for n in parse(manifest).nodes}
        status = wait_for(_ready(server, 4), timeout=20, what="four nodes ready")
        assert {n.hardware_type for n in parse(manifest).nodes
                if n.client_id in ("node2", "node3")} == {"m400"}

        manifest = server.delete_nodes(["node0", "node2"])
        assert {n.client_id for n in parse(manifest).nodes} == {"node1", "node3"}
        assert {n.client_id for n in server.sliver_status().nodes} == {"node1", "node3"}

        answer = server.renew(hours(10))
        assert answer.startswith(hours(10).strftime("%Y-%m-%dT%H"))
        assert expires_of(server.get_slice_credential()) >= hours(9.9)

        server.delete_slice()
        with pytest.raises(RPCError) as info:
            server.sliver_status()
        assert info.value.code == GeniCode.SEARCHFAILED
        # every call of this life went over one keep-alive connection
        assert server.transport.connections_opened == 1


def test_second_create_sliver_is_refused(emu):
    with emu.client() as server:
        server.register_slice()
        server.create_sliver(genilib_request("a"))
        with pytest.raises(RPCError) as info:
            server.create_sliver(genilib_request("b"))
        assert info.value.code == GeniCode.REFUSED and info.value.method == "CreateSliver"
        assert "REFUSED" in str(info.value)


def test_register_twice_is_an_error(emu):
    with emu.client() as server:
        server.register_slice()
        with pytest.raises(RPCError) as info:
            server.register_slice()
        assert info.value.code == GeniCode.ERROR


def test_discover_compressed_and_plain(emu):
    with emu.client() as server:
        compressed = server.discover_resources(compress=True)
        plain = server.discover_resources(compress=False)
        total = parse(compressed)
        assert parse(plain).total_by_type == total.total_by_type
        assert sum(total.total_by_type.values()) > 0
        server.register_slice()
        server.create_sliver(genilib_request("x", "y", hardware_type="m510"))
        free = parse(server.discover_resources(available=True))
        assert free.available_by_type["m510"] == total.available_by_type["m510"] - 2


def test_resolve_user_slice_sliver_and_hrn(emu):
    with emu.client() as server:
        user = server.resolve_user()
        assert user["urn"] == server.user_urn
        server.register_slice()
        server.create_sliver(genilib_request("a"))
        hrn = f"{server.domain}:elasticslice.elastic"
        assert server.resolve_slice(hrn)["urn"] == server.slice_urn()
        assert server.resolve_user()["slices"] == [server.slice_urn()]
        resolved = server.cm().resolve()
        assert resolved["urn"] == server.slice_urn() and "manifest" in resolved
        node = server.sliver_status().nodes[0].component_id
        assert server.cm().resolve(node)["urn"] == node


def test_dynamic_slice_endpoint(emu):
    with emu.client() as server:
        defaults = server.cm().get_server_defaults()
        assert defaults["policy"] in ("LIFO", "CLIENT") and defaults["maxwaittime"] > 0
        server.register_slice()
        server.create_sliver(genilib_request("a"))
        server.cm().set_slice_client_endpoint("https://127.0.0.1:9/callback", "LIFO", 10)
        with pytest.raises(RPCError):
            server.cm().set_slice_client_endpoint("https://127.0.0.1:9/callback", "LIFO",
                                                  defaults["maxwaittime"] + 1)
        server.cm().remove_slice_client_endpoint()


def test_several_cms_are_addressed_by_name(emu):
    urls = f"{emu.url}/cm, {emu.url}/cm/2.0"
    dyn = f"{emu.url}/dynslice {emu.url}/dynslice"
    with emu.client(ELASTICSLICE_CM_URLS=urls, ELASTICSLICE_DYNSLICE_URLS=dyn) as server:
        assert len(server.cms) == 2
        assert server.cm("2.0").url.endswith("/cm/2.0")
        server.register_slice()
        server.create_sliver(genilib_request("a"), cm="2.0")
        assert server.sliver_status(cm=0).nodes[0].client_id == "a"


def test_credentials_are_cached_on_disk_and_reused(emu):
    with emu.client() as server:
        server.register_slice(expiration=hours(2))
        first = server.get_slice_credential()
    with emu.client() as again:  # a new process would read the same files
        assert again.get_slice_credential() == first
        assert again.get_credential() == server.get_credential()
        assert expires_of(first) > dt.datetime.now(dt.timezone.utc)


def test_sliver_credential_keys_and_delete_sliver(emu):
    with emu.client() as server:
        assert isinstance(server.get_keys(), list)
        server.register_slice()
        first, _ = server.create_sliver(genilib_request("a"))
        sliver_cred = server.cm().get_sliver()
        sliver_urn = parse_credential(sliver_cred).target_urn
        assert "+sliver+" in sliver_urn and parse_credential(first).target_urn == sliver_urn
        # classic clients ask SliverStatus with the sliver credential
        value = server.cm().call("SliverStatus", {"slice_urn": server.slice_urn(),
                                                  "credentials": [sliver_cred]})
        assert value["status"] in ("ready", "notready", "changing")
        wait_for(lambda: server.sliver_status().ready, timeout=20, what="ready")
        server.cm().delete_sliver(sliver_urn)
        with pytest.raises(RPCError) as info:
            server.sliver_status()
        assert info.value.code == GeniCode.SEARCHFAILED


def test_add_nodes_refuses_what_cloudlabs_cm_would_misread_before_any_call(emu):
    """The client sent ``[command, shell]`` whenever a shell was set, ``[url, path]`` pairs,
    LAN structs and ``hardware_type``: CloudLab's CM would have run ``ARRAY(0x...)``."""
    with emu.client() as server:
        server.register_slice(expiration=hours(2))
        server.create_sliver(genilib_request("a"))
        for node, key in (({"startup": ["uptime", "sh"]}, "nodes[w].startup"),
                          ({"startup": "echo 'x'"}, "nodes[w].startup"),
                          ({"hardware_type": "m400"}, "nodes[w].hardware_type"),
                          ({"tarballs": [["http://h/a.tgz", "/opt"]]}, "nodes[w].tarballs[0]"),
                          ({"lans": [{"name": "lan0"}]}, "nodes[w].lans[0]")):
            with pytest.raises(BadAddNodesArgs) as info:  # not an RPCError: never sent
                server.add_nodes({"w": node})
            assert info.value.key == key and "\n" not in str(info.value)
        assert [n.client_id for n in server.sliver_status().nodes] == ["a"]
