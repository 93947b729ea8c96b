"""The manager of a :class:`~elasticslice.parsl.provider.CloudLabProvider`'s slice:
:class:`ParslSliceManager`, the project's plain manager (state dir, intent log, callback
endpoint, notice book, cycle) assembled with the parts whose nodes serve Parsl's blocks.

Parsl is a demand source, not a second policy: the stock policy
(:func:`~elasticslice.managers.policy.decide`) decides when nodes come and go, on what
:class:`BlockWatch` makes of the blocks:

* the demand, in nodes: the nodes held that a block not over (live or draining) wants, the
  nodes of an AddNodes in flight, and the live blocks' open slots;
* a node such a block wants is busy (never given back as a surplus);
* a node no such block wants (its block was drained or cancelled, or it never had one: the
  sliver's first node before any block, a node a restart found) runs nothing Parsl will use:
  to the policy it has lost its agent, since then. Such a node does not count, and the
  policy replaces it at once (``agent_grace`` 0): it is given back, but never the last node
  held at the CM (CloudLab refuses to take a sliver's every node), which stays until another
  comes or the provider closes: with several CMs, a sliver at each, one node at each
  (docs/parsl.md, "Across sites"). (Idle would be the wrong word for the policy: an idle node
  counts as room for work, and a block waiting for nodes cannot use another block's.)

New nodes are bound to the oldest block with an open slot when they are asked for
(:meth:`~elasticslice.parsl.blocks.BlockBook.bind`, from the helper's ``node_spec``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from elasticslice.managers.background import Background
from elasticslice.managers.core import Manager
from elasticslice.managers.helpers import ElasticSliceHelper
from elasticslice.managers.hosted import HostedSystem
from elasticslice.managers.manager import DEF_MAX_THRESHOLD, seed_options
from elasticslice.managers.policy import NodeView, Observed, PolicyConfig, counted
from elasticslice.parsl.blocks import BlockBook
from elasticslice.parsl.drain import BlockDrainer

#: the stock policy's knobs for Parsl. Parsl's strategy paces the blocks it asks for
#: (``strategy_period``, ``parallelism``, ``max_blocks``), so no cooldown and no per-cycle
#: limit here; a node no block wants goes at once; nodes are asked for while any is free
#: (``percent_available_minimum`` 0); a node that failed to start fails its block, and
#: Parsl decides what comes next (no pause of adds after failed starts).
PARSL_POLICY: dict[str, Any] = {
    "add_cooldown": 0.0, "delete_cooldown": 0.0, "agent_grace": 0.0, "agent_timeout": None,
    "failures_before_backoff": 0}


class BlockWatch:
    """What the blocks of ``book`` say about the nodes, for the policy: busy (a block not
    over wants it) or without an agent since (none does: tracked on ``clock``), and the
    demand in nodes."""

    def __init__(self, book: BlockBook, *, clock: Callable[[], float]) -> None:
        self.book = book
        self.clock = clock
        self._unwanted: dict[str, float] = {}  # client_id -> since when no block wants it

    def decorate(self, views: tuple[NodeView, ...]) -> tuple[NodeView, ...]:
        now = self.clock()
        out = []
        for view in views:
            if self.book.wanted(view.client_id):
                out.append(dataclasses.replace(view, busy=True))
                continue
            since = self._unwanted.setdefault(view.client_id, now)
            out.append(dataclasses.replace(view, busy=False, idle_since=since,
                                           agentless_since=since, had_agent=True))
        held = {v.client_id for v in views}
        for cid in set(self._unwanted) - held:
            del self._unwanted[cid]
        return tuple(out)

    def demand(self, observed: Observed, policy: PolicyConfig) -> int:
        """Nodes the blocks want: those held that count and a block wants, those being
        added, and the open slots of live blocks."""
        held = sum(1 for n in counted(observed, policy) if self.book.wanted(n.client_id))
        return held + max(observed.adding, 0) + self.book.open_slots()


class ParslSystem(HostedSystem):
    """Parsl's blocks, as the manager's hosted system: the demand and the nodes as
    :class:`BlockWatch` sees them; the slots of nodes whose add failed open again
    (:meth:`adds_done`); the drain's thread."""

    release_wakes = ("update_sliver_status", "delete_nodes")  # the block's other nodes too

    def __init__(self, book: BlockBook, drainer: BlockDrainer, *,
                 clock: Callable[[], float]) -> None:
        self.book, self.drainer = book, drainer
        self.watch = BlockWatch(book, clock=clock)
        self.manager: Any = None

    def bind(self, manager: Any) -> None:
        self.manager = manager

    def observe(self, observer: Any, demand: int | None) -> Observed:
        """What the policy sees: the nodes as the blocks see them, and their demand."""
        observed = observer.observe(decorate=self.watch.decorate)
        return dataclasses.replace(observed,
                                   demand=self.watch.demand(observed, self.manager.policy))

    def wanted(self, policy: PolicyConfig, demand: int | None) -> int | None:
        """Nodes Parsl's blocks want (see :meth:`BlockWatch.demand`)."""
        return self.manager.observe().demand

    def adds_done(self) -> None:
        """Nodes bound to blocks that no CM holds and no AddNodes in flight names (their
        AddNodes or CreateSliver failed) free their slots; one the CM added after all is
        found by the reconcile, and given back as no block's."""
        state = self.manager.state
        adding = {c for i in state.open_intents() if i.kind == "add" for c in i.client_ids}
        bound = [cid for block in list(self.book.blocks.values()) for cid in list(block.nodes)]
        self.book.unbind([cid for cid in bound if cid not in adding and
                          all(state.node(url, cid) is None for url in self.manager.cmlist)])

    def threads(self) -> list[Background]:
        return [self.drainer.work]


