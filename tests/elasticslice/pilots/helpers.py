"""Helpers for the elastic-cluster tests: workloads of sleepers that tell a witness where
they ran, a workload run in a thread, the node behind a pilot, what "nothing lost" means, a
Dask scheduler in a process of its own.

Units run on the emulator's nodes, which see none of the host's files (a unit cannot write
into the test's ``tmp_path``) and, on networks of their own, reach this machine only at the
box's control address: so they report to a :class:`Witness`, a small HTTP server of the test
there (port 0), with ``curl`` (in the image) and ``geni-get client_id`` for where they ran. The ``witness``
fixture (``tests/elasticslice/pilots/conftest.py``) gives a test one.
"""
from __future__ import annotations

import contextlib
import http.server
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


class Witness:
    """What units on nodes tell the test, over HTTP on ``host`` (the box's control address:
``RunningEmulator.control_address``):

    - ``GET /ran/<unit>/<node>``: the unit ran to its end on ``node`` (:meth:`ran`; a unit
      that ran twice is there twice);
    - ``GET /gate/<name>``: 200 once gate ``name`` is open; while it is closed the answer
      waits up to :attr:`HOLD` seconds for it to open, then is 404 (:meth:`gate`; units ask
      again: a long poll, where asking every 50 ms cost a ``curl`` process each time, ~20 s
      of the suite's CPU).
    """

    HOLD = 4.0  # below the 5-s timeout of the apps that ask with urllib

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._ran: dict[str, list[str]] = {}
        self._open: set[str] = set()
        self._lock = threading.Lock()
        self._opened = threading.Condition(self._lock)
        self._closed = False
        witness = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                parts = self.path.strip("/").split("/")
                status = 404
                if len(parts) == 3 and parts[0] == "ran":
                    with witness._lock:
                        witness._ran.setdefault(parts[1], []).append(parts[2])
                    status = 200
                elif len(parts) == 2 and parts[0] == "gate":
                    with witness._opened:
                        witness._opened.wait_for(
                            lambda: parts[1] in witness._open or witness._closed,
                            timeout=witness.HOLD)
                        status = 200 if parts[1] in witness._open else 404
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ran(self) -> dict[str, list[str]]:
        """unit index -> the nodes it ran on (one entry per completed run)."""
        with self._lock:
            return {unit: list(nodes) for unit, nodes in sorted(self._ran.items())}

    def gate(self, name: str = "gate") -> Gate:
        """A gate, closed."""
        return Gate(self, name)

    def close(self) -> None:
        with self._opened:
            self._closed = True
            self._opened.notify_all()
        self.server.shutdown()
        self.server.server_close()


class Gate:
    """A gate of a :class:`Witness`: closed until :meth:`open` (or ``unlink``: the old gate
    was a file whose removal opened it)."""

    def __init__(self, witness: Witness, name: str) -> None:
        self.witness, self.name = witness, name
        self.url = f"{witness.url}/gate/{name}"

    def open(self) -> None:
        with self.witness._opened:
            self.witness._open.add(self.name)
            self.witness._opened.notify_all()

    unlink = open

    def wait_command(self) -> str:
        """A shell command that returns once the gate is open."""
        return f"until curl -sf {self.url} >/dev/null; do sleep 0.05; done"


def sleepers(out: Witness, count: int, seconds: float, cores: int = 4,
             gate: Gate | None = None) -> troy.Workload:
    """``count`` units of ``cores`` cores that sleep, then tell ``out`` the client_id of the
    node they ran on (``geni-get client_id``; a unit that ran twice is told twice). With
    ``gate`` (:func:`closed_gate`), a unit that slept goes on waiting while the gate is
    closed: the test says when the work may end, whatever the machine's load (``seconds``
    stays the runtime hint)."""
    wait = f"{gate.wait_command()}; " if gate is not None else ""
    w = troy.Workload()
    w.add_task({"executable": "/bin/sh", "cardinality": count, "cores": cores,
                "runtime": seconds, "arguments": [
                    "-c", f"sleep {seconds}; {wait}curl -sf "
                          f'"{out.url}/ran/%(cardinal)s/$(geni-get client_id)" >/dev/null']})
    return w


def closed_gate(out: Witness) -> Gate:
    """A gate for :func:`sleepers`, closed; ``open()`` (or ``unlink()``) opens it."""
    return out.gate()


def ran_on(out: Witness) -> dict[str, list[str]]:
    """unit index -> the nodes it ran on (one entry per completed run)."""
    return out.ran()


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


def assert_nothing_lost(cluster: Any, run: Run, out: Witness, count: int) -> dict[str, Any]:
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


@contextlib.contextmanager
def serve_directory(directory: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """``directory`` served read-only over plain HTTP on ``host`` (port 0; for the box's
    nodes: ``RunningEmulator.control_address``), as the control node serves the wheelhouse
    to its nodes; yields the base URL (no trailing slash)."""
    import functools

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        (host, 0), functools.partial(Quiet, directory=str(directory)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def pilot_image(emulator: Any) -> str:
    """The URN of the box's ``ELASTICSLICE-PILOT`` image (the stock image with the agent)."""
    from elasticslice.emulator.images import PILOT_IMAGE
    from elasticslice.emulator.setup import load_config
    cfg = load_config(emulator.dir)
    return f"urn:publicid:IDN+{cfg.domain}+image+{cfg.project}//{PILOT_IMAGE}"
