"""AddNodes argument checks: a hostile client_id used to be echoed whole into the BADARGS
answer (100 KB of it), and a trailing newline slipped through the client_id pattern."""
from __future__ import annotations

import re

import pytest

from elasticslice.rspec import BadAddNodesArgs, NodeSpec, add_nodes_args, nodespecs_from_add_args


def test_huge_client_id_is_not_echoed_whole():
    with pytest.raises(BadAddNodesArgs) as err:
        nodespecs_from_add_args({"y" * 100_000: {}})
    assert len(str(err.value)) < 200
    assert err.value.key == f"nodes[{'y' * 32}...]"


@pytest.mark.parametrize("cid", ["node-1\n", "", "a b"])
def test_bad_client_ids_are_refused_both_ways(cid):
    with pytest.raises(BadAddNodesArgs):
        nodespecs_from_add_args({cid: {}})
    with pytest.raises(BadAddNodesArgs):
        add_nodes_args([NodeSpec(cid)])


@pytest.mark.parametrize("args, key, words", [
    # broke: accepted, then the node failed to boot: "Argument list too long" (and CloudLab's
    # CM refuses any startup command over its tinytext column)
    ({"startup": "true;" * 14000}, "nodes[n].startup", "Too Long (70000 characters"),
    ({"startup": "true\0"}, "nodes[n].startup", "Illegal Characters"),
    # broke: a LAN struct's address went into the manifest as given (CloudLab's CM takes
    # LAN names only and gives the address itself)
    ({"lans": [{"name": "lan0", "address": "999.1.1.1"}]}, "nodes[n].lans[0]",
     "LAN names only"),
])
def test_startup_commands_no_node_could_run_and_lan_addresses_are_refused(args, key, words):
    with pytest.raises(BadAddNodesArgs, match=re.escape(words)) as err:
        nodespecs_from_add_args({"n": args})
    assert err.value.key == key
    good = {"startup": "true", "lans": ["l"]}
    assert nodespecs_from_add_args({"n": good})[0].executes == [("sh", "true")]
