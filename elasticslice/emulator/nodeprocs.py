"""The processes of the box's nodes, as the emulator holds them: each node's first process
(its init, or ``unshare`` around it), the process groups it started, and how many times the
node was rebooted (a startup of an earlier boot must not report over a later one).

:meth:`NodeProcesses.stop` is a node's shutdown: SIGTERM to every process group of the node,
SIGKILL :data:`SHUTDOWN_GRACE` seconds later (with namespaces the init passes SIGTERM to
every process of the node, and when it dies the kernel kills the rest).
"""
from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time

from elasticslice.emulator import orphans

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 3.0  # seconds between a node's SIGTERM and its SIGKILL


class NodeProcesses:
    """Per node: its first process, its process groups, its boot generation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._groups: dict[str, set[int]] = {}
        self._generation: dict[str, int] = {}

    def add(self, node_id: str, proc: subprocess.Popen[bytes]) -> None:
        """The node's first process (it leads a process group of its own)."""
        with self._lock:
            self._procs[node_id] = proc
            self._groups.setdefault(node_id, set()).add(proc.pid)

    def done(self, node_id: str, proc: subprocess.Popen[bytes]) -> None:
        """``proc`` ended; forget it unless another one took its place."""
        with self._lock:
            if self._procs.get(node_id) is proc:
                del self._procs[node_id]

    def node_ids(self) -> list[str]:
        with self._lock:
            return sorted(set(self._procs) | set(self._groups))

    def generation(self, node_id: str) -> int:
        """How many times the node was rebooted (since it was given to its slice)."""
        with self._lock:
            return self._generation.get(node_id, 0)

    def next_generation(self, node_id: str) -> int:
        with self._lock:
            self._generation[node_id] = self._generation.get(node_id, 0) + 1
            return self._generation[node_id]

    def forget(self, node_id: str) -> None:
        """The node left its slice: its next life starts at generation 0."""
        with self._lock:
            self._generation.pop(node_id, None)

    def stop(self, node_id: str) -> None:
        """Shut the node down: SIGTERM to each of its process groups (daemons too), SIGKILL
        to those left after :data:`SHUTDOWN_GRACE` seconds."""
        with self._lock:
            proc = self._procs.pop(node_id, None)
            groups = self._groups.pop(node_id, set())
        alive = {g for g in groups if orphans.signal_group(g, signal.SIGTERM)}
        deadline = time.monotonic() + SHUTDOWN_GRACE
        while alive and time.monotonic() < deadline:
            alive = orphans.live_groups(alive)
            if alive:
                time.sleep(0.05)
        for pgid in alive:
            orphans.signal_group(pgid, signal.SIGKILL)
        if proc is not None:
            try:
                proc.wait(timeout=SHUTDOWN_GRACE)
            except subprocess.TimeoutExpired:
                log.warning("node %s: startup process %s would not die", node_id, proc.pid)

    def running(self, node_id: str) -> bool:
        with self._lock:
            groups = set(self._groups.get(node_id, set()))
        return bool(orphans.live_groups(groups))
