"""Builders: output validates against the packaged XSDs and parses back to the same records."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from elasticslice.rspec import (
    Interface, Link, LinkSpec, Login, Node, NodeSpec, RSpecError, RSpecType,
    build_advertisement, build_manifest, build_request, parse, validate,
)

IMAGE = "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD"
CM = "urn:publicid:IDN+emulab.net+authority+cm"


def _request_nodes() -> list[NodeSpec]:
    return [
        NodeSpec("node-0", hardware_type="d430", disk_image=IMAGE,
                 component_id="urn:publicid:IDN+emulab.net+node+pc17", component_manager_id=CM,
                 interfaces=[("node-0:if0", "10.10.1.1", "255.255.255.0")],
                 installs=[("https://example.org/agent.tgz", "/local")],
                 executes=[("bash", "/local/agent/start.sh")], routable_control_ip=True),
        NodeSpec("node-1", sliver_type="emulab-xen", exclusive=False,
                 interfaces=[("node-1:if0", None, None)]),
    ]


def test_build_request_validates_and_round_trips() -> None:
    links = [LinkSpec("lan0", ["node-0:if0", "node-1:if0"], vlan_tagging=True,
                      link_multiplexing=True, best_effort=False)]
    xml = build_request(_request_nodes(), links)
    assert validate(xml, strict=True) == []
    rspec = parse(xml)
    assert rspec.type is RSpecType.REQUEST
    first, second = rspec.nodes
    assert (first.client_id, first.hardware_type, first.sliver_type, first.disk_image) == \
        ("node-0", "d430", "raw-pc", IMAGE)
    assert first.component_id == "urn:publicid:IDN+emulab.net+node+pc17"
    assert first.component_manager_id == CM
    assert first.exclusive is True and second.exclusive is False
    assert first.interfaces[0].ip == "10.10.1.1"
    assert first.interfaces[0].netmask == "255.255.255.0"
    assert first.installs == [("https://example.org/agent.tgz", "/local")]
    assert first.executes == [("bash", "/local/agent/start.sh")]
    assert first.routable_control_ip is True and second.routable_control_ip is False
    assert second.sliver_type == "emulab-xen" and second.disk_image is None
    (lan,) = rspec.links
    assert lan.interfaces == ["node-0:if0", "node-1:if0"]
    assert (lan.link_type, lan.vlan_tagging, lan.link_multiplexing, lan.best_effort) == \
        ("lan", True, True, False)


@pytest.mark.parametrize("nodes,links,fragment", [
    ([], [], "at least one node"),
    ([NodeSpec("a"), NodeSpec("a")], [], "duplicate node client_id 'a'"),
    ([NodeSpec("")], [], "needs a client_id"),
    ([NodeSpec("a")], [LinkSpec("l", ["a:if9"])], "unknown interface 'a:if9'"),
])
def test_build_request_refuses_bad_specs(nodes, links, fragment) -> None:
    with pytest.raises(RSpecError, match=fragment):
        build_request(nodes, links)


def _manifest_nodes() -> list[Node]:
    return [Node(
        client_id=f"node-{i}", component_id=f"urn:publicid:IDN+emulab.net+node+pc{i}",
        component_manager_id=CM, component_name=f"pc{i}", exclusive=True,
        sliver_id=f"urn:publicid:IDN+emulab.net+sliver+{100 + i}", hardware_type="d430",
        sliver_type="raw-pc", disk_image=IMAGE, hostname=f"node-{i}.s.p.emulab.net",
        ipv4=f"155.98.36.{i + 1}",
        logins=[Login("alice", f"pc{i}.emulab.net", 22)],
        interfaces=[Interface(f"node-{i}:if0", f"10.10.1.{i + 1}", "255.255.255.0",
                              f"02:00:00:00:00:0{i}", f"urn:publicid:IDN+emulab.net+sliver+{200 + i}")],
        executes=[("sh", "/local/start.sh")],
    ) for i in range(3)]


def test_build_manifest_round_trips_every_field() -> None:
    expires = datetime(2026, 12, 1, 12, 30, tzinfo=timezone.utc)
    nodes = _manifest_nodes()
    links = [Link("lan0", "urn:publicid:IDN+emulab.net+sliver+300",
                  [n.interfaces[0].client_id for n in nodes], "lan", True, False, None, "259")]
    xml = build_manifest(nodes, links, expires)
    assert validate(xml) == []
    rspec = parse(xml)
    assert rspec.type is RSpecType.MANIFEST and rspec.expires == expires
    for built, parsed in zip(nodes, rspec.nodes):
        parsed.hardware_types = []  # the parser also lists every hardware_type
        assert parsed == built
    assert rspec.links == links


def test_manifest_host_ipv4_is_a_real_world_extension_not_in_the_strict_xsd() -> None:
    xml = build_manifest(_manifest_nodes()[:1], [], None)
    assert validate(xml) == []
    problems = validate(xml, strict=True)
    assert any("ipv4" in p.message for p in problems)


def test_build_advertisement_counts_by_type() -> None:
    nodes = [Node(component_id=f"urn:publicid:IDN+emulab.net+node+pc{i}", component_name=f"pc{i}",
                  hardware_types=["d430", "pc"] if i < 4 else ["m510"], available=i % 2 == 0,
                  disk_image=IMAGE) for i in range(6)]
    xml = build_advertisement(nodes, CM)
    assert validate(xml, strict=True) == []
    rspec = parse(xml)
    assert rspec.type is RSpecType.ADVERTISEMENT
    assert rspec.total_by_type == {"d430": 4, "m510": 2, "pc": 4}
    assert rspec.available_by_type == {"d430": 2, "m510": 1, "pc": 2}
    node = rspec.nodes[0]
    assert (node.component_manager_id, node.exclusive, node.available, node.sliver_type) == \
        (CM, True, True, "raw-pc")


def test_build_advertisement_v2_uses_the_protogeni_v2_namespace() -> None:
    nodes = [Node(component_id="urn:publicid:IDN+emulab.net+node+pc1", hardware_types=["d430"],
                  available=True)]
    xml = build_advertisement(nodes, CM, version="2")
    assert "http://www.protogeni.net/resources/rspec/2" in xml
    rspec = parse(xml)
    assert rspec.version == "2" and rspec.available_by_type == {"d430": 1}
    with pytest.raises(RSpecError, match="unsupported advertisement version"):
        build_advertisement(nodes, CM, version="1")
    with pytest.raises(RSpecError, match="component_id"):
        build_advertisement([Node()], CM)


def test_bind_to_cm_binds_the_nodes_that_name_no_cm_and_leaves_the_others() -> None:
    from elasticslice.errors import HostileXMLError
    from elasticslice.rspec import bind_to_cm
    wisc = "urn:publicid:IDN+wisc.emulab.test+authority+cm"
    request = build_request([NodeSpec(client_id="a"), NodeSpec(client_id="b")])
    bound = parse(bind_to_cm(request, wisc))
    assert [n.component_manager_id for n in bound.nodes] == [wisc, wisc]
    mixed = request.replace('client_id="b"', f'client_id="b" component_manager_id="{CM}"')
    again = parse(bind_to_cm(mixed, wisc))
    assert {n.client_id: n.component_manager_id for n in again.nodes} == {"a": wisc, "b": CM}
    assert bind_to_cm(bind_to_cm(request, wisc), wisc) == bind_to_cm(request, wisc)
    with pytest.raises(HostileXMLError):
        bind_to_cm('<!DOCTYPE x [<!ENTITY e "x">]><rspec>&e;</rspec>', wisc)
