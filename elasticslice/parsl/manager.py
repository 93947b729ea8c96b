"""The manager of a :class:`~elasticslice.parsl.provider.CloudLabProvider`'s slice:
:class:`ParslSliceManager`, the project's manager (state dir, intent log, callback endpoint,
notice book, cycle) whose nodes serve Parsl's blocks."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elasticslice.managers.background import Background
from elasticslice.managers.manager import SimpleElasticSliceManager
from elasticslice.parsl.blocks import BlockBook
from elasticslice.parsl.drain import BlockDrainer
from elasticslice.pilots.manager import EarlyReleases


class ParslSliceManager(EarlyReleases, SimpleElasticSliceManager):
    """The project's manager with Parsl as its policy: ``add_nodes`` asks for the open
    slots of live blocks (up to ``maxthreshold`` held), ``delete_nodes`` gives back the
    nodes no live block wants (CloudLab keeps one node in a sliver: the last stays until
    another comes or the provider closes); a notice drains the node's block
    (:class:`BlockDrainer`) and the node is released early. ``executor``: returns the
    HighThroughputExecutor (None: not known, nothing to drain)."""

    RELEASE_WAKES = ("update_sliver_status", "delete_nodes")  # the block's other nodes too

    def __init__(self, server: Any, *, book: BlockBook, executor: Callable[[], Any],
                 margin: float = 5.0, **options: Any) -> None:
        self.book, self._executor, self.margin = book, executor, margin
        self.releases = Background("node-release", threads=2)
        super().__init__(server, **options)

    def _releaser(self) -> BlockDrainer:
        self.drainer = BlockDrainer(self.book, self._executor, margin=self.margin,
                                    release=self._release, clock=self._now,
                                    wake=lambda: self.wake("delete_nodes"))
        return self.drainer

    def add_nodes(self, count: int = 0, cm: Any = None) -> int:
        c = self._cms(cm)[0]
        wanted = min(self.book.open_slots(), self.maxthreshold - len(self.state.nodes(c.url)))
        if wanted <= 0 or self.state.open_intents():
            return 0
        args = self.get_add_args(wanted)
        try:
            return self.actuator.add(c, args)
        finally:  # failed, or some left out (too few free of the type): their slots free
            self._unbind_unheld()

    def ensure_sliver(self, cm: Any = None) -> Any:
        try:
            return super().ensure_sliver(cm)
        except Exception:
            self._unbind_unheld()
            raise

    def _unbind_unheld(self) -> None:
        """Nodes bound to blocks that no CM holds (their AddNodes or CreateSliver failed)
        free their slots; one the CM added after all is found by the reconcile, and given
        back as no block's."""
        bound = [cid for block in list(self.book.blocks.values()) for cid in list(block.nodes)]
        self.book.unbind([cid for cid in bound
                          if all(self.state.node(url, cid) is None for url in self.cmlist)])

    def delete_nodes(self, cm: Any = None) -> int:
        deleted = 0
        revoked = {p.node_id for p in self.state.pending_deletes(open_only=True)}
        for c in self._cms(cm):
            held = self.state.nodes(c.url)
            extra = [r.client_id for r in held
                     if not self.book.wanted(r.client_id) and r.node_id not in revoked]
            if extra and len(extra) == len(held):
                extra.pop()  # CloudLab refuses to take a sliver's every node
            if extra:
                deleted += self.actuator.delete(c, extra, "their Parsl block ended")
        return deleted

    def _threads(self) -> list[Background]:
        return [*super()._threads(), self.drainer.work, self.releases]

    def stats(self) -> dict[str, int]:
        """revocations, early_releases, forced_releases (as the CM reported them)."""
        counts = self.notices.counts()
        return {"revocations": counts["revocations"], "early_releases": counts["early"],
                "forced_releases": counts["forced"]}
