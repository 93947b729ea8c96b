"""The C RSpec reader (elasticslice/rspec/_fastrspec.c) gives what the Python reader gives:
the same records for every RSpec the tests know, and where the Python reader refuses a
document, the same one-line error (the C reader hands every doubt back to it)."""
from __future__ import annotations

import random
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from elasticslice.errors import HostileXMLError, RSpecError
from elasticslice.rspec import fast, parse
from elasticslice.rspec.parse import _parse
from elasticslice.rspec.safexml import DEFAULT_MAX_BYTES
from troy.native import compiler

ROOT = Path(__file__).resolve().parents[3]
NS = ('xmlns="http://www.geni.net/resources/rspec/3" '
      'xmlns:emulab="http://www.protogeni.net/resources/rspec/ext/emulab/1"')


def python_reader(doc: str | bytes) -> Any:
    return _parse(doc, "doc", DEFAULT_MAX_BYTES, use_c=False)


def outcome(read: Any, doc: str | bytes) -> tuple[Any, ...]:
    try:
        return ("records", read(doc))
    except RSpecError as err:   # HostileXMLError is one
        return ("refused", type(err).__name__, str(err))


def same(doc: str | bytes) -> tuple[Any, ...]:
    """Both readers' outcome, which must be one."""
    ours, theirs = outcome(lambda d: parse(d, "doc"), doc), outcome(python_reader, doc)
    assert ours == theirs, doc
    return ours


def test_make_builds_the_reader_and_parse_uses_it() -> None:
    """A set-up with a C compiler has the reader loaded (make runs fastbuild): a build
    that broke would otherwise only show as slower parses."""
    if compiler() is None:
        pytest.skip("no C compiler here: RSpecs are read in Python")
    assert fast.problem() is None
    doc = f'<rspec {NS} type="manifest"><node client_id="a"/></rspec>'.encode()
    assert fast.read(doc) is not None


def known_documents() -> list[Path]:
    found = sorted((ROOT / "rspecs").glob("*.xml"))
    found += sorted((ROOT / "tests" / "data").rglob("*.xml"))
    found += sorted((ROOT / "tests" / "hostile" / "corpus" / "rspecs").glob("*.xml"))
    return found


@pytest.mark.parametrize("path", known_documents(), ids=lambda p: p.name)
def test_every_document_the_tests_know_reads_the_same(path: Path) -> None:
    same(path.read_bytes())


def test_the_benchmarks_documents_read_the_same_and_in_c() -> None:
    import sys
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_rspec import make_advertisement, make_manifest
    for doc in (make_advertisement(60), make_manifest(40)):
        kind, rspec = same(doc)
        assert kind == "records" and rspec.nodes
        assert fast.problem() is not None or fast.read(doc.encode()) is not None


NODE = """<node client_id="n{i}" component_id="urn:c{i}" component_manager_id="urn:cm"
      component_name="pc{i}" sliver_id="urn:s{i}" exclusive="{exclusive}">
  <sliver_type name="{sliver}"><disk_image name="{image}" default="{default}"/>
    <disk_image url="https://img/{i}" default="true"/></sliver_type>
  <hardware_type name="m510"/><hardware_type name=""/><hardware_type name="pc"/>
  <interface client_id="n{i}:if0" mac_address="02:00:00:00:00:0{i}" component_id="urn:i{i}">
    <ip address="10.0.0.{i}" netmask="255.0.0.0"/><ip address="10.9.9.9"/></interface>
  <interface component_id="urn:j{i}"/>
  <available now="{available}"/>
  <services><login username="alice" hostname="pc{i}.x" port="{port}"/>
    <login username="bob" authentication="ssh-keys"/>
    <execute shell="sh" command="a 2&gt;&amp;1 &#38;&#x41;"/><execute/>
    <install url="https://t/{i}.tgz" install_path="/local"/><install install_path=""/>
  </services>
  <emulab:vnode name="v{i}" hardware_type="d430" disk_image="urn:img:v"/>
  <emulab:routable_control_ip/>
  <host name="n{i}.x" ipv4="192.0.2.{i}"/>
  <other:thing xmlns:other="urn:other" name="ignored"><node client_id="deep"/></other:thing>
</node>"""

LINK = """<link client_id="lan0" sliver_id="urn:l" vlantag="259">
  <interface_ref client_id="n1:if0"/><interface_ref client_id="" component_id="urn:j1"/>
  <interface_ref/><link_type name="lan"/>
  <emulab:vlan_tagging enabled="{flag}"/><emulab:link_multiplexing/>
  <emulab:best_effort enabled="no"/></link>"""

