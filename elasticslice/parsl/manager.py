"""The manager of a :class:`~elasticslice.parsl.provider.CloudLabProvider`'s slice:
:class:`ParslSliceManager`, the project's manager (state dir, intent log, callback endpoint,
notice book, cycle) whose nodes serve Parsl's blocks.

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
  comes or the provider closes. (Idle would be the wrong word for the policy: an idle node
  counts as room for work, and a block waiting for nodes cannot use another block's.)

New nodes are bound to the oldest block with an open slot when they are asked for
(:meth:`~elasticslice.parsl.blocks.BlockBook.bind`, from the helper's ``node_spec``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from elasticslice.managers.background import Background
from elasticslice.managers.manager import SimpleElasticSliceManager
from elasticslice.managers.policy import NodeView, Observed, PolicyConfig, counted
from elasticslice.parsl.blocks import BlockBook
from elasticslice.parsl.drain import BlockDrainer
from elasticslice.pilots.drainer import EarlyReleases

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


class ParslSliceManager(EarlyReleases, SimpleElasticSliceManager):
    """The project's manager whose demand is Parsl's blocks (the module's doc): the stock
    policy adds nodes for the open slots of live blocks (up to ``maxthreshold`` that count)
    and gives back the nodes no block wants; a notice drains the node's block
    (:class:`BlockDrainer`) and the node is released early. ``wait_empty(block)``: waits
    until the block's managers hold no task or its deadline less ``margin`` comes (the
    provider's process does it: :class:`~elasticslice.parsl.remote.RemoteBlocks`), and
    says why it returned. The policy's knobs are
    :data:`PARSL_POLICY` over ``policy``; other options as
    :class:`~elasticslice.managers.manager.SimpleElasticSliceManager`."""

    RELEASE_WAKES = ("update_sliver_status", "delete_nodes")  # the block's other nodes too

    def __init__(self, server: Any, *, book: BlockBook, wait_empty: Callable[[Any], str],
                 margin: float = 5.0, **options: Any) -> None:
        most = options.get("maxthreshold", self.DEF_MAX_THRESHOLD)
        options["policy"] = dataclasses.replace(
            options.get("policy") or PolicyConfig(), max_add_per_cycle=most, **PARSL_POLICY)
        options.setdefault("percent_available_minimum", 0.0)
        # the parts that see blocks, passed in (they call back only once running)
        drainer = BlockDrainer(book, wait_empty, margin=margin, release=self._release,
                               clock=lambda: self._now(), wake=lambda: self.wake("delete_nodes"))
        super().__init__(server, releaser=drainer, **options)
        self.book, self.margin = book, margin
        self.watch, self.drainer = BlockWatch(book, clock=lambda: self.clock()), drainer

    def observe(self) -> Observed:
        """What the policy sees: the nodes as the blocks see them, and their demand."""
        observed = self.observer.observe(decorate=self.watch.decorate)
        return dataclasses.replace(observed, demand=self.watch.demand(observed, self.policy))

    @property
    def demand(self) -> int | None:
        """Nodes Parsl's blocks want (see :meth:`BlockWatch.demand`)."""
        return self.observe().demand

    def add_nodes(self, count: int = 0, cm: Any = None) -> Any:
        """The policy's adds (the base's), then the slots of nodes whose add failed open
        again (:meth:`_unbind_unheld`)."""
        try:
            return super().add_nodes(count, cm)
        finally:  # failed, or some left out (too few free of the type): their slots free
            self._unbind_unheld()

    def ensure_sliver(self, cm: Any = None) -> Any:
        try:
            return super().ensure_sliver(cm)
        except Exception:
            self._unbind_unheld()
            raise

    def _unbind_unheld(self) -> None:
        """Nodes bound to blocks that no CM holds and no AddNodes in flight names (their
        AddNodes or CreateSliver failed) free their slots; one the CM added after all is
        found by the reconcile, and given back as no block's."""
        adding = {c for i in self.state.open_intents() if i.kind == "add"
                  for c in i.client_ids}
        bound = [cid for block in list(self.book.blocks.values()) for cid in list(block.nodes)]
        self.book.unbind([cid for cid in bound if cid not in adding and
                          all(self.state.node(url, cid) is None for url in self.cmlist)])

    def _threads(self) -> list[Background]:
        return [*super()._threads(), self.drainer.work]

    def stats(self) -> dict[str, int]:
        """revocations, early_releases, forced_releases (as the CM reported them)."""
        counts = self.notices.counts()
        return {"revocations": counts["revocations"], "early_releases": counts["early"],
                "forced_releases": counts["forced"]}
