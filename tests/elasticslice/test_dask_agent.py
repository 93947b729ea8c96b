"""The node agent as a CloudLabCluster's worker: it has Dask's memory limit (broke: with none,
Dask's adaptive target never let a worker holding a result go, so an idle cluster whose client
kept a future never shrank), and a worker the scheduler retired on purpose does not rejoin
(its node is going)."""
from __future__ import annotations

from pathlib import Path

import pytest

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
            workers = wait_for(lambda: client.scheduler_info()["workers"], 120,
                               what="the agent's worker")
            (addr, info), = workers.items()
            assert info["name"] == "node-1" and info["memory_limit"] > 0
            client.retire_workers([addr], close_workers=True)
            assert proc.wait(60) == 0, log.read_text()
            assert "the scheduler closed this worker" in log.read_text()
            assert client.scheduler_info()["workers"] == {}
        finally:
            if proc.poll() is None:
                stop(proc)