EDGES = {
    "booleans with spaces": dict(exclusive=" true ", available="\tfalse\n", default=" true"),
    "booleans as words": dict(exclusive="yes", available="1", default="True"),
    "not booleans": dict(exclusive="maybe", available="", default="TRUE"),
    "a port with spaces": dict(port=" 22 "),
    "a port that is not a number": dict(port="ssh"),
    "an empty port": dict(port=""),
    "a long port": dict(port="9" * 80),
    "a port in other digits": dict(port="\u0662\u0662"),
    "non-ASCII booleans": dict(exclusive="true\u00a0", available="\u2003true"),
    "non-ASCII names": dict(image="urn:image:caf\u00e9-\U0001F600", sliver="r\u00e1w"),
    "the raw alias": dict(sliver="raw"),
    "an empty image name": dict(image=""),
    "link flags": dict(flag=" false "),
    "link flags not words": dict(flag="sure"),
}
DEFAULTS = dict(exclusive="true", available="true", default="false", port="22",
                image="urn:image:a", sliver="raw-pc", flag="true")


def document(kind: str = "manifest", head: str = "", **values: str) -> str:
    fill = {**DEFAULTS, **values}
    nodes = "".join(NODE.format(i=i, **fill) for i in (1, 2))
    return (f'{head}<rspec {NS} type="{kind}" expires="2030-01-01T00:00:00Z">{nodes}'
            f'<emulab:portal name="x"/>{LINK.format(**fill)}</rspec>')


@pytest.mark.parametrize("kind", ["manifest", "advertisement", "request"])
@pytest.mark.parametrize("case", sorted(EDGES))
def test_edge_cases_read_the_same(case: str, kind: str) -> None:
    same(document(kind, **EDGES[case]))


@pytest.mark.parametrize("doc", [
    document(head='<?xml version="1.0" encoding="UTF-8"?>\n<!-- a comment --><?pi x?>'),
    document().encode("utf-16"),
    ('<?xml version="1.0" encoding="ISO-8859-1"?>' + document(image="caf\u00e9")
     ).encode("latin-1"),
    document().replace("<rspec ", "<r:rspec xmlns:r='http://www.geni.net/resources/rspec/3' "
                       ).replace("</rspec>", "</r:rspec>"),
    document().replace(NS, 'xmlns="http://www.protogeni.net/resources/rspec/2" '
                       'xmlns:emulab="http://www.protogeni.net/resources/rspec/ext/emulab/1"'),
    document().replace('<node client_id="n2"', '<node xmlns="urn:elsewhere" client_id="n2"'),
    document().replace('client_id="n1"', 'client_id="n1" emulab:client_id="other"'),
    document().replace("<services>", "<services><![CDATA[ text ]]>"),
    document().replace('name="m510"', 'name="m510" name="x"'),
    document().replace('<node client_id="n1"', '<node client_id="n1" bad:x="1"'),
    document().replace('&amp;', '&nbsp;'),
    document().replace("</rspec>", ""),
    document().replace('type="manifest"', 'type="nonsense"'),
    document().replace('expires="2030-01-01T00:00:00Z"', 'expires="soon"'),
    document().replace("<rspec ", "<rspek ").replace("</rspec>", "</rspek>"),
    document().replace('type="manifest"', 'type="request"'),
    '<!-- ' + "x" * 5000 + ' -->' + document(),
], ids=["declaration-comment-pi", "utf-16", "latin-1", "prefixed", "v2", "foreign-node",
        "namespaced-attribute", "cdata", "attribute-twice", "undeclared-prefix",
        "undeclared-entity", "truncated", "bad-type", "bad-expires", "not-rspec",
        "request-with-slivers", "late-comment"])
def test_documents_around_the_edges_read_the_same(doc: str | bytes) -> None:
    same(doc)


def test_an_advertisement_counts_the_same() -> None:
    _, rspec = same(document("advertisement", available="true"))
    assert rspec.total_by_type == {"m510": 2, "pc": 2}
    assert rspec.available_by_type == {"m510": 2, "pc": 2}
    _, none_free = same(document("advertisement", available="false"))
    assert none_free.available_by_type == {"m510": 0, "pc": 0}


