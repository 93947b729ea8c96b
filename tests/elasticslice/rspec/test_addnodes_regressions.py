"""AddNodes argument checks: a hostile client_id used to be echoed whole into the BADARGS
answer (100 KB of it), and a trailing newline slipped through the client_id pattern."""
from __future__ import annotations

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
