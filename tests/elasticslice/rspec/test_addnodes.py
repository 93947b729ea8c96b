"""CM v2 AddNodes arguments, both ways, and the errors that name the bad key."""
from __future__ import annotations

import xmlrpc.client

import pytest

from elasticslice.rspec import BadAddNodesArgs, NodeSpec, add_nodes_args, nodespecs_from_add_args

IMAGE = "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD"


def test_add_nodes_args_shape() -> None:
    specs = [
        NodeSpec("node-4", hardware_type="d430", disk_image=IMAGE,
                 component_id="urn:publicid:IDN+emulab.net+node+pc17",
                 interfaces=[("node-4:if0", "10.10.1.5", "255.255.255.0")],
                 installs=[("https://example.org/agent.tgz", "/local")],
                 executes=[("bash", "/local/agent/start.sh")]),
        NodeSpec("node-5", executes=[("", "uptime")]),
    ]
    args = add_nodes_args(specs, lans=["lan0"])
    assert args == {
        "node-4": {"diskimage": IMAGE, "hardware_type": "d430", "node": "pc17",
                   "startup": ["/local/agent/start.sh", "bash"],
                   "tarballs": [["https://example.org/agent.tgz", "/local"]],
                   "lans": [{"name": "lan0", "address": "10.10.1.5", "netmask": "255.255.255.0",
                             "type": "ipv4"}]},
        "node-5": {"startup": "uptime", "lans": ["lan0"]},
    }
    xmlrpc.client.dumps(({"nodes": args},))  # marshals: no None anywhere


def test_round_trip_through_the_inverse() -> None:
    specs = [NodeSpec("n1", hardware_type="m510", disk_image=IMAGE, component_id="pc3",
                      interfaces=[("n1:if0", "10.0.0.2", "255.0.0.0")], lans=["lan0"],
                      installs=[("https://a/b.tgz", "/opt")], executes=[("bash", "go")])]
    assert nodespecs_from_add_args(add_nodes_args(specs)) == specs


def test_per_node_lans_mapping() -> None:
    args = add_nodes_args([NodeSpec("a"), NodeSpec("b")], lans={"b": ["lan1"]})
    assert args == {"a": {}, "b": {"lans": ["lan1"]}}


def test_inverse_accepts_the_loose_forms() -> None:
    (spec,) = nodespecs_from_add_args({"n": {"startup": "echo hi", "tarballs": ["https://a/t.tgz"],
                                             "lans": ["lan0"]}})
    assert spec.executes == [("sh", "echo hi")]
    assert spec.installs == [("https://a/t.tgz", "/")]
    assert spec.lans == ["lan0"] and spec.interfaces == [("n:if0", None, None)]


@pytest.mark.parametrize("nodes,key", [
    ([], "nodes"),
    ({}, "nodes"),
    ({"bad id": {}}, "nodes[bad id]"),
    ({"n": "pc1"}, "nodes[n]"),
    ({"n": {"diskimag": IMAGE}}, "nodes[n].diskimag"),
    ({"n": {"diskimage": 7}}, "nodes[n].diskimage"),
    ({"n": {"startup": ["a", "b", "c"]}}, "nodes[n].startup"),
    ({"n": {"tarballs": "https://a"}}, "nodes[n].tarballs"),
    ({"n": {"tarballs": [["https://a"]]}}, "nodes[n].tarballs[0]"),
    ({"n": {"lans": [{"name": "lan0", "vlan": 3}]}}, "nodes[n].lans[0].vlan"),
    ({"n": {"lans": [{"address": "10.0.0.1"}]}}, "nodes[n].lans[0].name"),
])
def test_bad_args_name_the_key(nodes, key) -> None:
    with pytest.raises(BadAddNodesArgs) as info:
        nodespecs_from_add_args(nodes)
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: ")


def test_add_nodes_args_refuses_what_the_cm_cannot_take() -> None:
    with pytest.raises(BadAddNodesArgs, match="one startup command"):
        add_nodes_args([NodeSpec("n", executes=[("sh", "a"), ("sh", "b")])])
    with pytest.raises(BadAddNodesArgs, match="duplicate"):
        add_nodes_args([NodeSpec("n"), NodeSpec("n")])
