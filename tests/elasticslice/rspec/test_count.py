"""count_nodes (what the manager reads from an advertisement each cycle) counts exactly what
parse() finds, and refuses exactly what parse() refuses, with the same one line."""
from __future__ import annotations

import pytest

from elasticslice.rspec import Interface, Node, RSpecType, build_advertisement, parse
from elasticslice.rspec.parse import count_nodes
from tests.helpers import REPO, SHARED

EXAMPLES = SHARED / "protogeni" / "rspec-schemas"
CORPUS = REPO / "tests" / "hostile" / "corpus" / "rspecs"
CM = "urn:publicid:IDN+utah.cloudlab.us+authority+cm"


def advertisement(version: str = "3") -> str:
    types = [["m510", "pc"], ["xl170"], ["m510"], []]
    nodes = [Node(component_id=f"urn:publicid:IDN+utah.cloudlab.us+node+pc{i}",
                  component_name=f"pc{i}", component_manager_id=CM, exclusive=True,
                  available=[True, False, None][i % 3], hardware_types=types[i % 4],
                  sliver_type="raw-pc",
                  interfaces=[Interface(component_id=f"pc{i}:eth0")])
             for i in range(13)]
    return build_advertisement(nodes, CM, version=version, validate=False)


def expected(xml: str | bytes):
    r = parse(xml)
    return (r.type, len(r.nodes), sum(1 for n in r.nodes if n.available),
            sum(1 for n in r.nodes if n.available is not False), r.total_by_type,
            r.available_by_type)


def got(xml: str | bytes):
    c = count_nodes(xml)
    return (c.type, c.nodes, c.available, c.not_unavailable, c.total_by_type,
            c.available_by_type)


@pytest.mark.parametrize("xml", [
    advertisement("3"), advertisement("2"),
    (EXAMPLES / "2" / "examples" / "type-relation.xml").read_bytes(),
    (EXAMPLES / "2" / "examples" / "manifest.xml").read_bytes(),
    (REPO / "rspecs" / "lan-4.xml").read_bytes(),
], ids=["ad-v3", "ad-v2", "v2-example-ad", "v2-example-manifest", "request"])
def test_counts_are_what_parse_finds(xml):
    assert got(xml) == expected(xml)


def test_an_advertisement_counts_types_and_availability():
    c = count_nodes(advertisement())
    assert c.type is RSpecType.ADVERTISEMENT and c.nodes == 13
    # available for i % 3 == 0 (the builder writes the others as not available)
    assert (c.available, c.not_unavailable) == (5, 5)
    assert c.total_by_type == {"m510": 7, "pc": 4, "xl170": 3}
    assert c.available_by_type == {"m510": 3, "pc": 2, "xl170": 1}


def test_a_node_that_does_not_say_counts_as_not_unavailable():
    xml = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="advertisement">
      <node component_id="a"><hardware_type name="m510"/><available now="true"/></node>
      <node component_id="b"><hardware_type name="m510"/></node>
      <node component_id="c"><hardware_type name="m510"/><available now="false"/></node>
      <node component_id="d"><x><hardware_type name="deep"/></x></node>
    </rspec>"""
    c = count_nodes(xml)
    assert (c.nodes, c.available, c.not_unavailable) == (4, 1, 3)
    assert c.total_by_type == {"m510": 3} and c.available_by_type == {"m510": 1}
    assert got(xml) == expected(xml)


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.xml")))
def test_hostile_and_broken_documents_fail_as_parse_fails(name):
    data = (CORPUS / name).read_bytes()

    def outcome(fn):
        try:
            fn(data, source=name)
        except Exception as e:  # noqa: BLE001
            return type(e), str(e)
        return None

    if outcome(parse) is None:
        assert outcome(count_nodes) is None
    else:
        assert outcome(count_nodes) == outcome(parse)
        assert "\n" not in outcome(count_nodes)[1]