def test_records_the_c_reader_makes_are_whole_records() -> None:
    """Made without running __init__: every field is there, lists are the node's own, and
    the records behave as any other (mutable, comparable, printable)."""
    rspec = parse(document())
    one, two = rspec.nodes
    assert one.disk_images == [] and one.disk_images is not two.disk_images
    one.hardware_types.append("x")
    assert two.hardware_types == ["m510", "pc"]
    assert "client_id='n1'" in repr(one)
    assert one.logins[1].port is None and one.logins[0].port == 22
    assert rspec.links[0].interfaces == ["n1:if0", "urn:j1"]


def test_mutated_documents_read_the_same() -> None:
    """A few hundred random corruptions of a document that uses every element: each gives
    the same records or the same refusal from both readers."""
    rng = random.Random(36)
    base = document()
    alphabet = ['<', '>', '"', "'", '&', ' ', '/', '=', ':', 'x', '\u00e9', '&amp;', '&#0;',
                '<!DOCTYPE x>', ']]>', '\n']
    refused = read = 0
    for _ in range(400):
        doc = base
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(doc))
            what = rng.random()
            if what < 0.4:
                doc = doc[:at] + doc[at + rng.randint(1, 8):]
            elif what < 0.8:
                doc = doc[:at] + rng.choice(alphabet) + doc[at:]
            else:
                end = min(len(doc), at + rng.randint(1, 40))
                doc = doc[:at] + doc[at:end] * 2 + doc[end:]
        kind = same(doc)[0]
        refused += kind == "refused"
        read += kind == "records"
    assert refused > 50 and read > 50   # both kinds of outcome were compared


def test_a_late_doctype_is_refused_and_fetches_nothing() -> None:
    """Past the prolog scan (4 KiB of comment first), a DOCTYPE naming a local server: the
    C reader stops at it, the Python reader refuses it, nobody connects."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    connected: list[object] = []

    def accept() -> None:
        try:
            connected.append(server.accept())
        except OSError:
            pass
    thread = threading.Thread(target=accept)
    thread.start()
    doc = ('<!-- ' + "x" * 5000 + ' -->'
           f'<!DOCTYPE rspec SYSTEM "http://127.0.0.1:{port}/x.dtd" [<!ENTITY e "boom">]>'
           + document().replace('name="m510"', 'name="&e;"'))
    try:
        assert fast.read(doc.encode()) is None
        with pytest.raises(HostileXMLError, match="DOCTYPE"):
            parse(doc)
    finally:
        thread.join()
        server.close()
    assert connected == []


def same_counts(doc: str | bytes) -> tuple[Any, ...]:
    from elasticslice.rspec.parse import _count_nodes, count_nodes
    ours = outcome(lambda d: count_nodes(d, "doc"), doc)
    theirs = outcome(lambda d: _count_nodes(d, "doc", DEFAULT_MAX_BYTES, use_c=False), doc)
    assert ours == theirs, doc
    return ours


@pytest.mark.parametrize("kind", ["advertisement", "manifest"])
@pytest.mark.parametrize("case", sorted(EDGES))
def test_counts_from_the_c_reader_are_the_python_counts(case: str, kind: str) -> None:
    """count_nodes (the manager's every cycle) from the C reader's records: the same counts
    and free names, including a node that names itself only by its component_id."""
    doc = document(kind, **EDGES[case]).replace('component_name="pc2"', "")
    kind_of, counts = same_counts(doc)
    assert kind_of == "refused" or counts.nodes == 2


def test_counts_of_a_node_named_by_its_vnode_only_are_the_python_counts() -> None:
    """Without component_name, parse names a node after its emulab:vnode and the count
    after its component_id: the C reader leaves those to the Python count."""
    doc = document("advertisement").replace('component_name="pc1"', "")
    _, counts = same_counts(doc)
    assert counts.free_by_type["m510"] == ["urn:c1", "pc2"]
    assert parse(doc).nodes[0].component_name == "v1"


def test_mutated_advertisements_count_the_same() -> None:
    rng = random.Random(37)
    base = document("advertisement")
    for _ in range(150):
        at = rng.randrange(len(base))
        doc = base[:at] + rng.choice(['<', '"', '&', ' ', 'x', '/>', '']) + \
            base[at + rng.randint(0, 4):]
        same_counts(doc)


def test_the_benchmarks_advertisement_counts_the_same() -> None:
    import sys
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_rspec import make_advertisement
    _, counts = same_counts(make_advertisement(90))
    assert counts.nodes == 90 and counts.available == 60
