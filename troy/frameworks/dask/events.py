"""Unit bookkeeping of the ``dask`` framework: records, core reservations, and the one
thread that turns worker events and future outcomes into Troy states (pushed, in order)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from troy.frameworks.base import Pilot
from troy.frameworks.dask import agent
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit, UnitResult

log = logging.getLogger(__name__)

# Dask future status -> Troy state, for futures that end without our ``end`` event.
# A unit whose Dask task kills its workers is requeued, up to this many dispatches.
MAX_ATTEMPTS = 10

DASK_FINAL = {"finished": State.DONE, "error": State.FAILED, "cancelled": State.CANCELED,
               "lost": State.FAILED}


@dataclass
class UnitRecord:
    """What the framework knows of one unit it holds."""

    unit: ComputeUnit
    bound: Pilot | None              # early binding
    reserved: Pilot | None = None    # whose free_cores this unit is counted against
    key: str = ""
    future: Any = None
    addr: str | None = None          # worker it runs on (from the ``run`` event)
    keys: set[str] = field(default_factory=set)  # its Dask tasks: this attempt's and earlier
    canceling: bool = False
    left: set[str] = field(default_factory=set)  # workers it was moved away from



def _killed(result: UnitResult) -> bool:
    """Whether a failed unit (or a bundle member) died of a signal or was stopped: what a
    machine going away does to it."""
    if result.members:
        return any(_killed(m) for m in result.members)
    return (result.exit_code is not None and result.exit_code < 0) \
        or result.error == "canceled"


def _release_all(futures: list[Any]) -> None:
    for fut in futures:
        fut.release()


class UnitEvents:
    """Mixin of ``DaskFramework``: state changes of its units. Worker events (``run``,
    ``end``), future outcomes (``done``) and cluster events (``cluster``, handled by the
    framework's ``_handle_cluster``) arrive in ``_inbox`` and are handled on one thread, so
    every unit's states are pushed in order. Expects the framework's ``_records``,
    ``_by_key``, ``_by_addr``, ``_dead_addrs``, ``_inbox``, ``_lock`` and ``name``."""

    _records: dict[str, UnitRecord]
    _by_key: dict[str, UnitRecord]
    _by_addr: dict[str, Pilot]
    _dead_addrs: set[str]
    _inbox: Any
    _lock: Any
    _dispatch_lock: Any
    _stats: Any
    _moved: dict[str, ComputeUnit]
    name: str

    _releasing: list[Any] | None = None  # futures to release after the current batch
    # and, from ``UnitChannel``: ``_link_closed``, ``_link_check``, ``_refill``

    def _handle_cluster(self, msg: dict) -> None:
        raise NotImplementedError

    def _requeue_rec(self, rec: UnitRecord, addr: str | None) -> None:
        raise NotImplementedError

    def _unit_gone(self, rec: UnitRecord, addr: str | None) -> None:
        """``rec``'s unit is no longer on the worker at ``addr`` (drains watch this)."""

    def _reserve(self, rec: UnitRecord, pilot: Pilot | None) -> None:
        with self._lock:  # several threads move reservations: count each exactly once
            if pilot is not None and rec.reserved is None:
                pilot._reserve(rec.unit.description.cores)
                rec.reserved = pilot

    def _unreserve(self, rec: UnitRecord) -> None:
        with self._lock:
            if rec.reserved is not None:
                rec.reserved._release(rec.unit.description.cores)
                rec.reserved = None

    def _on_done(self, fut: Any) -> None:
        self._inbox.put(("done", fut))

    def _watch(self, futures: list[Any]) -> None:
        """On the client's event loop: report each future's outcome to ``_inbox`` once it
        is no longer pending. Cheaper than ``Future.add_done_callback`` (a coroutine per
        future, handed from the submitting thread to the loop, and a hop through Dask's
        callback thread per outcome): one loop callback per dispatched batch, and a bare
        waiter on each future's completion event."""
        for fut in futures:
            self._arm(fut)

    def _arm(self, fut: Any) -> None:
        state = getattr(fut, "_state", None)
        if state is None or state.status != "pending":
            self._inbox.put(("done", fut))
            return
        event = state._get_event()
        waiters = getattr(event, "_waiters", None)
        if waiters is None:  # not the asyncio.Event we know: Dask's own way
            fut.add_done_callback(self._on_done)
            return
        waiter = asyncio.get_running_loop().create_future()
        waiters.append(waiter)

        def fired(_: Any) -> None:
            try:
                waiters.remove(waiter)
            except ValueError:
                pass
            if getattr(fut, "_cleared", False):
                return  # released: its unit was finished by its ``end`` event
            self._arm(fut)  # a retried future is pending again: wait once more

        waiter.add_done_callback(fired)

    def _event_loop(self) -> None:
        while True:
            msg = self._inbox.get()
            if msg is None:
                return
            try:
                self._handle(msg)
            except Exception:  # one bad event must not stop the stream
                log.exception("framework %s: handling %r failed", self.name, msg[:2])

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "cluster":
            self._handle_cluster(msg[1])
            return
        if kind == "done":
            self._handle_done(msg[1])
            return
        if kind == "link":   # a node agent's unit channel closed
            self._link_closed(msg[1], msg[2])
            return
        if kind == "link-check":   # ... and Dask has not said it left
            self._link_check(msg[1], msg[2])
            return
        if kind == "batch":  # a worker's events of one loop turn, in order
            self._releasing = []
            try:
                for event in msg[1]:
                    try:
                        self._handle(event)
                    except Exception:
                        log.exception("framework %s: handling %r failed", self.name,
                                      event[:2])
            finally:
                done, self._releasing = self._releasing, None
                if done:  # one hop to the client's loop for the batch, not one per unit
                    done[0].client.loop.add_callback(_release_all, done)
            self._refill()   # units ended: room for the ones waiting on the channel
            return
        _, uid, addr, payload, *rest = msg
        key = rest[0] if rest else None
        rec = self._records.get(uid)
        if rec is not None and key not in rec.keys:
            # not one of the unit's tasks, this attempt's or an earlier one's that Dask ran
            # elsewhere (the scheduler's guard passes a unit's events only from the worker
            # running the task they name): nothing of this unit
            log.info("framework %s: %s event for unit %s from %s ignored: it names task %r, "
                     "not the unit's", self.name, kind, uid, addr, key)
            return
        if rec is None or addr in self._dead_addrs or addr in rec.left \
                or rec.unit.state in FINAL_STATES:
            if kind == "end" and payload is not None:  # an attempt we moved away from
                self._late_end(uid, rec, payload)
            return
        pilot = self._by_addr.get(addr)
        if kind == "run":
            self._mark_running(rec, addr, pilot, payload)
        elif kind == "end":
            # a unit's result is data in its event: never a Dask result (a node's pickle)
            result = agent.result_from_wire(payload) if isinstance(payload, (list, tuple)) \
                else UnitResult(error=f"its node sent no result ({addr})")
            if not result.ok and pilot is not None and pilot.draining \
                    and _killed(result) and rec.unit.attempts < MAX_ATTEMPTS:
                log.info("unit %s was killed with its pilot %s: requeued", rec.unit.id,
                         pilot.id)  # the machine went away under it: not its failure
                with self._dispatch_lock:
                    self._requeue_rec(rec, addr)
                return
            self._mark_running(rec, addr, pilot, result.start)
            self._finish(rec, State.DONE if result.ok else State.FAILED, result)

    def _mark_running(self, rec: UnitRecord, addr: str, pilot: Pilot | None,
                      start: float | None) -> None:
        if rec.addr == addr and rec.unit.state is State.RUNNING:
            return
        if rec.addr is not None and rec.addr != addr and rec.unit.state is State.RUNNING:
            # Dask moved the unit itself (the worker it ran on died or closed before we
            # heard of it): that attempt is lost, the unit was requeued all the same
            log.info("framework %s: unit %s moved by Dask from %s to %s", self.name,
                     rec.unit.id, rec.addr, addr)
            rec.left.add(rec.addr)
            self._moved[rec.unit.id] = rec.unit
            self._stats.add(requeued=1)
            rec.unit.attempts += 1
        rec.addr = addr
        if pilot is not None and rec.reserved is not pilot:
            self._unreserve(rec)
            self._reserve(rec, pilot)
        if rec.unit.start is None:
            rec.unit.start = start
        rec.unit._set_state(State.RUNNING, pilot=pilot.id if pilot else addr)

    def _late_end(self, uid: str, rec: UnitRecord | None, payload: list) -> None:
        """An attempt ended where the unit no longer is: its work ran anyway (a duplicate
        once the unit completes, or already did)."""
        unit = rec.unit if rec is not None else self._moved.get(uid)
        if unit is not None and agent.result_from_wire(payload).ok:
            self._stats.completed(unit)

    def _finish(self, rec: UnitRecord, state: State, result: UnitResult) -> None:
        self._records.pop(rec.unit.id, None)
        if state is State.DONE:
            self._stats.completed(rec.unit)
        self._unit_gone(rec, rec.addr)
        self._unreserve(rec)
        fut, rec.future = rec.future, None
        self._by_key.pop(rec.key, None)
        if fut is not None and hasattr(fut, "client"):  # a Dask future: let Dask forget
            if self._releasing is not None:  # the key now, not when a pending "done"
                self._releasing.append(fut)  # message lets go of it (a pilot canceled
                #                              meanwhile reran it)
            else:
                fut.release()
        rec.unit._set_state(state, result=result)

    def _handle_done(self, fut: Any) -> None:
        rec = self._by_key.pop(fut.key, None)
        if rec is None or rec.future is not fut or self._records.get(rec.unit.id) is not rec:
            return  # finished by its ``end`` event, or a superseded attempt
        status = fut.status
        state = DASK_FINAL.get(status, State.UNKNOWN)
        if status == "finished":
            if rec.addr in self._dead_addrs:
                # its node was declared lost as it ended, its end event not taken: the
                # evacuation that follows every loss moves it, once the scheduler sends the
                # dead worker nothing more (moved now, it could go back there, and be lost)
                return
            # its ``end`` event comes first, on the same streams: none came (Troy never
            # fetches a task's result: it would be a node's pickle)
            self._finish(rec, State.FAILED, UnitResult(error="unit result lost: its node "
                                                             "sent no end event"))
        elif status == "error":
            err = fut.exception()
            if type(err).__name__ == "KilledWorker" and rec.unit.attempts < MAX_ATTEMPTS:
                with self._dispatch_lock:  # its workers died under it: not its fault
                    self._requeue_rec(rec, rec.addr)
                return
            self._finish(rec, State.FAILED, UnitResult(error=f"dask: {err!r}"))
        elif status == "cancelled" and rec.canceling:
            self._finish(rec, State.CANCELED, UnitResult(error="canceled"))
        else:  # canceled or lost behind our back (scheduler gone, client closed)
            self._stats.add(lost=1)
            self._finish(rec, State.FAILED if state is not State.DONE else state,
                         UnitResult(error=f"dask future {status}"))

