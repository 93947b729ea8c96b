"""Other tenants: the users of the testbed who are not you, and who want nodes back.

The number of nodes other tenants hold has a target. ``emulator load --busy N`` sets it;
the seeded load model (``serve --tenant-load F``) moves it around F of the pool every
``tenant_interval`` seconds. Reconciling takes free nodes first; what free nodes cannot
cover is the shortfall the reclaimer takes from dynamic slices. Nodes revoked by the admin
are held by the tenant ``admin`` and count too.
"""
from __future__ import annotations

import logging
import random

from elasticslice.emulator import pool
from elasticslice.emulator.context import Context
from elasticslice.emulator.store import Holder, NodeRow

log = logging.getLogger(__name__)

TARGET_KEY = "tenant_target"


def next_busy_target(rng: random.Random, total: int, load: float) -> int:
    """Tenant demand for the next period: around ``load`` of ``total``, never outside 0..total."""
    if load <= 0.0 or total <= 0:
        return 0
    fraction = rng.gauss(load, max(load / 3.0, 0.01))
    return max(0, min(total, round(total * fraction)))


class Tenants:
    """Keeps the tenant-held node count at its target (pure bookkeeping on the store)."""

    def __init__(self, ctx: Context, rng: random.Random) -> None:
        self.ctx = ctx
        self.rng = rng
        self._next_model_step = 0.0
        self._serial = 0

    @property
    def target(self) -> int | None:
        raw = self.ctx.store.get_meta(TARGET_KEY)
        return int(raw) if raw not in (None, "") else None

    def set_target(self, busy: int) -> None:
        total = len(self.ctx.store.nodes())
        self.ctx.store.set_meta(TARGET_KEY, str(max(0, min(total, busy))))

    def step_model(self, now: float) -> None:
        load = self.ctx.settings.tenant_load
        if load <= 0.0 or now < self._next_model_step:
            return
        self._next_model_step = now + self.ctx.settings.tenant_interval
        total = len(self.ctx.store.nodes())
        target = next_busy_target(self.rng, total, load)
        if target != self.target:
            log.info("tenant load: other tenants now want %d of %d nodes", target, total)
        self.ctx.store.set_meta(TARGET_KEY, str(target))

    def _name(self) -> str:
        self._serial += 1
        return f"tenant-{self.rng.randint(1, 40)}"

    def reconcile(self, pending: int) -> int:
        """Move nodes between free and tenants; the shortfall left for the reclaimer."""
        target = self.target
        if target is None:
            return 0
        store = self.ctx.store
        held = store.nodes(holder=Holder.TENANT)
        if len(held) > target:
            # Tenants finish: the most recent arrivals leave first.
            held.sort(key=lambda n: n.allocated_at, reverse=True)
            with store.transaction():
                for node in held[: len(held) - target]:
                    store.put_node(pool.release(node))
            return 0
        need = target - len(held) - pending
        if need <= 0:
            return 0
        free = store.nodes(holder=Holder.FREE)
        self.rng.shuffle(free)
        now = self.ctx.clock()
        with store.transaction():
            for node in free[:need]:
                store.put_node(pool.hold_for_tenant(node, self._name(), now))
        return max(0, need - len(free))

    def receive(self, node: NodeRow, tenant: str) -> None:
        """A reclaimed node goes to the tenant that wanted it."""
        self.ctx.store.put_node(pool.hold_for_tenant(node, tenant or self._name(),
                                                     self.ctx.clock()))
