"""The blocks of a :class:`~elasticslice.parsl.provider.CloudLabProvider`: what Parsl asked
for (:class:`Block`), which node is whose (:class:`BlockBook`), and Parsl's ``JobState`` of a
block from the provider's state of it and its nodes' (:func:`job_state`)."""
from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Sequence

from typing import TYPE_CHECKING

from elasticslice.managers.policy import NodeState
from elasticslice.managers.records import PendingDelete

if TYPE_CHECKING:   # Parsl is the provider's: the manager daemon never imports it
    from parsl.jobs.states import JobState


class BlockState(str, enum.Enum):
    """What the provider knows of a block beyond its nodes' states."""

    LIVE = "live"            # wants its nodes; their states say the rest
    DRAINING = "draining"    # a node has a notice: its managers are held
    DRAINED = "drained"      # drained for a notice; its nodes go back
    CANCELLED = "cancelled"  # Parsl cancelled it; its nodes go back


_FINAL = (BlockState.DRAINED, BlockState.CANCELLED)


def job_state(block: BlockState, nodes: Sequence[NodeState | None], slots: int = 0
              ) -> JobState:
    """Parsl's state of a block: the provider's ``block`` state and its nodes' states
    (None: the node is gone), ``slots`` nodes not asked for yet (see docs/parsl.md)."""
    from parsl.jobs.states import JobState
    if block is BlockState.DRAINED:
        return JobState.COMPLETED
    if block is BlockState.CANCELLED:
        return JobState.CANCELLED
    if block is BlockState.DRAINING:
        return JobState.HELD
    alive = [s for s in nodes if s is not None]
    if any(s is NodeState.READY for s in alive):
        return JobState.RUNNING
    if nodes and not alive and not slots:
        return JobState.TIMEOUT   # taken by CloudLab: expected in a pilot model, no failure
    if alive and not slots and all(s is NodeState.FAILED for s in alive):
        return JobState.FAILED
    return JobState.PENDING


@dataclasses.dataclass
class Block:
    """A submitted block: its command, size and the client_ids bound to it."""

    job_id: str
    name: str
    command: str
    size: int
    block_id: str | None = None       # Parsl's, from --block_id (managers report it)
    nodes: list[str] = dataclasses.field(default_factory=list)
    state: BlockState = BlockState.LIVE
    message: str | None = None
    deadline: float | None = None     # draining: CloudLab takes a node then
    revoked: dict[str, PendingDelete] = dataclasses.field(default_factory=dict)
    #: the provider's book: each node's state as the daemon told it (None: gone)
    node_states: dict[str, NodeState | None] = dataclasses.field(default_factory=dict)

    @property
    def open_slots(self) -> int:
        return self.size - len(self.nodes) if self.state is BlockState.LIVE else 0

    @property
    def over(self) -> bool:
        return self.state in _FINAL


class BlockBook:
    """The blocks and which node is whose; its own short lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.blocks: dict[str, Block] = {}
        self._of: dict[str, Block] = {}   # client_id -> block

    def add(self, block: Block) -> None:
        """A block, with the nodes already bound to it (a daemon started again hears them
        from the provider)."""
        with self._lock:
            self.blocks[block.job_id] = block
            for cid in block.nodes:
                self._of[cid] = block

    def get(self, job_id: str) -> Block | None:
        with self._lock:
            return self.blocks.get(job_id)

    def of(self, client_id: str | None) -> Block | None:
        with self._lock:
            return self._of.get(client_id or "")

    def bind(self, client_id: str) -> Block | None:
        """Bind a new node to the oldest block with an open slot (None: no block wants one)."""
        with self._lock:
            for block in self.blocks.values():
                if block.open_slots > 0:
                    block.nodes.append(client_id)
                    self._of[client_id] = block
                    return block
            return None

    def sync(self, job_id: str, nodes: Sequence[str], states: Sequence[NodeState | None],
             state: BlockState, message: str | None) -> Block | None:
        """The manager daemon's word on a block of the provider's book: its nodes and their
        states, and its state unless this book has it final (Parsl cancelled it). None: no
        such block."""
        with self._lock:
            block = self.blocks.get(job_id)
            if block is None:
                return None
            for cid in block.nodes:
                self._of.pop(cid, None)
            block.nodes = list(nodes)
            block.node_states = dict(zip(nodes, states))
            for cid in block.nodes:
                self._of[cid] = block
            if not block.over:
                block.state, block.message = state, message
            return block

    def forget(self, job_id: str) -> None:
        """Drop a block that is over (its nodes gone): the book keeps what is live."""
        with self._lock:
            block = self.blocks.pop(job_id, None)
            for cid in block.nodes if block is not None else ():
                if self._of.get(cid) is block:
                    del self._of[cid]

    def unbind(self, client_ids: Sequence[str]) -> None:
        """These nodes were never added (AddNodes failed): their slots open again."""
        with self._lock:
            for cid in client_ids:
                block = self._of.pop(cid, None)
                if block is not None and cid in block.nodes:
                    block.nodes.remove(cid)

    def open_slots(self) -> int:
        with self._lock:
            return sum(b.open_slots for b in self.blocks.values())

    def wanted(self, client_id: str) -> bool:
        """Whether the node belongs to a block that still wants it."""
        block = self.of(client_id)
        return block is not None and not block.over

    def set_state(self, block: Block, state: BlockState, message: str | None = None) -> bool:
        """Move ``block`` on (a final block stays final); whether it moved."""
        with self._lock:
            if block.over:
                return False
            block.state, block.message = state, message or block.message
            return True

    def drain(self, block: Block, rev: PendingDelete) -> bool:
        """Record a notice for a node of ``block``; True when its drain must start."""
        with self._lock:
            block.revoked[rev.node_id] = rev
            block.deadline = min(rev.deadline, block.deadline or rev.deadline)
            if block.state is not BlockState.LIVE:
                return False
            block.state = BlockState.DRAINING
            block.message = f"draining: CloudLab takes {rev.client_id} back"
            return True
