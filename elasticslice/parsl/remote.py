"""The manager daemon's end of a Parsl provider's channel: :class:`RemoteBlocks`.

The provider's process (Parsl's DataFlowKernel, its executor and interchange) unpickles what
nodes send, so it holds no CloudLab credential and no CA key: the manager daemon does
(:mod:`elasticslice.parsl.daemon`). Over the local channel (:mod:`elasticslice.channel`)
the provider tells it every block Parsl wants (``blocks``: its worker command, size and the
nodes bound to it, and the executor's key folder); a block it no longer lists was cancelled.
The daemon tells back each block's nodes and their states (``bound``, what changed since
the provider last heard), the nodes that failed to start (``failures``), and asks it to
hold a block's managers before a notice's deadline (``drain_block``), which the provider
answers once they are empty (``block_drained``). What the provider sends is checked
before it is used: a worker command a node may run (:func:`~.node.check_node_command`), a
key folder of this user's that is the executor's.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticslice.channel import MAX_FAILURES, Channel, ChannelError, ChannelServer
from elasticslice.parsl.blocks import Block, BlockBook, BlockState
from elasticslice.parsl.node import CommandRefused, check_node_command

log = logging.getLogger(__name__)

GRACE = 2.0   # seconds past the deadline less the margin the daemon waits for the answer
POLL = 0.2


class RemoteBlocks:
    """See the module docstring. ``book``: the daemon's blocks; ``address``: where the
    interchange must be reached (an unencrypted pool is allowed on loopback only);
    ``states_of(client_ids)``: each node's state (a ``NodeState`` value, None: gone);
    ``on_blocks()``: the blocks changed; ``on_close(give_back)``: the provider closes;
    ``on_keys(folder)``: the executor's key folder (checked here first)."""

    def __init__(self, state_dir: str | Path, book: BlockBook, *, address: str,
                 margin: float, states_of: Callable[[list[str]], list[str | None]],
                 on_blocks: Callable[[], None], on_close: Callable[[bool], None],
                 on_keys: Callable[[Path], None], clock: Callable[[], float] = time.time
                 ) -> None:
        self.book, self.address, self.margin = book, address, margin
        self.states_of, self.on_blocks, self.on_close, self.on_keys = \
            states_of, on_blocks, on_close, on_keys
        self.clock = clock
        self.server = ChannelServer(state_dir, on_message=self._on_message,
                                    on_attach=self._on_attach, on_detach=self._on_detach)
        self.heard = threading.Event()   # the provider told its blocks at least once
        self._lock = threading.Condition()
        self._told: dict[str, dict[str, Any]] = {}   # job_id -> the entry last told
        self._drained: dict[str, str] = {}             # job_id -> why (the provider said)
        self._forgotten: set[str] = set()              # blocks over, dropped from the book
        self._failures_told = -1
        self._generation = 0                           # attaches so far
        self._stop = threading.Event()

    # ------------------------------------------------------------------ running
    def start(self) -> RemoteBlocks:
        self.server.start()
        return self

    def cancel_waits(self) -> None:
        """Every :meth:`wait_empty` returns now (the daemon stops)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def stop(self) -> None:
        self.cancel_waits()
        self.server.stop()

    @property
    def attached(self) -> bool:
        workload = self.server.workload
        return workload is not None and not workload.closed

    def _send(self, kind: str, **fields: Any) -> bool:
        workload = self.server.workload
        if workload is None:
            return False
        try:
            workload.send(kind, **fields)
            return True
        except ChannelError as err:
            log.warning("the provider did not get %s: %s", kind, err)
            return False

    def _on_attach(self, channel: Channel) -> None:
        with self._lock:
            self._told.clear()   # told the whole table again
            self._failures_told = -1
            self._generation += 1
            self._lock.notify_all()

    def _on_detach(self, channel: Channel, reason: str | None) -> None:
        with self._lock:
            self._lock.notify_all()

    # ------------------------------------------------------------------ what it hears
    def _on_message(self, channel: Channel, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "blocks":
            self._blocks(message["blocks"], message.get("key_dir"))
        elif kind == "block_drained":
            block = self.book.get(message["job_id"])
            if block is None or block.state is not BlockState.DRAINING:
                log.info("the provider says %s drained: no drain was asked of it",
                         message["job_id"][:64])
                return
            with self._lock:
                self._drained[block.job_id] = message["why"]
                self._lock.notify_all()
        elif kind == "close":
            self.on_close(message["give_back"])
        else:
            raise ChannelError(f"{kind}: not something a Parsl provider sends")

    def _blocks(self, entries: list[dict[str, Any]], key_dir: str | None) -> None:
        if key_dir is not None:
            self.on_keys(key_folder(key_dir))
        listed = set()
        for entry in entries:
            try:
                command = check_node_command(entry["command"], self.address)
            except CommandRefused as err:
                raise ChannelError(f"blocks: {entry['job_id'][:64]}: {err}") from None
            listed.add(entry["job_id"])
            if self.book.get(entry["job_id"]) is None and entry["job_id"] not in self._forgotten:
                # a daemon started again: the nodes the provider knew bound stay bound
                nodes = [n for n in entry["nodes"] if self.book.of(n) is None]
                self.book.add(Block(entry["job_id"], entry["name"], command, entry["size"],
                                    block_id=entry.get("block_id"),
                                    nodes=nodes[:entry["size"]]))
                log.info("block %s (%s): %d node(s) asked for", entry["job_id"],
                         entry["name"], entry["size"])
        for block in list(self.book.blocks.values()):
            if block.job_id not in listed and not block.over:
                self.book.set_state(block, BlockState.CANCELLED, "cancelled by Parsl")
        self.heard.set()
        self.on_blocks()

    # ------------------------------------------------------------------ what it tells
    def tell(self) -> None:
        """Each block whose state, nodes or nodes' states changed since the provider last
        heard (every block after it attached, even none)."""
        if not self.attached:
            return
        with self._lock:
            generation = self._generation
        entries = []
        for block in list(self.book.blocks.values()):
            nodes = list(block.nodes)
            entry = {"job_id": block.job_id, "state": block.state.value,
                     "message": (block.message or "")[:1000] or None, "nodes": nodes,
                     "states": self.states_of(nodes)}
            if self._told.get(block.job_id) != entry:
                entries.append(entry)
            elif block.over and not any(entry["states"]):   # told, and its nodes are gone
                self.book.forget(block.job_id)
                self._forgotten.add(block.job_id)   # a late frame listing it: not new
        with self._lock:
            first = not self._told
            if generation != self._generation:   # attached again meanwhile: next time
                return
        if (entries or first) and self._send("bound", bound=entries):
            with self._lock:
                if generation == self._generation:
                    self._told.update((e["job_id"], e) for e in entries)
                    self._told.setdefault("", {})   # told once since the attach

    def tell_failures(self, failures: list[dict[str, Any]]) -> None:
        """The nodes that failed to start, when there are more than the provider heard of."""
        if not self.attached or len(failures) == self._failures_told:
            return
        if self._send("failures", failures=failures[-MAX_FAILURES:]):
            self._failures_told = len(failures)

    def wait_empty(self, block: Block) -> str:
        """The drainer's wait (on its thread): ask the provider to hold the block's managers
        (again after it attached again, or when the deadline came earlier) and wait for its
        answer, the block to end, or the deadline less the margin (and a little)."""
        asked: tuple[int, float | None] | None = None
        while True:
            with self._lock:
                why = self._drained.pop(block.job_id, None)
                generation = self._generation
            if why is not None:
                return why
            if block.state is not BlockState.DRAINING:
                return block.message or "ended"
            if self._stop.is_set():
                return "the manager daemon stops"
            deadline = block.deadline or self.clock()
            if self.clock() >= deadline - self.margin + GRACE:
                return "the provider did not say the block drained by the deadline"
            if self.attached and asked != (generation, deadline) and self._send(
                    "drain_block", job_id=block.job_id, until=deadline, margin=self.margin):
                asked = (generation, deadline)
            with self._lock:
                self._lock.wait(POLL)


def key_folder(path: str) -> Path:
    """The executor's CurveZMQ key folder as the provider names it: an absolute path to a
    directory of this user's (not a link) with the interchange's ``server.key``;
    :class:`ChannelError` otherwise."""
    folder = Path(path)
    try:
        info = os.lstat(folder) if folder.is_absolute() else None
    except OSError:
        info = None
    import stat
    if info is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
            or not (folder / "server.key").is_file():
        raise ChannelError(f"blocks: key_dir {path[:200]!r} is not an executor's key folder "
                           f"of this user's")
    return folder
