"""Draining a block on a notice: :class:`BlockDrainer` holds the block's managers at the
interchange, waits until they hold no task or the deadline less the margin comes, then
releases the revoked nodes early (the block's other nodes go back with them)."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from elasticslice.managers.background import Background
from elasticslice.managers.records import PendingDelete
from elasticslice.parsl.blocks import Block, BlockBook, BlockState

log = logging.getLogger(__name__)


class BlockDrainer:
    """A :class:`~elasticslice.managers.endpoint.Releaser` for blocks: a notice holds the
    block's managers at the interchange (the call HTEX's own ``scale_in`` makes) and, on a
    thread of its own, waits until they hold no task or the deadline less ``margin``
    comes; then the revoked nodes are released (``release(node_id, client_id, why)``) and
    the block's other nodes go back with it (``wake()``)."""

    def __init__(self, book: BlockBook, executor: Callable[[], Any], *, margin: float,
                 release: Callable[[str, str | None, str], None], wake: Callable[[], None],
                 clock: Callable[[], float] = time.time, poll: float = 0.2) -> None:
        self.book, self.executor, self.margin = book, executor, margin
        self.release, self.wake, self.clock, self.poll = release, wake, clock, poll
        self.work = Background("parsl-drain", threads=4)
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._draining = 0

    def start(self, revocations: Sequence[PendingDelete]) -> None:
        for rev in revocations:
            block = self.book.of(rev.client_id)
            if block is None or block.over:
                self.release(rev.node_id, rev.client_id, "no Parsl block on it")
            elif self.book.drain(block, rev):
                self.work.post(self._drain, block)

    def hurry(self, revocation: PendingDelete) -> None:
        """The deadline came earlier: the drain waits for that one."""
        block = self.book.of(revocation.client_id)
        if block is not None and not block.over and self.book.drain(block, revocation):
            self.work.post(self._drain, block)

    def gone(self, revocations: Sequence[PendingDelete], *, now: bool = False) -> None:
        """Taken (or taken now): the interchange finds their managers lost and Parsl
        retries what they held; a block draining for them ends."""
        for rev in revocations:
            block = self.book.of(rev.client_id)
            if block is not None and block.state is BlockState.DRAINING:
                self.book.set_state(block, BlockState.DRAINED,
                                    f"{rev.client_id} taken by CloudLab")
                self.wake()

    def running(self) -> int:
        return self._draining

    def close(self) -> None:
        self._closing.set()
        self.work.close()

    def _managers(self, executor: Any, block: Block) -> list[dict[str, Any]]:
        if executor is None or block.block_id is None:
            return []
        return [m for m in executor.connected_managers()
                if str(m.get("block_id")) == block.block_id]

    def _drain(self, block: Block) -> None:
        with self._lock:
            self._draining += 1
        try:
            why = self._wait_empty(block)
        except Exception as err:  # noqa: BLE001 - the node goes anyway
            log.warning("cannot drain %s (%s): its node goes now", block.name, err)
            why = f"not drained: {err}"
        finally:
            with self._lock:
                self._draining -= 1
        self.book.set_state(block, BlockState.DRAINED, why)
        for rev in list(block.revoked.values()):
            self.release(rev.node_id, rev.client_id, why)
        self.wake()

    def _wait_empty(self, block: Block) -> str:
        executor = self.executor()
        held: set[str] = set()
        log.warning("draining %s (block %s): CloudLab takes a node in %.0f s", block.name,
                    block.block_id, (block.deadline or self.clock()) - self.clock())
        while True:
            managers = self._managers(executor, block)
            fresh = [m["manager"] for m in managers if m["manager"] not in held]
            for manager in fresh:  # managers joining late are held too
                executor._hold_manager(manager)
                held.add(manager)
            if fresh:  # what they hold once held (a task may have gone to them meanwhile)
                managers = self._managers(executor, block)
            tasks = sum(int(m.get("tasks", 0)) for m in managers)
            if tasks == 0:
                return "drained"
            if block.state is not BlockState.DRAINING:
                return block.message or "ended"
            if self.clock() >= (block.deadline or 0) - self.margin:
                return f"{tasks} task(s) still on it at the deadline: Parsl retries them"
            if self._closing.wait(self.poll):
                return "the provider closed"
