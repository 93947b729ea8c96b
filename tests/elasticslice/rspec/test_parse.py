"""Parsing the shared examples, real-world manifests and geni-lib's output."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from elasticslice.rspec import RSpecError, RSpecType, parse, validate
from tests.helpers import SHARED

EXAMPLES = SHARED / "protogeni" / "rspec-schemas"
IMAGE = "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD"


def test_parse_v2_example_manifest() -> None:
    path = EXAMPLES / "2" / "examples" / "manifest.xml"
    rspec = parse(path.read_bytes(), source=str(path))
    # The v2 example still says type="request"; its sliver_ids make it a manifest.
    assert rspec.type is RSpecType.MANIFEST and rspec.version == "2"
    left, right = rspec.nodes
    assert left.client_id == "left" and left.sliver_id == "urn:publicid:IDN+emulab.net+sliver+8673"
    assert left.component_id == "urn:publicid:IDN+emulab.net+node+pc17"
    assert left.disk_image == "urn:publicid:IDN+emulab.net+image+emulab-ops/FBSD61-STD"
    assert left.logins[0].hostname == "pc17.emulab.net" and left.logins[0].port == 22
    assert left.interfaces[0].mac == "13:11:22:33:44:55"
    assert right.interfaces[0].client_id == "right:if0"
    (center,) = rspec.links
    assert center.client_id == "center" and center.interfaces == ["left:if0", "right:if0"]


def test_parse_user_extension_example_manifest() -> None:
    path = EXAMPLES / "ext" / "user" / "1" / "examples" / "manifest.xml"
    rspec = parse(path.read_bytes(), source=str(path))
    (node,) = rspec.nodes
    assert node.client_id == "PC"
    assert node.hostname == "PC.jon2.jonlab-tbres-emulab-net.jonlab.tbres.emulab.net"
    assert node.component_name == "pc27"  # from emulab:vnode
    assert [(lg.username, lg.hostname, lg.port) for lg in node.logins] == \
        [("flooby", "pc27.emulab.net", 22)]
    assert validate(path.read_bytes()) == []


def test_parse_v2_advertisement_example_counts() -> None:
    rspec = parse((EXAMPLES / "2" / "examples" / "type-relation.xml").read_bytes())
    assert rspec.type is RSpecType.ADVERTISEMENT
    assert rspec.total_by_type == {"pc": 3, "pc3000": 2, "pc600": 1}


CLOUDLAB_MANIFEST = """<?xml version="1.0" encoding="UTF-8"?>
<rspec xmlns="http://www.geni.net/resources/rspec/3"
  xmlns:emulab="http://www.protogeni.net/resources/rspec/ext/emulab/1"
  type="manifest" expires="2026-11-22T10:00:00Z">
  <node client_id="node-0" component_id="urn:publicid:IDN+utah.cloudlab.us+node+ms0812"
        component_manager_id="urn:publicid:IDN+utah.cloudlab.us+authority+cm"
        sliver_id="urn:publicid:IDN+utah.cloudlab.us+sliver+1234" exclusive="true">
    <sliver_type name="raw-pc"><disk_image name="{image}"/></sliver_type>
    <interface client_id="node-0:if0" sliver_id="urn:publicid:IDN+utah.cloudlab.us+sliver+1235"
               mac_address="ecb1d7852a0c"><ip address="10.10.1.1" type="ipv4" netmask="255.255.255.0"/></interface>
    <emulab:vnode name="ms0812" hardware_type="m510" disk_image="{image}"/>
    <host name="node-0.es.proj.utah.cloudlab.us" ipv4="128.110.152.12"/>
    <services><login authentication="ssh-keys" hostname="ms0812.utah.cloudlab.us" port="22" username="alice"/></services>
  </node>
  <link client_id="lan0" sliver_id="urn:publicid:IDN+utah.cloudlab.us+sliver+1236" vlantag="259">
    <interface_ref client_id="node-0:if0"/>
    <emulab:vlan_tagging enabled="true"/>
  </link>
