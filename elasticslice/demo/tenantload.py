"""The other tenants of the demo's CloudLab: load that takes a node back mid-run.

The emulator gives other tenants the nodes they want: free nodes first, then nodes
reclaimed from slices with an endpoint (with a ``NotifyDeletePending`` countdown). The
demo's driver waits until units run on every pilot, then asks (admin ``SetLoad``) for one
node more than are free, so exactly one of ours is reclaimed while its units run. Once
that node is given back (early, after its drain, or forced at the deadline) and a few
seconds have passed, the load goes back to what it was, nodes are free again, and the
cluster can grow again. ``step()`` is called from the demo's progress loop; it returns the
lines worth showing. With ``demo --sites`` (:class:`SiteAdmins`, a box of several clusters)
a round raises the load at each site that holds some of our nodes, at once, so that one of
ours is reclaimed at each (each called back and released at its own CM).
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
    """The admin paths of a box's clusters (``demo --sites``), by cluster name: a round of
    revocations takes one of our nodes at each site that holds some."""

    def __init__(self, admins: dict[str, Admin]) -> None:
        self.admins = admins


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
    site: str | None = None      # the cluster (demo --sites)


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
    _before: dict[str | None, int] = field(default_factory=dict)  # tenants' target before us
    _raised: list[str | None] = field(default_factory=list)  # the sites of this round

    def __post_init__(self) -> None:
        self._t0 = self.clock()
        if self.revocations <= 0:
            self.phase = Phase.DONE

    def _sites(self) -> list[str | None]:
        return list(self.admin.admins) if isinstance(self.admin, SiteAdmins) else [None]

    def _admin(self, site: str | None) -> Admin:
        return self.admin.admins[site] if isinstance(self.admin, SiteAdmins) else self.admin

    def pool(self, site: str | None = None) -> PoolCounts:
        status = self._admin(site).call("Status")
        rows = status["pool"].values()
        if site not in self._before:
            self._before[site] = int(status.get("tenant_target", -1))
        return PoolCounts(free=sum(r.get("free", 0) for r in rows),
                          slices=sum(r.get("slice", 0) for r in rows),
                          tenants=sum(r.get("tenant", 0) for r in rows))

    def _set(self, site: str | None, busy: int, why: str) -> str:
        self._admin(site).call("SetLoad", busy=busy)
        self.events.append(TenantEvent(round(self.clock() - self._t0, 3), busy, why, site))
        log.info("tenant load %d%s: %s", busy, _at(site), why)
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
            raised = []   # one of ours at each site holding some, as many as are left to do
            for site in self._sites():
                counts = self.pool(site)
                if counts.slices and len(raised) < self.revocations - self.forced:
                    raised.append((site, counts.tenants + counts.free + 1, counts.free))
            if not raised:
                self._since = None
                return []
            self._base, self._released = revoked, released
            self._raised = [site for site, _, _ in raised]
            self.phase, self._since = Phase.RAISED, now
            return [self._set(site, busy, f"other tenants{_at(site)} now want {busy} nodes, "
                                          f"{free} are free: CloudLab reclaims one of ours "
                                          f"({running} units running on {pilots} pilots)")
                    for site, busy, free in raised]
        if self.phase is Phase.RAISED:
            wanted = len(self._raised)
            if revoked - self._base >= wanted and released - self._released >= wanted:
                self.forced += revoked - self._base
                self.phase, self._since = Phase.RELEASED, now
                return []
            if revoked - self._base < wanted and now - self._since > self.give_up:
                self.forced += revoked - self._base
                self.phase = Phase.DONE
                return self._lower("no node of ours was reclaimed: the load goes back")
            return []
        if self.phase is Phase.RELEASED and self._since is not None \
                and now - self._since >= self.hold:
            lines = self._lower("the other tenants are done: nodes are free again")
            self.phase = Phase.WAITING if self.forced < self.revocations else Phase.DONE
            self._since = None
            return lines
        return []

    def _lower(self, why: str) -> list[str]:
        lines = []
        for site in self._raised:
            busy = max(self._before.get(site, -1), 0)
            lines.append(self._set(site, busy, f"{why.replace(':', _at(site) + ':', 1)} "
                                               f"(tenant load {busy})"))
        return lines

    def restore(self) -> None:
        """Put the tenants' load back as it was (a shared emulator); errors are logged."""
        last = {e.site: e.busy for e in self.events}
        if all(busy == max(self._before.get(site, -1), 0) for site, busy in last.items()):
            return
        try:
            self._lower("the demo ends: the load goes back")
        except ElasticSliceError as err:
            log.warning("tenant load not restored: %s", err)

    def to_json(self) -> dict[str, Any]:
        return {"revocations_wanted": self.revocations, "revocations_caused": self.forced,
                "phase": self.phase.value,
                "events": [{"at_s": e.at, "busy": e.busy, "why": e.why,
                            **({"site": e.site} if e.site else {})} for e in self.events]}


def _at(site: str | None) -> str:
    return f" at {site}" if site else ""
