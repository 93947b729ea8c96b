"""Pilots joining and leaving the ``dask`` framework: who may be adopted, the drain's hooks
(the drain itself is ``PilotFramework.drain_pilot``), retirement (``retire``), losses,
evacuations, and where long units may go (``DaskFramework`` mixes ``PilotMoves`` in).

Every worker of a framework carries the framework's tag (``topic``) and long-unit tag
(``topic-long``) as resources; units ask for one of them. Our own workers get both when they
start; a worker that joins on its own gets them only once adopted (``_grant``), so a worker
that is not adopted never receives a unit. Setting a worker's tags to 0 (on the worker and
at the scheduler, one ``client.run``) stops it at once from starting queued units and the
scheduler from sending new ones: that is how a drain stops dispatch. Units queued on it are
then cancelled in Dask and resubmitted under a new key (they run elsewhere); units that
run on are watched until they end or the watchdog at ``deadline - margin`` moves them too.
A pilot lost or cancelled has its tags set to 0 at the scheduler alone (its worker may be
gone, or live on a while) before its units are requeued, all of them.
Events from a worker a unit was moved away from never touch the unit again (their
completions count as duplicates).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from troy.frameworks.base import Pilot
from troy.frameworks.dask import agent
from troy.frameworks.dask.events import UnitRecord
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit

log = logging.getLogger(__name__)


class PilotMoves:
    """Mixin of ``DaskFramework`` (which provides the attributes below)."""

    client: Any
    topic: str
    name: str
    long_unit: float
    _records: dict[str, UnitRecord]
    _by_key: dict[str, UnitRecord]
    _by_addr: dict[str, Pilot]
    _dead_addrs: set[str]
    _parked: dict[str, list[UnitRecord]]
    _moved: dict[str, ComputeUnit]
    _workers: dict[str, Any]
    _tags_lock: Any
    verify_names: bool
    adopt_filter: Any
    _submitq: Any
    _dispatch_lock: Any
    _lock: Any
    _stats: Any
    _links: Any

    # -------------------------------------------------------------- tags ---------------
    @property
    def long_tag(self) -> str:
        return f"{self.topic}-long"

    def _unit_resources(self, cores: int, long: bool) -> dict[str, float]:
        return {"cores": cores, self.long_tag if long else self.topic: 1}

    def _grant(self, addr: str, tags: dict[str, float]) -> bool:
        """Set ``tags`` on the worker at ``addr``, then at the scheduler (from here: a
        worker may not set its own there); when one becomes positive, hand the worker the
        tasks that were waiting for such a worker."""
        try:
            failed = self.on_node(addr, agent.set_tags, tags)[addr]
            if failed is not None:
                raise RuntimeError(failed)
            self.client.run_on_scheduler(agent.tags_at_scheduler, addr, tags)
            return True
        except Exception as err:  # the worker left meanwhile
            log.info("framework %s: setting tags on %s: %s", self.name, addr, err)
            return False

    def _values_changed(self) -> None:
        """Grant the long-unit tag to the pilots that may take long units, and only them."""
        if self.client is None:
            return
        with self._tags_lock:  # one placement at a time (values, joins and leaves race)
            eligible = {p.id for p in self.long_pilots()}
            for p in self.list_pilots():
                if p.state is not State.RUNNING or p.draining or not p.native_id:
                    continue
                want = p.id in eligible
                if getattr(p, "long_ok", None) is not want and self._grant(
                        p.native_id, {self.long_tag: agent.TAG_AMOUNT if want else 0}):
                    p.long_ok = want

    def _refusal(self, addr: str, name: str | None, resources: dict[str, float]) -> str:
        """Why the worker may not be adopted ("" if it may)."""
        if self.verify_names:
            cn = self.client.run_on_scheduler(agent.peer_common_name, addr)
            if cn is None or cn != name:
                return f"its name is not its certificate's ({cn})"
        if self.adopt_filter is not None and not self.adopt_filter(str(name), addr,
                                                                   dict(resources)):
            return "refused by the filter"
        return ""

    # -------------------------------------------------------------- moves --------------
    def _processing(self, addr: str) -> set[str]:
        """Keys the scheduler has on the worker at ``addr`` (queued there or running)."""
        if self._links is not None:
            return self._links.keys(addr)
        try:
            return {str(k) for k in self.client.processing(workers=[addr]).get(addr, ())}
        except Exception as err:
            log.info("framework %s: asking what runs on %s: %s", self.name, addr, err)
            return set()

    def _withdraw(self, addr: str) -> set[str]:
        """The keys the worker at ``addr`` holds (queued there or running), once Dask may
        send it no more of our units: a pilot we lose or cancel may live on for a while
        (CloudLab takes a node when it likes; a retirement takes its time), and until then
        Dask would hand it units (stealing them from busy pilots, or placing the ones we
        requeue) whose events we ignore from a dead address: their futures would end with
        no result ("unit result lost") or lost with it ("dask future lost").

        Under ``_tags_lock``: a grant to the worker sets its tags at the scheduler, so
        one in flight must land before the withdrawal, never after it (the
        pilot is draining already: no grant comes later). On the unit channel: what was
        sent to it and has not ended (its tags are withdrawn all the same)."""
        try:
            with self._tags_lock:
                keys = self.client.run_on_scheduler(agent.withdraw, addr,
                                                    [self.topic, self.long_tag])
            if self._links is not None:
                return self._links.keys(addr)
            return {str(k) for k in keys}
        except Exception as err:
            log.info("framework %s: withdrawing %s: %s", self.name, addr, err)
            return self._links.keys(addr) if self._links is not None else set()

    def _held_by(self, pilot: Pilot, keys: set[str]) -> list[UnitRecord]:
        addr = pilot.native_id
        return [r for r in self._records.values()
                if r.unit.state not in FINAL_STATES and not r.canceling
                and (addr is None or addr not in r.left)
                and r.future is not None
                and (r.bound is pilot or (addr is not None and r.addr == addr)
                     or r.key in keys)]

    def _requeue_rec(self, rec: UnitRecord, addr: str | None) -> None:
        """Move ``rec``'s unit away from ``addr`` (its attempt there is dropped, killed by
        the caller): a new Dask key, dispatched again. Under ``_dispatch_lock``."""
        if addr:
            rec.left.add(addr)
        fut, rec.future = rec.future, None
        self._by_key.pop(rec.key, None)
        if fut is not None:
            fut.cancel()
        self._unreserve(rec)
        if rec.bound is not None and (rec.bound.draining or rec.bound.state in FINAL_STATES):
            rec.bound = None
        rec.addr = None
        self._moved[rec.unit.id] = rec.unit
        self._stats.add(requeued=1)
        log.info("framework %s: unit %s moved off %s (state %s, attempt %d)", self.name,
                 rec.unit.id, addr, rec.unit.state.value, rec.unit.attempts)
        rec.unit._requeue()
        rec.unit.attempts += 1
        self._submitq.put(rec)
        self._unit_gone(rec, addr)

    def _kill_later(self, addr: str, unit_ids: list[str]) -> None:
        """Kill moved units' processes on the worker, without waiting for it (on the unit
        channel, requeuing took them back already)."""
        if not unit_ids or self.client is None or self._links is not None:
            return

        def kill() -> None:
            try:
                self.on_node(addr, agent.kill_units, unit_ids)
            except Exception as err:  # gone already: nothing runs there
                log.info("framework %s: killing moved units on %s: %s", self.name, addr, err)

        threading.Thread(target=kill, daemon=True, name=f"troy-kill-{addr}").start()

    def _evacuate(self, pilot: Pilot, ask: bool = True) -> list[ComputeUnit]:
        """Requeue every unit of a pilot that is going away (at-least-once)."""
        addr = pilot.native_id
        keys = self._withdraw(addr) if ask and addr else set()
        with self._dispatch_lock:
            for rec in self._parked.pop(pilot.id, []):
                rec.bound = None
                self._submitq.put(rec)
            recs = self._held_by(pilot, keys)
            old = [rec.key for rec in recs if rec.key]
            for rec in recs:
                self._requeue_rec(rec, addr)
        if ask:   # its worker still serves: let go of the old tasks before it leaves
            self._let_go(old)
        if addr and self._links is not None:
            self._links.drop(addr)
        if addr:
            self._kill_later(addr, [r.unit.id for r in recs])
        return [r.unit for r in recs]

    def _let_go(self, keys: list[str]) -> None:
        """The scheduler forgets moved units' old tasks now, not when the futures' cancel
        comes on the client's stream (see :func:`agent.let_go`)."""
        if not keys or self.client is None or self._links is not None:
            return
        try:
            self.client.run_on_scheduler(agent.let_go, keys, self.client.id)
        except Exception as err:   # the scheduler is gone: nothing of them runs again
            log.info("framework %s: letting go of moved tasks: %s", self.name, err)

    def _unit_gone(self, rec: UnitRecord, addr: str | None) -> None:
        self._unit_left(rec.unit.id)

    def _handle_cluster(self, msg: dict) -> None:
        addr = msg.get("worker")
        if msg["action"] == "add-worker":
            if self.adopt_workers and addr and self.client is not None:
                self._adopt(addr, self.workers_info().get(addr, {}))
            return
        pilot = self._by_addr.get(addr)
        if pilot is None or addr in self._dead_addrs or pilot.state in FINAL_STATES:
            return
        drained = pilot.draining  # a drained pilot's machine is given back: expected
        (log.info if drained else log.warning)("pilot %s: worker %s left%s", pilot.id, addr,
                                               "" if drained else " unexpectedly")
        self._dead_addrs.add(addr)
        pilot.draining = True
        self._end_drain(pilot)
        self._evacuate(pilot, ask=False)
        pilot._set_state(State.DONE if drained else State.FAILED)
        self._values_changed()

    def _stop_worker(self, pilot: Pilot) -> None:
        w = self._workers.get(pilot.id)
        if w is None:
            return
        if w.timer is not None:
            w.timer.cancel()
        if w.proc is None:  # adopted: ask the scheduler to retire it
            if pilot.native_id and self.client is not None:
                try:
                    self.client.retire_workers([pilot.native_id], close_workers=True)
                except Exception:
                    log.exception("retiring worker %s", pilot.native_id)
            return
        w.proc.stop()

    # -------------------------------------------------------------- drain hooks --------
    # (the drain itself is PilotFramework.drain_pilot, the same on every framework)
    def _stop_dispatch(self, pilot: Pilot) -> None:
        """Its tags to 0 (under ``_tags_lock``: an adoption's grant in flight lands first,
        and then sees ``draining``); units parked for it go back to the queue."""
        addr = pilot.native_id
        if addr and pilot.state is State.RUNNING and addr not in self._dead_addrs:
            with self._tags_lock:
                self._grant(addr, {self.topic: 0, self.long_tag: 0})
        self._values_changed()  # long units may need another home
        with self._dispatch_lock:
            for rec in self._parked.pop(pilot.id, []):
                rec.bound = None
                self._submitq.put(rec)

    def _held_units(self, pilot: Pilot) -> dict[str, ComputeUnit]:
        addr = pilot.native_id
        keys = self._processing(addr) if addr else set()
        with self._dispatch_lock:
            held = {r.unit.id: r for r in self._held_by(pilot, keys)}
            for rec in list(self._records.values()):  # guessed here, will run elsewhere
                if rec.reserved is pilot and rec.unit.id not in held:
                    self._unreserve(rec)
        return {uid: r.unit for uid, r in held.items()}

    def _requeue_units(self, pilot: Pilot, units: list[ComputeUnit]) -> None:
        addr = pilot.native_id
        with self._dispatch_lock:
            recs = [r for u in units if (r := self._records.get(u.id)) is not None
                    and r.unit is u and r.future is not None and not r.canceling]
            old = [rec.key for rec in recs if rec.key]
            for rec in recs:
                self._requeue_rec(rec, addr)
        self._let_go(old)
        if addr:
            self._kill_later(addr, [r.unit.id for r in recs])

    def lose_pilot(self, pilot: Pilot, reason: str = "lost") -> list[ComputeUnit]:
        with self._lock:
            if pilot.state in FINAL_STATES:
                return []
            if pilot.native_id:
                self._dead_addrs.add(pilot.native_id)
            pilot.draining = True
        log.warning("pilot %s: %s; requeuing its units", pilot.id, reason)
        self._end_drain(pilot)
        units = self._evacuate(pilot)
        pilot._set_state(State.FAILED)
        self._values_changed()
        w = self._workers.get(pilot.id)
        if w is not None and w.proc is not None:
            threading.Thread(target=w.proc.stop, daemon=True).start()
        elif pilot.native_id and self.client is not None:  # adopted: let the scheduler
            threading.Thread(target=self._retire, args=(pilot.native_id,),  # forget it
                             daemon=True).start()
        return units

    def retire(self, pilot: Pilot, until: float | None = None) -> bool:
        """``PilotFramework.retire``: Dask's own retirement of ``pilot``'s worker, for the
        work Troy's drain does not see (plain Dask tasks of the scheduler's other clients):
        the scheduler sends it nothing new, copies the data only it holds to other workers,
        then removes it (the tasks it was running are rescheduled elsewhere) and closes it;
        a node agent leaves for good instead of rejoining. Waits until ``until`` (epoch
        seconds; None: as long as it takes) at most. True if it retired (or had no live
        worker); False on a timeout or an error (logged; Dask's own recovery takes over)."""
        addr = pilot.native_id
        if not addr or self.client is None or addr in self._dead_addrs:
            return True
        with self._lock:  # its worker leaving is expected now, not a failure
            pilot.draining = True
        timeout = None if until is None else max(0.1, until - time.time())
        try:
            from troy.frameworks.dask.node import leave_for_good
            # a node agent stops once retired (its node goes back) instead of rejoining
            self.on_node(addr, leave_for_good)
            self.client.sync(self.client.scheduler.retire_workers, workers=[addr],
                             close_workers=True, callback_timeout=timeout)
            return True
        except Exception as err:  # a timeout, or it left: Dask's own recovery takes over
            log.warning("framework %s: retiring worker %s: %s", self.name, addr,
                        err or type(err).__name__)
            return False

    def _retire(self, addr: str) -> None:
        try:
            self.client.retire_workers([addr], close_workers=True)
        except Exception as err:
            log.info("framework %s: retiring worker %s: %s", self.name, addr, err)