</rspec>""".replace("{image}", IMAGE)


def test_parse_cloudlab_manifest_with_attributes_the_xsd_lacks() -> None:
    rspec = parse(CLOUDLAB_MANIFEST, source="cloudlab.xml")
    assert rspec.expires == datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
    node = rspec.node("node-0")
    assert node.ipv4 == "128.110.152.12" and node.hardware_type == "m510"
    assert node.hostname == "node-0.es.proj.utah.cloudlab.us"
    assert node.interfaces[0].ip == "10.10.1.1" and node.interfaces[0].mac == "ecb1d7852a0c"
    assert rspec.links[0].vlantag == "259" and rspec.links[0].vlan_tagging is True
    assert validate(CLOUDLAB_MANIFEST) == []
    assert validate(CLOUDLAB_MANIFEST, strict=True)  # host@ipv4 and vnode extras


def test_to_json_dict_has_exactly_the_issue_shape() -> None:
    data = json.loads(json.dumps(parse(CLOUDLAB_MANIFEST).to_json_dict()))
    assert list(data) == ["type", "expires", "nodes", "links", "available_by_type",
                          "total_by_type"]
    assert data["type"] == "manifest" and data["expires"] == "2026-11-22T10:00:00Z"
    (node,) = data["nodes"]
    assert set(node) == {"client_id", "component_id", "component_manager_id", "sliver_id",
                         "hardware_type", "sliver_type", "disk_image", "hostname", "ipv4",
                         "logins", "interfaces", "available"}
    assert node["logins"] == [{"username": "alice", "hostname": "ms0812.utah.cloudlab.us",
                               "port": 22}]
    assert node["interfaces"] == [{"client_id": "node-0:if0", "ip": "10.10.1.1",
                                   "mac": "ecb1d7852a0c"}]
    assert data["links"] == [{"client_id": "lan0", "interfaces": ["node-0:if0"],
                              "vlan_tagging": True, "link_multiplexing": None}]


def _geni_lib_request() -> str:
    import geni.rspec.pg as pg

    request = pg.Request()
    lan = pg.LAN("lan0")
    lan.vlan_tagging = True
    lan.link_multiplexing = True
    lan.best_effort = True
    for index in range(3):
        node = pg.RawPC(f"node-{index}")
        node.disk_image = IMAGE
        node.hardware_type = "d430"
        node.routable_control_ip = index == 0
        node.addService(pg.Install(url="https://example.org/agent.tgz", path="/local"))
        node.addService(pg.Execute(shell="bash", command="/local/agent/start.sh"))
        iface = node.addInterface("if0")
        iface.addAddress(pg.IPv4Address(f"10.10.1.{index + 1}", "255.255.255.0"))
        lan.addInterface(iface)
        request.addResource(node)
    request.addResource(lan)
    return request.toXMLString(pretty_print=True).decode()


def test_parse_and_validate_geni_lib_output() -> None:
    xml = _geni_lib_request()
    assert 'sliver_type name="raw"' in xml
    assert validate(xml, source="geni-lib") == []
    rspec = parse(xml, source="geni-lib")
    assert [n.client_id for n in rspec.nodes] == ["node-0", "node-1", "node-2"]
    node = rspec.nodes[0]
    assert node.sliver_type == "raw-pc" and node.disk_image == IMAGE
    assert node.hardware_type == "d430" and node.routable_control_ip is True
    assert rspec.nodes[1].routable_control_ip is False
    assert node.installs == [("https://example.org/agent.tgz", "/local")]
    assert node.executes == [("bash", "/local/agent/start.sh")]
    assert node.interfaces[0].ip == "10.10.1.1"
    (lan,) = rspec.links
    assert lan.interfaces == ["node-0:if0", "node-1:if0", "node-2:if0"]
    assert (lan.vlan_tagging, lan.link_multiplexing, lan.best_effort) == (True, True, True)


@pytest.mark.parametrize("xml,fragment", [
    ("<foo/>", "not an RSpec: root element is 'foo'"),
    ('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="bogus"/>', "unknown rspec type"),
    ('<rspec xmlns="http://www.geni.net/resources/rspec/3" type="manifest" expires="soon"/>',
     "expires='soon'"),
])
def test_parse_refuses_what_is_not_an_rspec(xml: str, fragment: str) -> None:
    with pytest.raises(RSpecError, match=fragment) as info:
        parse(xml, source="x.xml")
    assert str(info.value).startswith("x.xml:1: ")
