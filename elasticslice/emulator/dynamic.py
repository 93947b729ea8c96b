"""Dynamic ("elastic") slices: node reclamation (the server the client registers with,
``/protogeni/xmlrpc/dynslice``, is :mod:`elasticslice.emulator.dynslice`, re-exported here).

When other tenants want nodes (the load model, ``emulator load``) or the admin
revokes some, the ``Reclaimer`` picks the next nodes in its ranking of the nodes of slices
with an endpoint (``LIFO``: newest first; ``CLIENT``: lowest client value first), calls the
client's NotifyDeletePending every notify interval with max_wait_time counting down, takes
nodes at once when the client's answer gives them max_wait_time 0 before their deadline
(early), deletes the rest at the deadline whatever callback is still in flight (forced),
and then calls NotifyDeleteComplete. A node the client gives back itself (DeleteNodes) is
early when that arrives before the deadline, forced after. Callbacks run on worker threads:
a slow client never holds the countdown of the others, nor its own deadline.

Values go the other way too, as on CloudLab: the emulator calls the client endpoint's
``SetResourceValues`` with what each node of the slice is worth (``values.py``, from the same
ranking: lowest = reclaimed next) when the endpoint registers, when the tenant load changes,
and before the first NotifyDeletePending of a reclamation.
"""
from __future__ import annotations

import logging
import math
import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from elasticslice.emulator.callbacks import CallbackClient
from elasticslice.emulator.context import Context
from elasticslice.emulator.dynslice import (DYNSLICE_VERSION, MAX_URL, POLICIES,  # noqa: F401
                                            DynamicSliceService)
from elasticslice.emulator.geni import GeniFault
from elasticslice.emulator.sliver import SliverOps
from elasticslice.emulator.store import EndpointRow, Holder, NodeRow, ReclaimRow
from elasticslice.emulator.tenants import Tenants
from elasticslice.emulator.values import ValuePusher, resource_values
from elasticslice.rpc.codes import GeniCode

log = logging.getLogger(__name__)

WORKERS = 8  # callbacks in flight at once (slices notified, completions sent)


