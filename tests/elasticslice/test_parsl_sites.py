"""Parsl's blocks span sites (issue 37, item 3): a ``CloudLabProvider`` on a box of two
CMs (utah, whose inventory is two nodes, and wisc) holds a sliver at each; once utah is
full, the next block's node is added at wisc, its worker pool joins the one interchange
(encrypted, its own key) and runs Parsl apps; when Parsl's strategy scales in (the blocks
idle for ``max_idletime``), each block's node goes back at its own CM, but for each
sliver's first node (CloudLab refuses to take a sliver's every node: docs/parsl.md)."""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

from elasticslice.managers.sites import cm_name
from tests.elasticslice.parslbox import managers_of, parsl_on_box
from tests.elasticslice.sitesbox import UTAH_NODES, held_per_cm, small_first_site
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


def test_blocks_get_nodes_at_the_second_cm_and_each_node_goes_back_at_its_own(
        tmp_path: Path) -> None:
    from parsl.jobs.states import JobState
    with small_first_site(tmp_path / "box") as box:
        with parsl_on_box(box, tmp_path, max_blocks=4, max_idletime=2.0) as on:
            provider, executor = on.provider, on.executor
            # eight tasks held at the gate: Parsl's strategy asks for four blocks of two
            # workers, and every task runs at once
            squares = [on.square(i, on.gate.url) for i in range(8)]
            wait_for(lambda: sum(m["tasks"] for m in executor.connected_managers()) == 8,
                     timeout=50, what="eight tasks running on four blocks")
            blocks = list(provider.book.blocks.values())
            bound = {cid: block for block in blocks for cid in block.nodes}
            assert len(blocks) == 4 and len(bound) == 4, blocks
            held = held_per_cm(box, tmp_path / "look")
            site_of = {cid: site for site, cids in held.items() for cid in cids}
            # utah is full, each of its nodes a block's; the other two blocks' nodes are at
            # wisc, where no node without a block is left (its sliver's first node, if it
            # came before a block wanted it, went back once a block's node came)
            assert len(held["utah"]) == UTAH_NODES and set(held["utah"]) <= set(bound), held
            at_wisc = held["wisc"]
            assert len(at_wisc) == 2 and set(at_wisc) <= set(bound), held
            # the wisc nodes' pools joined the interchange, each with its own key, and run
            # two tasks each
            assert set(at_wisc) <= set(provider.keys.allowed())
            for cid in at_wisc:
                assert sum(m["tasks"] for m in managers_of(executor,
                                                           bound[cid].block_id)) == 2
            on.gate.open()
            results = [f.result(timeout=60) for f in squares]
            assert [r[0] for r in results] == [i * i for i in range(8)]
            assert on.total(*squares).result(timeout=60) == sum(i * i for i in range(8))
            ran = collections.Counter(site_of[node] for _, node in results)
            assert ran == {"utah": 4, "wisc": 4}, results
            # idle: Parsl cancels every block; each block's node goes back at its own CM,
            # but one node at each (CloudLab refuses to take a sliver's last node)
            wait_for(lambda: [s.state for s in provider.status([b.job_id for b in blocks])]
                     == [JobState.CANCELLED] * 4, timeout=30, what="the blocks cancelled")

            def one_each() -> dict[str, list[str]] | None:
                now = held_per_cm(box, tmp_path / "look")
                return now if all(len(cids) == 1 for cids in now.values()) else None
            kept = wait_for(one_each, timeout=30, what="one node left at each CM")
            assert set(kept["utah"]) < set(held["utah"]) and set(kept["wisc"]) < set(at_wisc)
            gone = set(bound) - set(kept["utah"]) - set(kept["wisc"])
            assert len(gone & set(at_wisc)) == 1, (held, kept)
            # the nodes given back: their keys are allowed no more (withdrawn by the
            # daemon's event thread once it recorded them gone)
            wait_for(lambda: not gone & set(provider.keys.allowed()), timeout=30,
                     what="the given-back nodes' keys withdrawn")
            records = {r.client_id: r for r in provider.view().state.nodes(include_gone=True)}
            assert {cid: (cm_name(records[cid].cm), records[cid].gone_at is not None)
                    for cid in gone} == {cid: (site_of[cid], True) for cid in gone}
        # the provider closed: both slivers went back
        assert held_per_cm(box, tmp_path / "look") == {"utah": [], "wisc": []}
