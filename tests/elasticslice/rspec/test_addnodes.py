"""CM v2 AddNodes arguments as CloudLab's CM reads them (protogeni/lib/GeniCMV2.pm.in,
``AddNodes``): exactly diskimage, startup (one string), tarballs (URLs, at /), lans (names)
and node; both ways, and the errors that name the bad key. (The client sent
``[command, shell]``, ``[url, path]`` pairs, LAN structs and ``hardware_type``, and the
box's CM took them all: CloudLab would have run ``ARRAY(0x...)`` and mapped any type.)"""
from __future__ import annotations

import random
import xmlrpc.client

import pytest

from elasticslice.rspec import (
    AddNodesXMLError, BadAddNodesArgs, NodeSpec, add_nodes_args, check_add_args,
    nodespecs_from_add_args, pin_add_args,
)

IMAGE = "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD"


def test_add_nodes_args_carry_the_five_keys_and_a_type_only_as_a_wish() -> None:
    specs = [
        NodeSpec("node-4", hardware_type="d430", disk_image=IMAGE,
                 component_id="urn:publicid:IDN+emulab.net+node+pc17",
                 installs=[("https://example.org/agent.tgz", "/")],
                 executes=[("sh", "/local/agent/start.sh")]),
        NodeSpec("node-5", hardware_type="m510", executes=[("", "uptime")]),
    ]
    args = add_nodes_args(specs, lans=["lan0"])
    assert args == {
        "node-4": {"diskimage": IMAGE, "node": "pc17", "startup": "/local/agent/start.sh",
                   "tarballs": ["https://example.org/agent.tgz"], "lans": ["lan0"]},
        "node-5": {"hardware_type": "m510", "startup": "uptime", "lans": ["lan0"]},
    }
    xmlrpc.client.dumps(({"nodes": args},))  # marshals: no None anywhere


def test_round_trip_through_the_inverse() -> None:
    specs = [NodeSpec("n1", disk_image=IMAGE, component_id="pc3",
                      interfaces=[("n1:lan0", None, None)], lans=["lan0"],
                      installs=[("https://a/b.tgz", "/")], executes=[("sh", "go")])]
    assert nodespecs_from_add_args(add_nodes_args(specs)) == specs


def test_per_node_lans_mapping() -> None:
    args = add_nodes_args([NodeSpec("a"), NodeSpec("b")], lans={"b": ["lan1"]})
    assert args == {"a": {}, "b": {"lans": ["lan1"]}}


def test_the_cm_reading_of_the_five_keys() -> None:
    (spec,) = nodespecs_from_add_args({"n": {"startup": "echo hi", "tarballs": ["https://a/t.tgz"],
                                             "lans": ["lan0"], "node": "pc17"}})
    assert spec.executes == [("sh", "echo hi")]
    assert spec.installs == [("https://a/t.tgz", "/")]
    assert spec.lans == ["lan0"] and spec.interfaces == [("n:lan0", None, None)]
    assert spec.component_id == "pc17" and spec.hardware_type is None


@pytest.mark.parametrize("nodes,key,said", [
    ([], "nodes", "nodes is not a hash"),
    ({}, "nodes", "no nodes given"),
    ({"bad id": {}}, "nodes[bad id]", "client_id must be"),
    ({"n": "pc1"}, "nodes[n]", "n is not a hash"),
    ({"n": {"diskimag": IMAGE}}, "nodes[n].diskimag", "would silently ignore it"),
    ({"n": {"hardware_type": "m510"}}, "nodes[n].hardware_type",
     "AddNodes has no hardware type"),
    ({"n": {"diskimage": 7}}, "nodes[n].diskimage", "expected a non-empty string"),
    ({"n": {"startup": ["exit 0", "sh"]}}, "nodes[n].startup", "ARRAY(0x...)"),
    ({"n": {"startup": 5}}, "nodes[n].startup", "one command string"),
    ({"n": {"startup": ""}}, "nodes[n].startup", "Invalid service command: no command"),
    ({"n": {"tarballs": "https://a/t.tgz"}}, "nodes[n].tarballs",
     "tarballs for n is not a list"),
    ({"n": {"tarballs": [["https://a/t.tgz", "/opt"]]}}, "nodes[n].tarballs[0]",
     "[url, path] pair"),
    ({"n": {"lans": "lan0"}}, "nodes[n].lans", "lans for n is not a list"),
    ({"n": {"lans": [{"name": "lan0", "address": "10.0.0.1"}]}}, "nodes[n].lans[0]",
     "LAN names only"),
    ({"n": {"node": "urn:publicid:IDN+emulab.net+node+pc17"}}, "nodes[n].node",
     "bare physical node name"),
])
def test_what_the_cm_would_ignore_or_misread_is_refused_naming_the_key(nodes, key,
                                                                        said) -> None:
    with pytest.raises(BadAddNodesArgs) as info:
        nodespecs_from_add_args(nodes)
    assert info.value.key == key and not isinstance(info.value, AddNodesXMLError)
    assert str(info.value).startswith(f"{key}: ") and said in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("cid,args,key", [
    ("n", {"startup": "echo 'hi'"}, "nodes[n].startup"),
    ("n", {"startup": "a < b"}, "nodes[n].startup"),
    ("n", {"startup": "a && b"}, "nodes[n].startup"),
    ("n", {"diskimage": IMAGE + "&x"}, "nodes[n].diskimage"),
    ("n", {"tarballs": ["https://a/t'.tgz"]}, "nodes[n].tarballs[0]"),
    ("n", {"lans": ["la<n"]}, "nodes[n].lans[0]"),
    ("n'1", {}, "nodes[n'1] (its client_id)"),
])
def test_a_quote_lt_or_amp_breaks_the_cms_xml(cid, args, key) -> None:
    """GeniCMV2.pm.in pastes every value into single-quoted XML attributes: the CM answers
    ERROR "Could not parse XML for <client_id>"."""
    with pytest.raises(AddNodesXMLError) as info:
        nodespecs_from_add_args({cid: args})
    assert str(info.value).startswith(f"Could not parse XML for {cid}: {key} holds ")