class Reclaimer:
    """The reclamation loop: tenant demand, revocations, countdowns, forced deletes."""

    def __init__(self, ctx: Context, slivers: SliverOps, seed: int | None = None) -> None:
        self.ctx = ctx
        self.slivers = slivers
        self.rng = random.Random(seed)
        self.tenants = Tenants(ctx, self.rng)
        self.callbacks = CallbackClient(ctx)
        self.values = ValuePusher(ctx, self.callbacks, self.resource_values)
        self._seen_target: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # countdown callbacks, teardowns and NotifyDeleteComplete: off the reclaimer's loop
        self._workers = ThreadPoolExecutor(max_workers=WORKERS,
                                           thread_name_prefix="emulator-notify")
        self._in_flight: set[str] = set()  # slices whose countdown is being answered
        self._flight_lock = threading.Lock()
        slivers.release_hooks.append(self._on_release)

    def start(self) -> None:
        self._seen_target = self.tenants.target
        self.values.start()
        self._thread = threading.Thread(target=self._run, name="emulator-reclaimer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.ctx.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._workers.shutdown(wait=False, cancel_futures=True)
        self.values.stop()

    def wake(self) -> None:
        self.ctx.wakeup.set()

    def _run(self) -> None:
        # Each step reads the slivers and the pending reclamations: at most 10 a second
        # (what a step finds is acted on at most 0.1 s late; CloudLab's own reclamation
        # daemon runs far less often); a change that matters wakes it at once (wakeup).
        tick = max(0.1, min(0.5, self.ctx.settings.notify_interval / 2))
        while not self._stop.is_set():
            self.ctx.wakeup.wait(timeout=tick)
            self.ctx.wakeup.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:  # the loop must survive one bad step
                log.exception("reclaimer step failed")

    # ---- one step
    def tick(self) -> None:
        ctx = self.ctx
        now = ctx.clock()
        with ctx.lock:
            for sliver in ctx.store.all_slivers():
                if sliver.expires <= now:
                    log.info("sliver of %s expired; deleting it", sliver.slice_urn)
                    self.slivers.delete_sliver(sliver, reason="expired")
            self.tenants.step_model(now)
            if self.tenants.target != self._seen_target:  # load changed: values matter more
                self._seen_target = self.tenants.target
                self.values.mark_all()
            pending = [r for r in ctx.store.reclaims(pending_only=True) if r.reason == "tenant"]
            shortfall = self.tenants.reconcile(len(pending))
            if shortfall > 0:
                self._start([(n, "tenant", "") for n in self.victims(shortfall)], now)
        self._notify_due(now)

    def victims(self, count: int, hardware_type: str | None = None) -> list[NodeRow]:
        """The ``count`` nodes of dynamic slices to reclaim next."""
        return self.ranking(hardware_type)[:count]

    def resource_values(self, slice_urn: str) -> list[dict[str, Any]]:
        """What each node of ``slice_urn`` is worth now (SetResourceValues nodelist)."""
        pending = {r.node_id for r in self.ctx.store.reclaims(pending_only=True)}
        return resource_values(self.ctx, slice_urn, self.ranking(), pending)

    def ranking(self, hardware_type: str | None = None) -> list[NodeRow]:
        """Reclaimable nodes of dynamic slices, the next to go first: lowest value (LIFO:
        share of the longest holding time; CLIENT: the client's value), ties newest first."""
        store = self.ctx.store
        endpoints = {e.slice_urn: e for e in store.all_endpoints()}
        busy = {r.node_id for r in store.reclaims(pending_only=True)}
        now = self.ctx.clock()
        candidates = [n for n in store.nodes(holder=Holder.SLICE)
                      if n.slice_urn in endpoints and n.node_id not in busy
                      and (hardware_type is None or n.hardware_type == hardware_type)]
        oldest = max((now - n.allocated_at for n in candidates), default=1.0) or 1.0

        def value(node: NodeRow) -> tuple[float, float]:
            if endpoints[node.slice_urn].policy == "CLIENT":
                return (node.value, -node.allocated_at)
            return ((now - node.allocated_at) / oldest, -node.allocated_at)

        return sorted(candidates, key=value)

    def revoke(self, node_ids: list[str]) -> dict[str, str]:
        """Admin: take these nodes back (countdown for dynamic slices, at once otherwise)."""
        ctx = self.ctx
        out: dict[str, str] = {}
        now = ctx.clock()
        with ctx.lock:
            busy = {r.node_id for r in ctx.store.reclaims(pending_only=True)}
            start: list[tuple[NodeRow, str, str]] = []
            for node_id in node_ids:
                node = ctx.store.get_node(node_id)
                if node is None:
                    raise GeniFault(GeniCode.SEARCHFAILED, f"No such node: {node_id}")
                if node.holder is Holder.FREE:
                    self.tenants.receive(node, "admin")
                    out[node_id] = "taken (was free)"
                elif node.holder is Holder.TENANT or node_id in busy:
                    out[node_id] = "already taken" if node.holder is Holder.TENANT else "pending"
                else:
                    start.append((node, "admin", "admin"))
                    out[node_id] = "reclaiming"
            self._start(start, now)
        self.wake()
        return out

    def _start(self, picks: list[tuple[NodeRow, str, str]], now: float) -> None:
        for node, reason, tenant in picks:
            endpoint = self.ctx.store.get_endpoint(node.slice_urn)
            wait = self._wait_for(endpoint)
            row = ReclaimRow(0, node.node_id, node.slice_urn, node.client_id, reason, tenant,
                             now, now + wait)
            self.ctx.store.add_reclaim(row)
            log.info("reclaiming %s (%s of %s) for %s, wait %ss", node.node_id, node.client_id,
                     node.slice_urn, reason, wait)

    def _wait_for(self, endpoint: EndpointRow | None) -> int:
        if endpoint is None:
            return 0
        maxwait = int(self.ctx.settings.max_wait)
        return min(endpoint.defwaittime, maxwait) if endpoint.defwaittime > 0 else maxwait

    # ---- countdown and deletes
    def _notify_due(self, now: float) -> None:
        """Take what reached its deadline (whatever callback is in flight), and send the
        countdown to the slices due for a notice (on a worker: a slow client holds nothing
        here). Early is decided by when the answer arrives, never by when it was asked."""
        interval = self.ctx.settings.notify_interval
        by_slice: dict[str, list[ReclaimRow]] = {}
        forced: dict[str, list[ReclaimRow]] = {}
        for row in self.ctx.store.reclaims(pending_only=True):
            if now >= row.deadline:
                forced.setdefault(row.slice_urn, []).append(row)
            elif row.notifications == 0 or now >= row.last_notified + interval:
                by_slice.setdefault(row.slice_urn, []).append(row)
        for slice_urn, rows in forced.items():
            told = self._last_notice(slice_urn, rows)
            self._take(slice_urn, rows, "forced", after=told)
        for slice_urn, rows in by_slice.items():
            endpoint = self.ctx.store.get_endpoint(slice_urn)
            if endpoint is None:  # nobody is told; the deadline (now) takes them
                continue
            with self._flight_lock:
                if slice_urn in self._in_flight:
                    continue  # the last notice has not been answered yet
                self._in_flight.add(slice_urn)
            first = any(r.notifications == 0 for r in rows)
            for r in rows:
                r.notifications += 1
                r.last_notified = now
                self.ctx.store.count_notice(r)  # nothing else: a DeleteNodes may end it
            nodelist = [{"node_id": r.node_id, "client_id": r.client_id,
                         "max_wait_time": max(0, math.ceil(r.deadline - now))} for r in rows]
            self._submit(self._countdown, endpoint, slice_urn, nodelist, first)

    def _submit(self, fn: Any, *args: Any) -> Future[Any] | None:
        try:
            return self._workers.submit(self._guarded, fn, *args)
        except RuntimeError:  # stopping
            return None

    def _guarded(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # a worker must survive one bad step (the store may be closing)
            if not self._stop.is_set():
                log.exception("reclaimer worker step failed")

    def _countdown(self, endpoint: EndpointRow, slice_urn: str,
                   nodelist: list[dict[str, Any]], first: bool) -> None:
        """One NotifyDeletePending; nodes answered with max_wait_time 0 before their
        deadline go at once (early)."""
        try:
            if first:  # values first, then the notice
                self.values.push_now(slice_urn)
            early = self.callbacks.notify_delete_pending(endpoint, nodelist)
            answered = self.ctx.clock()
        finally:
            with self._flight_lock:
                self._in_flight.discard(slice_urn)
        # a DeleteNodes during the callback, or the deadline, may have ended some of them
        rows = [r for r in self.ctx.store.reclaims(pending_only=True)
                if r.slice_urn == slice_urn and r.node_id in early and answered < r.deadline]
        self._take(slice_urn, rows, "early")

    def _last_notice(self, slice_urn: str, rows: list[ReclaimRow]) -> Future[Any] | None:
        """max_wait_time 0 to the client (not waited for: the nodes go now); the call's
        future, so that NotifyDeleteComplete follows it."""
        endpoint = self.ctx.store.get_endpoint(slice_urn)
        if endpoint is None:
            return None
        for r in rows:
            r.notifications += 1
            r.last_notified = self.ctx.clock()
            self.ctx.store.count_notice(r)
        nodelist = [{"node_id": r.node_id, "client_id": r.client_id, "max_wait_time": 0}
                    for r in rows]
        return self._submit(self.callbacks.notify_delete_pending, endpoint, nodelist)

    def _take(self, slice_urn: str, rows: list[ReclaimRow], outcome: str,
              after: Future[Any] | None = None) -> None:
        """Delete the nodes of ``rows`` still pending (quick, under the lock); their
        teardown and NotifyDeleteComplete go on on a worker, after the call ``after`` (the
        last notice of a forced delete: the client hears "0 s left", then "gone", in that
        order, as two workers could otherwise send them the other way round)."""
        if not rows:
            return
        change = None
        with self.ctx.lock:
            pending = {r.id for r in self.ctx.store.reclaims(pending_only=True)}
            rows = [r for r in rows if r.id in pending]  # another path may have ended some
            if not rows:
                return
            sliver = self.ctx.store.get_sliver(slice_urn)
            current = {n.node_id: n for n in self.ctx.store.nodes(slice_urn=slice_urn)}
            doomed = [current[r.node_id].client_id for r in rows if r.node_id in current]
            for r in rows:
                if r.node_id not in current:  # already gone from the slice some other way
                    r.released_at, r.outcome = self.ctx.clock(), "gone"
                    self.ctx.store.update_reclaim(r)
            if sliver is not None and doomed:
                change = self.slivers.delete_nodes(sliver, doomed, reason=outcome,
                                                   allow_all=True)
        self._submit(self._complete, slice_urn, rows, change, after)

    def _complete(self, slice_urn: str, rows: list[ReclaimRow], change: Any,
                  after: Future[Any] | None = None) -> None:
        if change is not None:
            change.teardown.wait()  # "complete" once the nodes' processes are gone
        if after is not None:
            wait([after])  # the callback's own timeout bounds it
        endpoint = self.ctx.store.get_endpoint(slice_urn)
        if endpoint is not None:
            self.callbacks.notify_delete_complete(endpoint, [
                {"node_id": r.node_id, "client_id": r.client_id, "max_wait_time": 0}
                for r in rows])

    def _on_release(self, old: NodeRow, reason: str) -> None:
        """A node left its slice: finish its reclamation and hand it to who wanted it."""
        for row in self.ctx.store.reclaims(pending_only=True):
            if row.node_id != old.node_id:
                continue
            row.released_at = self.ctx.clock()
            if reason not in ("early", "forced"):  # the client's DeleteNodes, or the sliver
                reason = "early" if row.released_at < row.deadline else "forced"  # went
            row.outcome = reason
            self.ctx.store.update_reclaim(row)
            node = self.ctx.store.get_node(old.node_id)
            if node is not None:
                self.tenants.receive(node, row.tenant)
            log.info("reclaimed %s from %s (%s)", row.node_id, row.slice_urn, row.outcome)
