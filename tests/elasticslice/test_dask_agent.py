"""The node agent as a CloudLabCluster's worker: it has Dask's memory limit (broke: with none,
Dask's adaptive target never let a worker holding a result go, so an idle cluster whose client
kept a future never shrank), and a worker its cluster retired to give the node back does not
rejoin (a worker retired without that word rejoins: tests/elasticslice/pilots/
test_chaos_regressions.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from troy.frameworks.dask.framework import scheduler_workers
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import node_agent, stop


@pytest.mark.slow
def test_a_retired_node_agent_leaves_for_good_and_had_a_memory_limit(tmp_path: Path) -> None:
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        log = tmp_path / "agent.log"
        proc = node_agent(cluster.scheduler_address, 2, None, log, name="node-1")
        try:
            workers = wait_for(lambda: scheduler_workers(client), 120,
                               what="the agent's worker")
            (addr, info), = workers.items()
            assert info["name"] == "node-1" and info["memory_limit"] > 0
            from troy.frameworks.dask.node import leave_for_good
            assert client.run(leave_for_good, workers=[addr]) == {addr: "leaving"}
            client.retire_workers([addr], close_workers=True)
            assert proc.wait(60) == 0, log.read_text()
            assert "the cluster retired this worker to give its node back" in log.read_text()
            assert scheduler_workers(client) == {}
        finally:
            if proc.poll() is None:
                stop(proc)
