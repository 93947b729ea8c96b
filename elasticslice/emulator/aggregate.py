"""One CM of a running box and what runs for it: its slivers, reclaimer, node
configuration server, and the services it answers (CM, dynamic-slice server, admin).

A box has one (its CM in the SA's domain) or one per cluster (:mod:`.clusters`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from elasticslice.emulator.admin import AdminService
from elasticslice.emulator.boot import BootRunner
from elasticslice.emulator.cm import ComponentManager
from elasticslice.emulator.context import Context
from elasticslice.emulator.dispatch import Service
from elasticslice.emulator.dynamic import DynamicSliceService, Reclaimer
from elasticslice.emulator.sliver import SliverOps
from elasticslice.emulator.tmcd import NodeConfigServer


@dataclass
class Aggregate:
    ctx: Context
    slivers: SliverOps
    reclaimer: Reclaimer
    tmcd: NodeConfigServer | None = None
    _services: list[Service] = field(default_factory=list)

    @classmethod
    def build(cls, ctx: Context, seed: int | None) -> Aggregate:
        ctx.boot = BootRunner(ctx)
        slivers = SliverOps(ctx)
        agg = cls(ctx, slivers, Reclaimer(ctx, slivers, seed=seed))
        agg._services = [ComponentManager(ctx, slivers), DynamicSliceService(ctx, agg.reclaimer),
                         AdminService(ctx, agg.reclaimer)]
        return agg

    def services(self) -> list[Service]:
        return list(self._services)

    def start_nodes(self, url: str) -> None:
        """geni-get's server first (where the nodes reach the control machine), then the
        nodes left booting by the last run, and the teardowns it left."""
        ctx = self.ctx
        assert ctx.boot is not None
        self.tmcd = NodeConfigServer(ctx, host=ctx.boot.control_address()).start()
        ctx.node_config_url = self.tmcd.url
        ctx.url = url
        ctx.boot.start()
        self.slivers.reaper.sweep()

    def control_address(self) -> str:
        return self.ctx.boot.control_address() if self.ctx.boot is not None else "127.0.0.1"

    def stop(self) -> None:
        """After the reclaimer and the listener: teardowns still running finish first."""
        self.slivers.reaper.stop()
        if self.ctx.boot is not None:
            self.ctx.boot.stop()
        if self.tmcd is not None:
            self.tmcd.stop()
            self.tmcd = None