class ParslSliceManager(Manager):
    """The project's manager whose demand is Parsl's blocks (the module's doc), assembled
    from the plain :class:`~elasticslice.managers.core.Manager` and its parts (nothing
    overridden): the stock policy adds nodes for the open slots of live blocks (up to
    ``maxthreshold`` that count) and gives back the nodes no block wants
    (:class:`ParslSystem`); a notice drains the node's block (:class:`BlockDrainer`, the
    releaser) and the node is released early. ``wait_empty(block)``: waits until the
    block's managers hold no task or its deadline less ``margin`` comes (the provider's
    process does it: :class:`~elasticslice.parsl.remote.RemoteBlocks`), and says why it
    returned. The policy's knobs are :data:`PARSL_POLICY` over ``policy``; ``helper``: what
    a node is; other options as
    :class:`~elasticslice.managers.manager.SimpleElasticSliceManager`'s
    (:func:`~elasticslice.managers.manager.seed_options`)."""

    def __init__(self, server: Any, *, book: BlockBook, wait_empty: Callable[[Any], str],
                 helper: ElasticSliceHelper, margin: float = 5.0, **options: Any) -> None:
        most = options.get("maxthreshold", DEF_MAX_THRESHOLD)
        options["policy"] = dataclasses.replace(
            options.get("policy") or PolicyConfig(), max_add_per_cycle=most, **PARSL_POLICY)
        options.setdefault("percent_available_minimum", 0.0)
        # the parts that see blocks (they call back only once the manager runs)
        drainer = BlockDrainer(book, wait_empty, margin=margin,
                               release=lambda *node: self.release_early(*node),
                               clock=lambda: self.clock(),
                               wake=lambda: self.wake("delete_nodes"))
        blocks = ParslSystem(book, drainer, clock=lambda: self.clock())
        super().__init__(server, helper=helper, hosted=blocks, releaser=drainer,
                         **seed_options(server, **options))
        self.blocks, self.book, self.margin, self.drainer = blocks, book, margin, drainer

    @property
    def watch(self) -> BlockWatch:
        return self.blocks.watch

    def stats(self) -> dict[str, int]:
        """revocations, early_releases, forced_releases (as the CM reported them)."""
        counts = self.notices.counts()
        return {"revocations": counts["revocations"], "early_releases": counts["early"],
                "forced_releases": counts["forced"]}
