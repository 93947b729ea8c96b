"""Elastic clusters against a running emulator: nodes are real Troy node agents (Dask workers
over TLS) started by the emulated nodes' startup commands.

``make_cluster(emulator, **options)``: a started :class:`ElasticCluster` for the emulator's
user (fast cycle, no cooldowns, a 1 s drain margin), closed at the end of the test.
``Run(cluster, workload)``: the workload executed on the cluster's pilots in a thread.
``sleepers(out, n, seconds, cores)``: n units that sleep, then record where they ran.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import troy
from elasticslice.pilots import ElasticCluster
from tests.conftest import wait_for
from tests.elasticslice.managers.conftest import FAST_INTERVALS, FAST_POLICY, client_for

RUN_TIMEOUT = 240.0


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., ElasticCluster]]:
    made: list[ElasticCluster] = []

    def make(emulator: Any, **options: Any) -> ElasticCluster:
        server = client_for(emulator, tmp_path / f"cache{len(made)}")
        options.setdefault("intervals", FAST_INTERVALS)
        options.setdefault("margin", 1.0)
        options.setdefault("policy", dataclasses.replace(FAST_POLICY, max_delete_per_cycle=1))
        cluster = ElasticCluster(server, tmp_path / f"cluster{len(made)}", **options)
        made.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in reversed(made):
        cluster.close()
        cluster.server.close()


def sleepers(out: Path, count: int, seconds: float, cores: int = 4) -> troy.Workload:
    """``count`` units of ``cores`` cores that sleep, then append the client_id of the node
    they ran on to ``out/ran.<i>`` (a unit that ran twice leaves two lines)."""
    out.mkdir(parents=True, exist_ok=True)
    w = troy.Workload()
    w.add_task({"executable": "/bin/sh", "cardinality": count, "cores": cores,
                "runtime": seconds, "arguments": [
                    "-c", f'sleep {seconds}; echo "$ELASTICSLICE_CLIENT_ID" >> '
                          f"{out}/ran.%(cardinal)s"]})
    return w


def ran_on(out: Path) -> dict[str, list[str]]:
    """unit index -> the nodes it ran on (one line per completed run)."""
    return {p.name: p.read_text().split("\n")[:-1] for p in sorted(out.glob("ran.*"))}


class Run:
    """``troy.execute_workload`` on the cluster's pilots (late binding), in a thread."""

    def __init__(self, cluster: ElasticCluster, workload: troy.Workload) -> None:
        self.workload = workload
        self.state: troy.State | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(cluster,), daemon=True)
        self.thread.start()

    def _run(self, cluster: ElasticCluster) -> None:
        try:
            self.state = troy.execute_workload(cluster.session, self.workload,
                                               cluster.overlay(), bind_mode="late",
                                               timeout=RUN_TIMEOUT)
        except BaseException as err:  # reported by wait()
            self.error = err

    def wait(self, timeout: float = RUN_TIMEOUT + 30) -> troy.State:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the workload did not finish"
        if self.error is not None:
            raise self.error
        return self.state


def node_of(cluster: ElasticCluster, client_id: str) -> Any:
    manager = cluster.manager
    return manager.state.node(manager.cmlist[0], client_id)


def busy_added_node(cluster: ElasticCluster) -> str:
    """The client_id of a node the manager added (not initial) whose pilot runs units."""
    def find() -> str | None:
        for rec in cluster.manager.state.nodes():
            pilot = cluster.manager.pilot_of(rec.client_id)
            if not rec.initial and pilot is not None and pilot.busy:
                return rec.client_id
        return None
    return str(wait_for(find, timeout=120, what="an added node whose pilot runs units"))
