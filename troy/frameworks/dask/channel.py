"""Units on Troy's own channel (``DaskFramework(unit_channel=True)``): the framework places
each unit on a pilot itself and sends it to that pilot's node agent (:mod:`.link`, the
control's end; :mod:`.runner`, the node's), instead of making it a Dask task. Dask keeps
membership (pilots still join, leave and are drained as Dask workers), data and the Dask
users' own tasks.

What changes against units as Dask tasks: placement is Troy's (a unit goes to the pilot with
the most free cores that may take it, counted exactly; with no room anywhere it waits here
until a unit ends or a pilot joins); a unit's ``future`` is a :class:`Sent` (its cancel
takes it back from the agent); what a pilot holds is what was sent to it and has not
ended; a pilot whose connection closes without a drain is lost (its units run elsewhere),
with a drain it is gone as if its worker had left. Drains, requeues, walltimes, cancels,
losses and rejoins are otherwise the same code as for Dask tasks.
"""
from __future__ import annotations

import logging
import ssl
import threading
from typing import Any

from troy.frameworks.base import Pilot
from troy.frameworks.dask import agent, runner
from troy.frameworks.dask.events import UnitRecord
from troy.frameworks.pilot import Pilot as _BasePilot
from troy.states import FINAL_STATES, State

log = logging.getLogger(__name__)

LINK_GRACE = 2.0   # seconds Dask has to say a worker whose channel closed left
CANCEL_WAIT = 5.0  # seconds a unit's cancel waits for its agent to say it took it back


class Sent:
    """A unit handed to a node agent over the channel (what a Dask future is otherwise)."""

    status = "pending"

    def __init__(self, links: Any, addr: str, unit_id: str, key: str) -> None:
        self.links, self.addr, self.unit_id, self.key = links, addr, unit_id, key

    def cancel(self, wait: float = 0.0) -> None:
        """Take the unit back from its agent (``wait``: until the agent said it did, at most
        that many seconds)."""
        self.status = "cancelled"
        self.links.cancel(self.addr, [self.unit_id], wait)

    def release(self) -> None:
        """Nothing to release: the agent forgets a unit once it ended."""


def _room(pilot: Pilot) -> int:
    """A pilot's room, exact (``DaskPilot.room`` refills Dask's queues in chunks)."""
    return _BasePilot.room.fget(pilot)   # type: ignore[attr-defined]