@pytest.mark.parametrize("command,said", [
    ("a" * 256, "Invalid startup command: Too Long (256 characters; at most 255)"),
    ("echo hi\n", "Invalid startup command: Illegal Characters ('\\n' at character 8"),
    ("echo\thi", "Illegal Characters ('\\t'"),
    ("echo h\u00e9", "Illegal Characters"),
    ("true\0", "Illegal Characters"),
])
def test_the_startup_command_rule_of_tbcheck_dbslot(command, said) -> None:
    """GeniCM.pm.in: TBcheck_dbslot($cmd, "virt_nodes", "startupcmd"): printable ASCII, and
    at most 255 characters (the tinytext column; html_tinytext says 256)."""
    with pytest.raises(BadAddNodesArgs) as info:
        nodespecs_from_add_args({"n": {"startup": command}})
    assert info.value.key == "nodes[n].startup" and said in str(info.value)
    assert nodespecs_from_add_args({"n": {"startup": "a" * 255}})[0].executes


def test_add_nodes_args_refuse_what_the_cm_cannot_take_before_any_call() -> None:
    cases = [
        (NodeSpec("n", executes=[("sh", "a"), ("sh", "b")]), "one startup command"),
        (NodeSpec("n", executes=[("bash", "go")]), "no shell choice"),
        (NodeSpec("n", executes=[("sh", "x" * 300)]), "Too Long"),
        (NodeSpec("n", installs=[("https://h/a.tgz", "/opt")]), "installs tarballs at /"),
        (NodeSpec("n", lans=["lan0"], interfaces=[("n:if0", "10.0.0.2", None)]),
         "LAN names only"),
    ]
    for spec, said in cases:
        with pytest.raises(BadAddNodesArgs, match=said) as info:
            add_nodes_args([spec])
        assert info.value.key.startswith("nodes[n].")
    with pytest.raises(AddNodesXMLError):
        add_nodes_args([NodeSpec("n", executes=[("sh", "echo 'x'")])])
    with pytest.raises(BadAddNodesArgs, match="duplicate"):
        add_nodes_args([NodeSpec("n"), NodeSpec("n")])


def test_a_wished_type_becomes_a_free_node_of_that_type_each_a_different_one() -> None:
    args = {f"w{i}": {"hardware_type": "m400", "startup": "go"} for i in range(3)}
    args["pinned"] = {"node": "ms0102"}
    args["any"] = {}
    free = {"m400": ["ms0101", "ms0102", "ms0103", "ms0104"], "m510": ["ms1001"]}
    wire, left_out = pin_add_args(args, free, rng=random.Random(1))
    assert left_out == []
    check_add_args(wire)  # the wire struct: the five keys only
    nodes = [wire[f"w{i}"]["node"] for i in range(3)]
    assert len(set(nodes)) == 3 and set(nodes) <= {"ms0101", "ms0103", "ms0104"}
    assert wire["pinned"] == {"node": "ms0102"} and wire["any"] == {}
    assert all("hardware_type" not in a for a in wire.values())


def test_fewer_free_than_wanted_leaves_the_others_out() -> None:
    args = {f"w{i}": {"hardware_type": "xl170"} for i in range(3)}
    wire, left_out = pin_add_args(args, {"xl170": ["hp01"]})
    assert list(wire) == ["w0"] and wire["w0"] == {"node": "hp01"}
    assert left_out == ["w1", "w2"]
    assert pin_add_args({"a": {"hardware_type": "d430"}}, {}) == ({}, ["a"])
