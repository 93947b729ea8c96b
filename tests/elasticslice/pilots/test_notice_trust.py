"""A notice counts only for a node we hold whose node_id AND client_id match our manifest.

Before, notices were trusted by client_id alone: a NotifyDeletePending naming an unknown
node_id with our client_id drained our pilot for good (and the manager then held 3 nodes
with maxthreshold 2); a NotifyDeleteComplete naming an unknown node_id with our client_id
killed a running pilot; notices about nodes we do not hold were counted as revocations
and early releases. Now they are answered max_wait_time 0, drain nothing, change nothing,
and are counted apart.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.elasticslice.managers.helpers import cm_nodes
from tests.elasticslice.pilots.helpers import (Run, assert_nothing_lost, closed_gate,
                                               sleepers)
from tests.elasticslice.rpc.endpointkit import Callers, call
from tests.helpers import holds_for, wait_for

pytestmark = pytest.mark.slow


def test_mismatched_and_foreign_notices_drain_nothing_and_count_nothing(
        witness, emulator, make_cluster, tmp_path: Path) -> None:
    cluster = make_cluster(emulator, maxthreshold=2, idle_timeout=None)
    manager = cluster.manager
    gate = closed_gate(witness)
    run = Run(cluster, sleepers(witness, 4, 1.0, cores=4, gate=gate))
    wait_for(lambda: len(cluster.pilots()) == 2 and all(p.busy for p in cluster.pilots()),
             timeout=120, what="two busy pilots")
    one, two = sorted(manager.state.nodes(), key=lambda r: r.client_id)
    cm = Callers(emulator.dir, tmp_path).cm(manager.endpoint_url)

    def notify(method: str, items: list[dict[str, Any]]) -> Any:
        return call(manager.endpoint_url, cm, method, {"nodelist": items})

    strangers = [
        {"node_id": "pc999", "client_id": one.client_id, "max_wait_time": 60},  # our client_id
        {"node_id": one.node_id, "client_id": two.client_id, "max_wait_time": 60},  # swapped
        {"node_id": "pc998", "client_id": "node-99", "max_wait_time": 60},     # neither
    ]
    answer = notify("NotifyDeletePending", strangers)
    assert answer["code"] == 0
    assert [n["max_wait_time"] for n in answer["value"]] == [0, 0, 0]  # we do not hold them
    bare = notify("NotifyDeletePending", [{"node_id": two.node_id, "max_wait_time": 60}])
    assert bare["value"] == [{"node_id": two.node_id, "max_wait_time": 0}]  # no client_id
    complete = notify("NotifyDeleteComplete", [
        {"node_id": "pc997", "client_id": two.client_id},
        {"node_id": two.node_id, "client_id": one.client_id}])
    assert complete["code"] == 0

    def untouched() -> None:
        pilots = cluster.pilots()
        assert len(pilots) == 2 and not any(p.draining for p in pilots), pilots
        assert manager.drains == {}
        assert [r.client_id for r in manager.state.nodes()] == [one.client_id, two.client_id]
        assert len(cm_nodes(emulator, tmp_path)) <= 2  # no replacement for a phantom
    holds_for(untouched, seconds=3.0)
    stats = manager.stats()
    assert (stats["revocations"], stats["early_releases"], stats["forced_releases"]) == \
        (0, 0, 0), stats
    assert stats["foreign_notices"] == 6  # each distinct (node_id, client_id), apart
    assert manager.state.pending_deletes() == []
    gate.unlink()
    assert_nothing_lost(cluster, run, witness, 4)