class UnitChannel:
    """Mixin of ``DaskFramework``: its units on the channel when ``unit_channel``."""

    name: str
    tls: Any
    listen: str
    sandbox: str | None
    topic: str
    client: Any
    connect_timeout: float
    _links: Any
    _waiting: list[UnitRecord]
    _waiting_bound: list[UnitRecord]
    _by_addr: dict[str, Pilot]
    _inbox: Any
    _submitq: Any
    _attempt: Any
    _cancel_lock: Any
    _dispatch_lock: Any
    _parked: dict[str, list[UnitRecord]]
    _records: dict[str, UnitRecord]
    _parks: Any      # the framework's: whether a unit waits for the pilot it is bound to
    _started: bool
    _scheduler_up: threading.Event

    def _start_links(self) -> None:
        from troy.frameworks.dask.link import Links
        ctx, deny = None, None
        if self.tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.tls.ca_file)
            ctx.load_cert_chain(self.tls.cert_file, self.tls.key_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
            if self.tls.deny_file:
                from troy.frameworks.dask.denylist import DenyList
                deny = DenyList(self.tls.deny_file)
        self._links = Links(self.name, self.listen, 0, ctx,
                            on_events=lambda addr, events: self._inbox.put(("batch", events)),
                            on_closed=lambda addr, why: self._inbox.put(("link", addr, why)),
                            deny=deny)
        self._links.start()

    def _open_link(self, addr: str) -> str | None:
        """Ask the worker at ``addr`` to connect to the channel; None once it has, else why
        not (a line)."""
        if self._links is None:
            return None
        try:
            cn = self.client.run_on_scheduler(agent.peer_common_name, addr) \
                if self.tls is not None else None
            token = self._links.expect(addr, cn)
            failed = self.on_node(addr, runner.open_link, self._links.address, token)[addr]
        except Exception as err:  # noqa: BLE001 - it left meanwhile
            return f"{type(err).__name__}: {err}"
        if failed is not None:
            return f"it could not connect to the unit channel: {failed}"
        if not self._links.wait(addr, self.connect_timeout):
            return "it did not connect to the unit channel"
        return None

    # ------------------------------------------------------------ dispatch ------------------
    def _eligible(self, p: Pilot, cores: int, avoid: set[str]) -> bool:
        return p.state is State.RUNNING and not p.draining and bool(p.native_id) \
            and p.size >= cores and p.native_id not in avoid \
            and self._links.connected(p.native_id)

    def _place(self, rec: UnitRecord, valued: int) -> Pilot | None:
        """The pilot ``rec``'s unit goes to now (its reservation moved there), or None: one
        wide enough for it (and valued, for a long unit), with free cores for it first;
        for a unit moved off a pilot (revoked, lost), one at another site than that
        pilot's next (CloudLab takes nodes back where it needs them: more may follow
        there); then the most room (its backlog)."""
        if rec.bound is not None:
            return rec.bound
        cores = rec.unit.description.cores
        self._unreserve(rec)   # a guess made at submission: placed for real now
        long = cores <= valued and self.is_long(rec.unit.description)
        away = self._sites_left(rec)
        best, best_score = None, (False, False, 0)
        for p in (self.long_pilots() if long else self.list_pilots()):
            room = _room(p)
            if room < cores or not self._eligible(p, cores, rec.left):
                continue
            score = (p.free_cores >= cores, p.description.site not in away, room)
            if score > best_score:
                best, best_score = p, score
        if best is not None:
            self._reserve(rec, best)
        return best

    def _sites_left(self, rec: UnitRecord) -> set[str]:
        """The sites of the pilots ``rec``'s unit was moved off (a pilot knows its site when
        its resource manager says: elasticslice's are labelled with their node's CM)."""
        if not rec.left:
            return set()
        sites = set()
        for addr in rec.left:
            pilot = self._by_addr.get(addr)
            site = pilot.description.site if pilot is not None else None
            if site:
                sites.add(site)
        return sites

    def _dispatch_links(self, batch: list[UnitRecord]) -> None:
        """Under ``_dispatch_lock``: send each unit to its pilot, one frame a pilot."""
        valued = max((p.size for p in self.long_pilots()), default=0)
        groups: dict[str, tuple[Pilot, list[UnitRecord]]] = {}
        for rec in batch:
            if rec.unit.state in FINAL_STATES or not self._started or rec.canceling \
                    or self._parks(rec):
                continue
            if rec.bound is not None and not self._links.connected(rec.bound.native_id):
                self._wait(rec)   # adopted, its agent not connected yet
                continue
            pilot = self._place(rec, valued)
            if pilot is None:
                self._wait(rec)
                continue
            groups.setdefault(pilot.native_id, (pilot, []))[1].append(rec)
        for addr, (pilot, recs) in groups.items():
            # the units its cores start at once go in a frame of their own, before the rest
            # are encoded (250-member bundles: a frame of 20 took 20-30 ms to make, which
            # the pilot's cores spent waiting)
            first = max(1, pilot.size)
            for chunk in (recs[:first], recs[first:]):
                if chunk:
                    self._send_to(addr, chunk)

    def _send_to(self, addr: str, recs: list[UnitRecord]) -> None:
        """Under ``_dispatch_lock``: ``recs`` to the agent at ``addr`` in one frame; if its
        connection closed meanwhile, they are placed again (their pilot is lost, or it
        reconnects)."""
        items, sent = [], []
        # a cancel waits until they are on their way: its own frame follows theirs, and the
        # agent drops them before they start (their future set, the frame not yet queued,
        # a cancel frame would reach the agent first and the units start after it)
        with self._cancel_lock:
            for rec in recs:
                if rec.unit.state in FINAL_STATES or rec.canceling:
                    continue
                rec.key = f"troy-unit-{next(self._attempt)}-{self.topic}"
                rec.keys.add(rec.key)
                rec.future = Sent(self._links, addr, rec.unit.id, rec.key)
                rec.addr = addr
                sent.append(rec)
                items.append([rec.key, rec.unit.id,
                              runner.description_to_wire(rec.unit.description), self.sandbox])
            if sent and not self._links.send_units(addr, items):
                for rec in sent:
                    rec.future, rec.addr = None, None
                    self._unreserve(rec)
                    self._wait(rec)

    def _refill(self) -> None:
        """Units that found no room go to the dispatcher again, and pilots with idle cores
        take units queued on other agents (a unit ended, a pilot joined)."""
        if self._links is None:
            return
        if self._waiting or self._waiting_bound:
            with self._dispatch_lock:
                waiting = self._take_waiting()
            if waiting:
                self._submitq.put(waiting)
            return
        self._rebalance()

    def _wait(self, rec: UnitRecord) -> None:
        """Under ``_dispatch_lock``: ``rec`` found no room (or its pilot's agent is not
        connected yet): it goes to the dispatcher again when room opens."""
        (self._waiting if rec.bound is None else self._waiting_bound).append(rec)

    def _take_waiting(self) -> list[UnitRecord]:
        """Under ``_dispatch_lock``: the waiting units the room open now may take, oldest
        first (those bound to a pilot always): placing every waiting unit on every batch
        of events made a burst of N units cost O(N^2) placements."""
        taken, self._waiting_bound = self._waiting_bound, []
        room = sum(_room(p) for p in self.list_pilots()
                   if self._eligible(p, 1, set()))
        n = 0
        while n < len(self._waiting) and room > 0:
            room -= self._waiting[n].unit.description.cores
            n += 1
        taken.extend(self._waiting[:n])
        del self._waiting[:n]
        return taken

    def _rebalance(self) -> None:
        """Units queued on an agent beyond its cores (not started) move to pilots whose
        cores are idle and may take them, as Dask's scheduler steals work: the latest sent
        first. A unit that starts as it is taken back is killed there (its events are
        ignored) and runs on the idle pilot."""
        live = [p for p in self.list_pilots() if p.state is State.RUNNING and p.native_id
                and not p.draining]
        idle = {p.id: p.free_cores for p in live if p.free_cores > 0
                and self._links.connected(p.native_id)}
        over = {p.native_id: p._used - p.size for p in live if p._used > p.size}
        if not idle or not over:
            return
        valued = max((p.size for p in self.long_pilots()), default=0)
        takers = {p.id: p for p in live}
        long_ok = {p.id for p in self.long_pilots()}
        taken: list[UnitRecord] = []
        with self._dispatch_lock:
            # only what was sent to busy agents, latest first: a backlog's worth each
            for addr in list(over):
                for uid in reversed(self._links.unit_ids(addr)):
                    if not idle or over[addr] <= 0:
                        break
                    rec = self._records.get(uid)
                    if rec is None or rec.addr != addr or rec.bound is not None \
                            or not isinstance(rec.future, Sent) or rec.canceling \
                            or rec.unit.state is State.RUNNING:
                        continue
                    cores = rec.unit.description.cores
                    long = cores <= valued and self.is_long(rec.unit.description)
                    to = next((pid for pid, free in idle.items() if free >= cores
                               and (not long or pid in long_ok)
                               and self._eligible(takers[pid], cores, rec.left)), None)
                    if to is None or over[addr] < cores:
                        continue
                    over[addr] -= cores
                    idle[to] -= cores
                    if idle[to] <= 0:
                        del idle[to]
                    self._links.cancel(addr, [uid])
                    rec.future, rec.addr = None, None
                    self._unreserve(rec)
                    taken.append(rec)
            if taken:
                log.debug("framework %s: %d queued unit(s) moved to idle pilots", self.name,
                          len(taken))
                self._dispatch_links(taken)

    def _link_closed(self, addr: str, why: str) -> None:
        """On the event thread: the agent at ``addr`` closed its connection. Dask keeps
        membership: a worker that left, or whose scheduler died (its workers close with
        it, and the framework's recovery moves their units), is handled there; one whose
        connection alone closed is lost once :data:`LINK_GRACE` has passed without that."""
        pilot = self._by_addr.get(addr)
        if pilot is None or pilot.state in FINAL_STATES or pilot.native_id != addr:
            return
        if pilot.draining:   # going away, as asked
            self._handle_cluster({"action": "remove-worker", "worker": addr})
            self._refill()
            return
        timer = threading.Timer(LINK_GRACE, self._inbox.put, (("link-check", addr, why),))
        timer.daemon = True
        timer.start()

    def _link_check(self, addr: str, why: str) -> None:
        pilot = self._by_addr.get(addr)
        if pilot is None or pilot.state in FINAL_STATES or pilot.native_id != addr \
                or self._links.connected(addr) or not self._started:
            return
        if not self._scheduler_up.is_set():   # a recovery under way: it decides
            self._link_closed(addr, why)
            return
        self.lose_pilot(pilot, f"its unit channel closed ({why})")
        self._refill()
