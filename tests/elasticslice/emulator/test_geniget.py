"""geni-get on every node, as CloudLab's (tmcd.c's commands), from the node's own data. Nodes
had only ELASTICSLICE_* variables, which no CloudLab node has."""
from __future__ import annotations

import json

import pytest

from elasticslice.rspec import parse
from tests.elasticslice.emulator.helpers import Session, ok
from tests.elasticslice.emulator.node_helpers import add_node, detail_of, exited

pytestmark = pytest.mark.slow

LAN = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="n1"><interface client_id="n1:if0"/></node>
  <node client_id="n2"><interface client_id="n2:if0"/></node>
  <link client_id="lan0"><interface_ref client_id="n1:if0"/><interface_ref client_id="n2:if0"/>
  </link></rspec>"""


def test_geni_get_client_id_and_manifest_give_the_nodes_own(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=LAN)
    commands = ("geni-get client_id > /tmp/client_id; geni-get manifest > /tmp/manifest; "
                "geni-get slice_urn > /tmp/slice_urn; geni-get -a > /tmp/all; "
                "geni-get commands > /tmp/commands; geni-get control_mac > /tmp/mac; "
                "geni-get sliverstatus > /tmp/sliverstatus; geni-get status > /tmp/status")
    nodes = {}
    for cid in ("w1", "w2"):
        nodes[cid] = add_node(s, urn, cred, cid, commands, lans=["lan0"])  # the CM's address
    for cid, node in nodes.items():
        assert exited(s, urn, cred, cid)["execute_status"] == 0
        root = node / "root" / "tmp"  # the user writes there
        assert (root / "client_id").read_text() == f"{cid}\n"
        assert (root / "slice_urn").read_text() == f"{urn}\n"
        manifest = parse((root / "manifest").read_text())
        mine = next(n for n in manifest.nodes if n.client_id == cid)
        given = next(n for n in parse(ok(s.cm.Resolve({"urn": urn, "credentials": [cred]}))[
            "manifest"]).nodes if n.client_id == cid)
        assert [(i.ip, i.netmask) for i in mine.interfaces] == \
            [(i.ip, i.netmask) for i in given.interfaces] != []
        assert mine.interfaces[0].ip.startswith("10.")
        assert {n.client_id for n in manifest.nodes} >= {"n1", "n2", cid}
        everything = json.loads((root / "all").read_text())
        assert everything["client_id"] == cid and everything["slice_urn"] == urn
        assert "client_id" in json.loads((root / "commands").read_text())
        mac = (root / "mac").read_text().strip()
        assert len(mac) == 12 and int(mac, 16) >= 0
        status = json.loads((root / "sliverstatus").read_text())
        assert status["geni_resources"] and json.loads((root / "status").read_text())
    details = [detail_of(s, urn, cred, cid) for cid in nodes]
    assert all(d["status"] == "ready" for d in details)


def test_geni_get_refuses_what_a_node_cannot_have(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    commands = ("geni-get key > /tmp/key 2> /tmp/key.err; echo $? > /tmp/key.status; "
                "geni-get certificate 2> /tmp/cert.err; echo $? > /tmp/cert.status; "
                "geni-get param foo 2> /tmp/param.err; echo $? > /tmp/param.status; "
                "geni-get nosuch 2> /tmp/nosuch.err; echo $? > /tmp/nosuch.status")
    node = add_node(s, urn, cred, "w1", commands)
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    root = node / "root" / "tmp"  # the user writes there
    for name, said in (("key", "not available"), ("cert", "not available"),
                       ("param", "undefined parameter"), ("nosuch", "unknown request")):
        assert (root / f"{name}.status").read_text() == "1\n"
        assert said in (root / f"{name}.err").read_text()
    assert (root / "key").read_text() == ""


def test_a_node_asks_with_its_own_key_only(emulator):
    """The node configuration server knows a node by its key, which only that node has: no
    key, or another's, and it answers nothing."""
    import urllib.error
    import urllib.request
    s = Session(emulator)
    urn, cred, _ = s.create()
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {"w1": {}}}))
    url = emulator.server.ctx.node_config_url
    for key in ("", "guess"):
        request = urllib.request.Request(f"{url}/geni/client_id", headers={"X-Geni-Key": key})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 403


def test_a_node_gone_mid_answer_is_no_traceback_on_the_emulators_stderr(capsys) -> None:
    """A node rebooted (or deleted) while its geni-get waited for the answer: the write
    fails with a broken pipe, which socketserver printed as a traceback on serve's stderr
    (seen in a chaos run with reboots); any other error is still logged."""
    import logging

    from elasticslice.emulator.tmcd import NodeConfigServer
    server = NodeConfigServer(None)  # type: ignore[arg-type]
    try:
        for gone in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset")):
            try:
                raise gone
            except OSError:
                server.handle_error(None, ("100.64.0.9", 4242))
        assert capsys.readouterr().err == ""
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logging.getLogger("elasticslice.emulator.tmcd").addHandler(handler)
        try:
            try:
                raise ValueError("a real bug")
            except ValueError:
                server.handle_error(None, ("100.64.0.9", 4242))
        finally:
            logging.getLogger("elasticslice.emulator.tmcd").removeHandler(handler)
        assert [r.levelname for r in records] == ["ERROR"] and records[0].exc_info
    finally:
        server.server_close()
