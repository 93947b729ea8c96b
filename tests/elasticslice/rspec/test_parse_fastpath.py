"""Edge cases of the event parser's fast path: nodes are finished lazily (when the next
top-level element starts, or at the end), records are built positionally, and the cyclic
garbage collector is paused only while parsing."""
from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from elasticslice.errors import HostileXMLError, RSpecError
from elasticslice.rspec import RSpecType, parse

HEAD = ('<rspec xmlns="http://www.geni.net/resources/rspec/3" '
        'xmlns:emulab="http://www.protogeni.net/resources/rspec/ext/emulab/1" type="{type}">')

FULL_NODE = """
  <node client_id="n0" component_id="urn:c0" component_manager_id="urn:cm" component_name="pc0"
        sliver_id="urn:s0" exclusive="false">
    <sliver_type name="raw"><disk_image url="https://img/x"/></sliver_type>
    <hardware_type name="m510"/>
    <interface client_id="n0:if0" sliver_id="urn:si0" component_id="urn:ci0"
               mac_address="02:00:00:00:00:01"><ip address="10.0.0.1" netmask="255.0.0.0"/>
    </interface>
    <services>
      <login authentication="ssh-keys" hostname="pc0.example" username="alice" port="2222"/>
      <install url="https://t/x.tgz" install_path="/local"/>
      <execute shell="sh" command="run.sh"/>
    </services>
    <emulab:routable_control_ip/>
    <host name="n0.example" ipv4="192.0.2.1"/>
  </node>"""


@pytest.fixture
def gc_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_every_node_field_lands_in_its_place() -> None:
    node = parse(HEAD.format(type="manifest") + FULL_NODE + "</rspec>").nodes[0]
    assert (node.client_id, node.component_id, node.component_manager_id,
            node.component_name, node.sliver_id, node.exclusive) == (
        "n0", "urn:c0", "urn:cm", "pc0", "urn:s0", False)
    assert (node.hardware_type, node.hardware_types, node.sliver_type, node.disk_image) == (
        "m510", ["m510"], "raw-pc", "https://img/x")
    assert (node.hostname, node.ipv4, node.available, node.routable_control_ip) == (
        "n0.example", "192.0.2.1", None, True)
    (login,) = node.logins
    assert (login.username, login.hostname, login.port, login.authentication) == (
        "alice", "pc0.example", 2222, "ssh-keys")
    (iface,) = node.interfaces
    assert (iface.client_id, iface.ip, iface.netmask, iface.mac, iface.sliver_id,
            iface.component_id) == ("n0:if0", "10.0.0.1", "255.0.0.0", "02:00:00:00:00:01",
                                    "urn:si0", "urn:ci0")
    assert node.installs == [("https://t/x.tgz", "/local")]
    assert node.executes == [("sh", "run.sh")]


def test_nodes_do_not_share_their_lists() -> None:
    rspec = parse(HEAD.format(type="request") + '<node client_id="a"/><node client_id="b"/>'
                  "</rspec>")
    a, b = rspec.nodes
    a.logins.append("x")  # type: ignore[arg-type]
    a.interfaces.append("x")  # type: ignore[arg-type]
    a.installs.append(("u", "p"))
    a.executes.append(("s", "c"))
    a.hardware_types.append("t")
    assert (b.logins, b.interfaces, b.installs, b.executes, b.hardware_types) == (
        [], [], [], [], [])


def test_last_node_is_finished_at_the_end_of_the_document() -> None:
    xml = (HEAD.format(type="manifest") + '<node client_id="a" sliver_id="s">'
           '<emulab:vnode name="pc7" hardware_type="d430" disk_image="urn:img"/></node>'
           "</rspec>")
    (node,) = parse(xml).nodes
    assert (node.component_name, node.hardware_type, node.disk_image) == (
        "pc7", "d430", "urn:img")


def test_top_level_elements_after_a_node_do_not_touch_it() -> None:
    xml = (HEAD.format(type="advertisement")
           + '<node component_id="urn:n1"><hardware_type name="pc"/><available now="true"/>'
           '<emulab:vnode name="pc1" hardware_type="m400"/></node>'
           '<rspec_shared_vlan><available name="vlan1"/><hardware_type name="bogus"/>'
           '<interface component_id="urn:i"/><host name="h"/></rspec_shared_vlan>'
           '<link client_id="l"><available now="false"/><interface_ref client_id="x"/>'
           "</link></rspec>")
    rspec = parse(xml)
    (node,) = rspec.nodes
    assert (node.available, node.hardware_types, node.interfaces, node.hostname) == (
        True, ["pc"], [], None)
    assert node.hardware_type == "pc" and node.component_name == "pc1"
    assert rspec.links[0].interfaces == ["x"]
    assert rspec.total_by_type == {"pc": 1} and rspec.available_by_type == {"pc": 1}


def test_deeper_elements_of_a_node_are_ignored() -> None:
    xml = (HEAD.format(type="manifest") + '<node client_id="a" sliver_id="s"><services>'
           '<wrapper><login username="nobody"/></wrapper></services>'
           '<interface client_id="a:0"><x><ip address="1.2.3.4"/></x></interface></node>'
           "</rspec>")
    (node,) = parse(xml).nodes
    assert node.logins == [] and node.interfaces[0].ip is None


@pytest.mark.usefixtures("gc_enabled")
@pytest.mark.parametrize("xml, error", [
    (HEAD.format(type="request") + '<node client_id="a"/></rspec>', None),
    (HEAD.format(type="request") + '<node client_id="a">', RSpecError),
    ('<other xmlns="urn:x"/>', RSpecError),
    ('<?xml version="1.0"?><!DOCTYPE r [<!ENTITY e "x">]><r/>', HostileXMLError),
])
def test_garbage_collection_is_back_on_after_parse(xml: str, error: type | None) -> None:
    if error is None:
        assert parse(xml).type is RSpecType.REQUEST
    else:
        with pytest.raises(error):
            parse(xml)
    assert gc.isenabled()


def test_garbage_collection_stays_off_when_the_caller_turned_it_off() -> None:
    was = gc.isenabled()
    gc.disable()
    try:
        parse(HEAD.format(type="request") + '<node client_id="a"/></rspec>')
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
