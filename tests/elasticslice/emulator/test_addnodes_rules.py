"""AddNodes and execute services over the wire as CloudLab's CM takes them (R6, R7, R10-R12).

Sources (nmc-probe/emulab-portal): protogeni/lib/GeniCMV2.pm.in ``AddNodes`` reads exactly
diskimage, startup, tarballs, lans and node, pasting each into single-quoted XML attributes
("Could not parse XML for <node>"), and has no hardware type; protogeni/lib/GeniCM.pm.in
checks execute services ("Invalid service command: no command provided", TBcheck_dbslot's
"Invalid startup command: ...", "Invalid shell in execute"). The box took ``[command,
shell]``, ``[url, path]`` pairs, LAN structs and ``hardware_type``, and any command.
"""
from __future__ import annotations

import pytest

from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import NodeSpec, build_request, parse
from tests.elasticslice.emulator.helpers import Session, free_node, ok

pytestmark = pytest.mark.slow


def _add(s: Session, urn: str, cred: str, nodes: dict) -> dict:
    return s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": nodes})


@pytest.mark.parametrize("node,code,said", [
    ({"startup": ["exit 0", "sh"]}, GeniCode.BADARGS,
     "nodes[w1].startup: a list: CloudLab's CM would paste it as the command ARRAY(0x...)"),
    ({"hardware_type": "m400"}, GeniCode.BADARGS,
     "nodes[w1].hardware_type: unknown key: CloudLab's CM reads only"),
    ({"tarballs": [["http://127.0.0.1:1/a.tgz", "/opt"]]}, GeniCode.BADARGS,
     "nodes[w1].tarballs[0]: a list, such as a [url, path] pair"),
    ({"tarballs": "http://127.0.0.1:1/a.tgz"}, GeniCode.BADARGS,
     "tarballs for w1 is not a list"),
    ({"lans": [{"name": "lan0", "address": "10.9.0.1"}]}, GeniCode.BADARGS,
     "nodes[w1].lans[0]: a LAN struct"),
    ({"lans": ["nolan"]}, GeniCode.BADARGS, "No such nolan"),
    ({"node": "urn:publicid:IDN+emulab.test+node+pc01"}, GeniCode.BADARGS,
     "Physical node urn:publicid:IDN+emulab.test+node+pc01 does not exist"),
    ({"node": "pc999"}, GeniCode.BADARGS, "Physical node pc999 does not exist"),
    ({"startup": "echo 'hi'"}, GeniCode.ERROR, "Could not parse XML for w1: nodes[w1].startup"),
    ({"startup": "a && b"}, GeniCode.ERROR, "Could not parse XML for w1"),
    ({"startup": "x" * 256}, GeniCode.BADARGS, "Invalid startup command: Too Long"),
    ({"startup": "echo one\necho two"}, GeniCode.BADARGS,
     "Invalid startup command: Illegal Characters"),
    ({"startup": ""}, GeniCode.BADARGS, "Invalid service command: no command provided"),
])
def test_add_nodes_takes_what_cloudlabs_cm_takes_and_refuses_the_rest(emulator, node, code,
                                                                       said):
    s = Session(emulator)
    urn, cred, _ = s.create()
    answer = _add(s, urn, cred, {"w1": node})
    assert answer["code"] == code, answer
    assert said in answer["output"] and "\n" not in answer["output"]
    assert len(s.status(urn, cred)["details"]) == 2  # nothing was added


def test_a_node_named_by_someone_else_is_not_available_and_an_added_node_of_no_type_is_any(
        emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    pc = free_node(emulator)   # a machine by name (the sliver's are drawn at random)
    ok(_add(s, urn, cred, {"w1": {"node": pc, "startup": "exit 0", "lans": ["lan0"]}}))
    taken = _add(s, urn, cred, {"w2": {"node": pc}})
    assert taken["code"] == GeniCode.BADARGS and f"Physical node {pc} is not available" in \
        taken["output"]
    manifest = parse(ok(_add(s, urn, cred, {f"a{i}": {} for i in range(12)})))
    kinds = {n.hardware_type for n in manifest.nodes if n.client_id.startswith("a")}
    assert len(kinds) > 1, kinds  # any free node: not the inventory's default type


@pytest.mark.parametrize("executes,said", [
    ([("sh", "x" * 256)], "node n: Invalid startup command: Too Long"),
    ([("sh", "printf 'a\\tb'\n")], "node n: Invalid startup command: Illegal Characters"),
    ([("sh", "")], "node n: Invalid service command: no command provided"),
    ([("sh", "true"), ("/bin/bash", "true")], "node n: Invalid shell in execute"),
])
def test_create_sliver_holds_execute_services_to_the_cms_rules(emulator, executes, said):
    s = Session(emulator)
    urn, cred = s.register()
    rspec = build_request([NodeSpec("n", executes=executes)], validate=False)
    answer = s.cm.CreateSliver({"slice_urn": urn, "rspec": rspec, "credentials": [cred]})
    assert answer["code"] == GeniCode.BADARGS and said in answer["output"], answer


def test_several_executes_in_sh_or_csh_and_one_long_line_split_are_taken(emulator):
    s = Session(emulator)
    urn, cred = s.register()
    rspec = build_request([NodeSpec("n", executes=[("sh", "true"), ("/bin/csh", "x" * 300)]),
                           NodeSpec("m", executes=[("bash", "x" * 255)])])
    ok(s.cm.CreateSliver({"slice_urn": urn, "rspec": rspec, "credentials": [cred]}))
