"""The other tenants of the demo's CloudLab: load that takes a node back mid-run.

The emulator gives other tenants the nodes they want: free nodes first, then nodes
reclaimed from slices with an endpoint (with a ``NotifyDeletePending`` countdown). The
demo's driver waits until units run on every pilot, then asks (admin ``SetLoad``) for one
node more than are free, so exactly one of ours is reclaimed while its units run. Once
that node is given back (early, after its drain, or forced at the deadline) and a few
seconds have passed, the load goes back to what it was, nodes are free again, and the
cluster can grow again. ``step()`` is called from the demo's progress loop; it returns the
lines worth showing.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)


class Admin(Protocol):
    """The emulator's admin path (``elasticslice.emulator.adminclient.AdminClient``)."""

    def call(self, method: str, **params: Any) -> Any: ...


class SiteAdmins:
    """The admin paths of a box's clusters, taken in turn: each revocation at the next
    site (``demo --sites``). ``site`` names the one calls go to now."""

    def __init__(self, admins: dict[str, Admin]) -> None:
        self.admins = admins
        self.order = list(admins)
        self.site = self.order[0]

    def call(self, method: str, **params: Any) -> Any:
        return self.admins[self.site].call(method, **params)

    def next_site(self) -> None:
        self.site = self.order[(self.order.index(self.site) + 1) % len(self.order)]


class Phase(str, Enum):
    WAITING = "waiting"          # for units on every pilot
    RAISED = "raised"            # tenant load raised; waiting for our node to go
    RELEASED = "released"        # our node is back; the load stays a moment
    DONE = "done"                # every revocation asked for has happened


@dataclass
class TenantEvent:
    """One change of the tenants' load, for the report."""

    at: float                    # seconds since the driver started
    busy: int                    # nodes the other tenants want now
    why: str


@dataclass
class PoolCounts:
    free: int
    slices: int
    tenants: int


@dataclass
class TenantLoad:
    """Forces ``revocations`` reclamations of our nodes, one at a time, while units run.

    ``patience``: seconds with two pilots and running units before the driver stops
    waiting for units on every pilot. ``hold``: seconds the load stays after our node is
    given back. ``give_up``: seconds after raising the load without any revocation before
    the load goes back (an emulator that had other nodes to take, say)."""

    admin: Admin
    revocations: int = 1
    node_cores: int | None = None
    patience: float = 5.0
    hold: float = 3.0
    give_up: float = 30.0
    clock: Callable[[], float] = time.monotonic
    phase: Phase = Phase.WAITING
    events: list[TenantEvent] = field(default_factory=list)
    forced: int = 0              # revocations this driver caused
    _t0: float = 0.0
    _since: float | None = None  # when the phase's condition first held
    _base: int = 0               # revocations + releases seen when the load was raised
    _released: int = 0
    _before: int = -1            # the tenants' target before we touched it (-1: none)

    def __post_init__(self) -> None:
        self._t0 = self.clock()
        if self.revocations <= 0:
            self.phase = Phase.DONE

    def pool(self) -> PoolCounts:
        status = self.admin.call("Status")
        rows = status["pool"].values()
        if self._before == -1 and not self.events:
            self._before = int(status.get("tenant_target", -1))
        return PoolCounts(free=sum(r.get("free", 0) for r in rows),
                          slices=sum(r.get("slice", 0) for r in rows),
                          tenants=sum(r.get("tenant", 0) for r in rows))

    def _set(self, busy: int, why: str) -> str:
        self.admin.call("SetLoad", busy=busy)
        self.events.append(TenantEvent(round(self.clock() - self._t0, 3), busy, why))
        log.info("tenant load %d: %s", busy, why)
        return why

    def _every_pilot_busy(self, pilots: int, running: int) -> bool:
        if self.node_cores:
            return running > (pilots - 1) * self.node_cores
        return running >= pilots

    def step(self, snapshot: Any, stats: dict[str, Any], work_left: bool) -> list[str]:
        """Advance; return lines to show. ``snapshot``: the cluster's (pilots,
        units_running); ``stats``: its counters (revocations, early/forced releases)."""
        try:
            return self._step(snapshot, stats, work_left)
        except ElasticSliceError as err:     # the emulator's admin path failed: say so once
            log.warning("tenant load: %s", err)
            self.phase = Phase.DONE
            return [f"tenant load: the emulator's admin path failed ({err}); no more "
                    f"revocations"]

    def _step(self, snapshot: Any, stats: dict[str, Any], work_left: bool) -> list[str]:
        now = self.clock()
        revoked = int(stats.get("revocations", 0))
        released = int(stats.get("early_releases", 0)) + int(stats.get("forced_releases", 0))
        if self.phase is Phase.WAITING:
            pilots, running = int(snapshot.pilots), int(snapshot.units_running)
            if not work_left or pilots < 2 or running < 1:
                self._since = None
                return []
            if self._since is None:
                self._since = now
            if not self._every_pilot_busy(pilots, running) and now - self._since < self.patience:
                return []
            counts = self.pool()
            if counts.slices == 0 and isinstance(self.admin, SiteAdmins):
                self.admin.next_site()   # none of ours at this site (yet): the next one
                self._since = None
                return []
            busy = counts.tenants + counts.free + 1
            self._base, self._released = revoked, released
            self.phase, self._since = Phase.RAISED, now
            return [self._set(busy, f"other tenants{self._at()} now want {busy} nodes, "
                                    f"{counts.free} are free: CloudLab reclaims one of ours "
                                    f"({running} units running on {pilots} pilots)")]
        if self.phase is Phase.RAISED:
            if revoked > self._base and released > self._released:
                self.forced += revoked - self._base
                self.phase, self._since = Phase.RELEASED, now
                return []
            if revoked == self._base and now - self._since > self.give_up:
                self.phase = Phase.DONE
                return [self._lower(f"no node of ours{self._at()} was reclaimed: the load "
                                    f"goes back")]
            return []
        if self.phase is Phase.RELEASED and self._since is not None \
                and now - self._since >= self.hold:
            line = self._lower(f"the other tenants{self._at()} are done: nodes are free "
                               f"again")
            self.phase = Phase.WAITING if self.forced < self.revocations else Phase.DONE
            self._since = None
            if isinstance(self.admin, SiteAdmins):
                self.admin.next_site()
            return [line]
        return []

    def _at(self) -> str:
        return f" at {self.admin.site}" if isinstance(self.admin, SiteAdmins) else ""

    def _lower(self, why: str) -> str:
        busy = max(self._before, 0)
        return self._set(busy, f"{why} (tenant load {busy})")

    def restore(self) -> None:
        """Put the tenants' load back as it was (a shared emulator); errors are logged."""
        if not self.events or self.events[-1].busy == max(self._before, 0):
            return
        try:
            self._lower("the demo ends")
        except ElasticSliceError as err:
            log.warning("tenant load not restored: %s", err)

    def to_json(self) -> dict[str, Any]:
        return {"revocations_wanted": self.revocations, "revocations_caused": self.forced,
                "phase": self.phase.value,
                "events": [{"at_s": e.at, "busy": e.busy, "why": e.why} for e in self.events]}
