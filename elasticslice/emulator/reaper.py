"""Tearing released nodes down outside the CM's lock.

Stopping a node's processes can take seconds (a startup command that ignores SIGTERM gets
``BootRunner.kill``'s grace period before SIGKILL). The CM decides what leaves a slice under
``ctx.lock`` and hands the nodes to the :class:`Reaper`, which kills and wipes them on a few
worker threads while other calls go on. A node being torn down is not given to anyone
(:meth:`Reaper.busy`) until its old processes are gone and its sandbox is wiped.
"""
from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

from elasticslice.emulator.context import Context
from elasticslice.emulator.store import Holder

log = logging.getLogger(__name__)

WORKERS = 8


@dataclass
class Teardown:
    """The nodes one delete handed to the reaper; :meth:`wait` returns when they are gone."""

    node_ids: list[str]
    futures: list[Future[None]] = field(default_factory=list)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every node is torn down; False when ``timeout`` ran out first."""
        _, pending = wait_futures(self.futures, timeout=timeout)
        return not pending

    @property
    def done(self) -> bool:
        return all(f.done() for f in self.futures)


class Reaper:
    """Kills released nodes' processes and wipes their sandboxes on worker threads."""

    def __init__(self, ctx: Context, workers: int = WORKERS) -> None:
        self.ctx = ctx
        self._pool = ThreadPoolExecutor(max_workers=workers,
                                        thread_name_prefix="emulator-reaper")
        self._lock = threading.RLock()  # a done callback may run inside hand_over
        self._busy: dict[str, Future[None]] = {}

    def hand_over(self, node_ids: Iterable[str]) -> Teardown:
        """Queue these nodes' teardown (cheap: callers hold ``ctx.lock``)."""
        teardown = Teardown(list(node_ids))
        if self.ctx.boot is None:
            return teardown
        with self._lock:
            for node_id in teardown.node_ids:
                try:
                    future = self._pool.submit(self._teardown, node_id)
                except RuntimeError:  # the emulator is stopping: do it here and now
                    future = Future()
                    self._teardown(node_id)
                    future.set_result(None)
                self._busy[node_id] = future
                future.add_done_callback(lambda f, n=node_id: self._forget(n, f))
                teardown.futures.append(future)
        return teardown

    def busy(self) -> set[str]:
        """Nodes whose teardown has not finished: not to be given to a slice yet."""
        with self._lock:
            return set(self._busy)

    def sweep(self) -> int:
        """Wipe the sandboxes of nodes no slice holds (left by an emulator that died while
        tearing them down); run at start, after the boot runner killed leftover processes."""
        wiped = 0
        for node in self.ctx.store.nodes():
            sandbox = self.ctx.node_dir(node.node_id)
            if node.holder is not Holder.SLICE and sandbox.exists():
                shutil.rmtree(sandbox, ignore_errors=True)
                wiped += 1
        if wiped:
            log.info("wiped %d sandbox(es) of nodes no slice holds", wiped)
        return wiped

    def stop(self) -> None:
        """Finish every queued teardown (the emulator stops: no process may survive)."""
        self._pool.shutdown(wait=True)

    def _forget(self, node_id: str, future: Future[None]) -> None:
        with self._lock:
            if self._busy.get(node_id) is future:
                del self._busy[node_id]

    def _teardown(self, node_id: str) -> None:
        boot = self.ctx.boot
        if boot is None:
            return
        try:
            boot.kill(node_id, wipe=True)
        except Exception:  # one node must not stop the others' teardown
            log.exception("teardown of node %s failed", node_id)
