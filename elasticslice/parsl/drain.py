"""Draining a block on a notice: :class:`BlockDrainer` (in the manager daemon) marks the
block draining and asks the provider's process to hold the block's managers at the
interchange until they hold no task or the deadline less the margin comes
(:func:`hold_until_empty`, run there: the daemon never speaks to Parsl); then it releases
the revoked nodes early (the block's other nodes go back with them)."""
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
    """A :class:`~elasticslice.managers.endpoint.Releaser` for blocks: a notice marks the
    block draining and, on a thread of its own, ``wait_empty(block)`` waits until its
    managers hold no task or the deadline less ``margin`` comes (it says why it returned);
    then the revoked nodes are released (``release(node_id, client_id, why)``) and the
    block's other nodes go back with it (``wake()``)."""

    def __init__(self, book: BlockBook, wait_empty: Callable[[Block], str], *, margin: float,
                 release: Callable[[str, str | None, str], None], wake: Callable[[], None],
                 clock: Callable[[], float] = time.time, poll: float = 0.2) -> None:
        self.book, self.wait_empty, self.margin = book, wait_empty, margin
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

    def _drain(self, block: Block) -> None:
        with self._lock:
            self._draining += 1
        log.warning("draining %s (block %s): CloudLab takes a node in %.0f s", block.name,
                    block.block_id, (block.deadline or self.clock()) - self.clock())
        try:
            why = self.wait_empty(block)
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


def block_managers(executor: Any, block_id: str | None) -> list[dict[str, Any]]:
    """The interchange's managers of the block ``block_id`` (Parsl's)."""
    if executor is None or block_id is None:
        return []
    return [m for m in executor.connected_managers() if str(m.get("block_id")) == block_id]


def hold_until_empty(executor: Any, block_id: str | None, *, until: Callable[[], float],
                     draining: Callable[[], bool], stop: threading.Event,
                     clock: Callable[[], float] = time.time, poll: float = 0.2) -> str:
    """In the provider's process: hold every manager of the block at the interchange (the
    call HTEX's own ``scale_in`` makes; managers joining late are held too) and wait until
    they hold no task, the block is draining no more (``draining()``), ``until()`` (the
    deadline less the margin) comes or ``stop`` is set; why it returned."""
    held: set[str] = set()
    while True:
        managers = block_managers(executor, block_id)
        fresh = [m["manager"] for m in managers if m["manager"] not in held]
        for manager in fresh:
            executor._hold_manager(manager)
            held.add(manager)
        if fresh:  # what they hold once held (a task may have gone to them meanwhile)
            managers = block_managers(executor, block_id)
        tasks = sum(int(m.get("tasks", 0)) for m in managers)
        if tasks == 0:
            return "drained"
        if not draining():
            return "ended"
        if clock() >= until():
            return f"{tasks} task(s) still on it at the deadline: Parsl retries them"
        if stop.wait(poll):
            return "the provider closed"


class BlockHolder:
    """The provider's side of a drain: the daemon asks (``ask(job_id, until, margin)``);
    on a thread of its own the block of ``book`` has its managers held at ``executor()``'s
    interchange until empty (:func:`hold_until_empty`), and ``answer(job_id, why)`` says
    so. A later ask for the same block only moves its time."""

    def __init__(self, book: BlockBook, executor: Callable[[], Any],
                 answer: Callable[[str, str], object]) -> None:
        self.book, self.executor, self.answer = book, executor, answer
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}   # job_id -> hold until

    def ask(self, job_id: str, until: float, margin: float) -> None:
        with self._lock:
            first = job_id not in self._until
            self._until[job_id] = until - margin
        if first:
            threading.Thread(target=self._hold, args=(job_id,), name=f"parsl-drain-{job_id}",
                             daemon=True).start()

    def _hold(self, job_id: str) -> None:
        block = self.book.get(job_id)
        try:
            executor = self.executor()
            if block is None:
                why = "no such block in the provider"
            elif executor is None:
                why = "no executor of this provider's in parsl.dfk(): nothing to hold"
            else:
                log.warning("draining block %s: its managers are held", block.block_id)
                why = hold_until_empty(executor, block.block_id,
                                       until=lambda: self._until.get(job_id, 0.0),
                                       draining=lambda: not block.over, stop=self.stop)
        except Exception as err:  # noqa: BLE001 - the daemon releases the node anyway
            log.warning("cannot drain block %s: %s", job_id, err)
            why = f"not drained: {err}"
        finally:
            with self._lock:
                self._until.pop(job_id, None)
        self.answer(job_id, why)
