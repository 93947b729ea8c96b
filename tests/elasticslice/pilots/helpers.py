"""Helpers for the elastic-cluster tests: workloads of sleepers that record where they ran,
a workload run in a thread, the node behind a pilot, what "nothing lost" means, a Dask
scheduler in a process of its own."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import troy
from elasticslice.pilots import ElasticCluster
from troy import State
from troy.frameworks.dask import DaskFramework
from troy.frameworks.dask.processes import AgentProcess
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import member, node_agent, stop

RUN_TIMEOUT = 240.0


def sleepers(out: Path, count: int, seconds: float, cores: int = 4,
             gate: Path | None = None) -> troy.Workload:
    """``count`` units of ``cores`` cores that sleep, then append the client_id of the node
    they ran on to ``out/ran.<i>`` (a unit that ran twice leaves two lines). With ``gate``
    (a file), a unit that slept goes on waiting while the file exists: the test says when
    the work may end, whatever the machine's load (``seconds`` stays the runtime hint)."""
    out.mkdir(parents=True, exist_ok=True)
    wait = f"while [ -e {gate} ]; do sleep 0.05; done; " if gate is not None else ""
    w = troy.Workload()
    w.add_task({"executable": "/bin/sh", "cardinality": count, "cores": cores,
                "runtime": seconds, "arguments": [
                    "-c", f'sleep {seconds}; {wait}echo "$ELASTICSLICE_CLIENT_ID" >> '
                          f"{out}/ran.%(cardinal)s"]})
    return w


def closed_gate(tmp_path: Path) -> Path:
    """A gate for :func:`sleepers`, closed (the file exists); ``unlink()`` opens it."""
    gate = tmp_path / "gate"
    gate.touch()
    return gate


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


def busy_added_node(cluster: ElasticCluster, run: Run) -> str:
    """The client_id of a node the manager added (not initial) on whose pilot a unit of
    ``run`` runs (started there, not only handed to it: broke, a node taken before its
    units started had nothing to requeue)."""
    def find() -> str | None:
        running = {u.pilot for t in run.workload.tasks.values() for u in t.units
                   if u.state is State.RUNNING}
        for rec in cluster.manager.state.nodes():
            pilot = cluster.manager.pilot_of(rec.client_id)
            if not rec.initial and pilot is not None and pilot.id in running:
                return rec.client_id
        return None
    return str(wait_for(find, timeout=120, what="an added node whose pilot runs units"))


def assert_nothing_lost(cluster: Any, run: Run, out: Path, count: int) -> dict[str, Any]:
    state = run.wait()
    assert state is State.DONE, [(t.id, t.state.value, [(u.pilot, u.state.value, u.result)
                                                         for u in t.units])
                                 for t in run.workload.tasks.values() if t.state is not State.DONE]
    ran = ran_on(out)
    assert len(ran) == count and all(ran.values()), ran  # every unit ran to its end
    stats = cluster.stats()
    assert stats["units_lost"] == 0, stats
    return stats


class SchedulerProcess:
    """A Dask scheduler over TLS in a process of its own (so that it can be SIGKILLed)."""

    def __init__(self, tmp: Path, ca: tuple[bytes, bytes], port: int = 0) -> None:
        self.tls = member(tmp / "control", ca, "control")
        self.proc = AgentProcess(["scheduler", "1.0", "127.0.0.1", str(port)],
                                 str(tmp / f"scheduler-{port}.log"), None, self.tls.environ())
        address = self.proc.read_address(60)
        assert address, f"the scheduler did not start: {self.proc.log_tail()}"
        self.address = address

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def framework(self, name: str) -> DaskFramework:
        fw = DaskFramework(name, scheduler_address=self.address, adopt_workers=True,
                           tls=self.tls, connect_timeout=30)
        fw.start()
        return fw

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.proc.wait()

    @contextlib.contextmanager
    def joined(self, tmp: Path, ca: tuple[bytes, bytes], node: str, cores: int = 2,
               log: Path | None = None) -> Iterator[tuple[Any, DaskFramework, Any]]:
        """(agent process, framework, its pilot) once a node agent named ``node`` joined
        this scheduler; the framework's client is closed and the agent stopped after."""
        agent = node_agent(self.address, cores, member(tmp / f"agent-{node}", ca, node),
                           log or tmp / "agent.log", node)
        fw = self.framework(f"fw-{node}")
        try:
            pilot = wait_for(lambda: fw.find_pilot(node), 120, what="the agent's pilot")
            yield agent, fw, pilot
        finally:
            fw.client.close(timeout=5) if fw.client is not None else None
            if agent.poll() is None:
                stop(agent)
