"""Dynamic ("elastic") slices: the server the client registers with, and node reclamation.

``/protogeni/xmlrpc/dynslice`` serves GetVersion, GetServerDefaults, SetSliceClientEndpoint,
RemoveSliceClientEndpoint, and SetResourceValues as an emulator extension (the client states
its own node values for the ``CLIENT`` policy, missing = 1.0; CloudLab documents no such
call). When other tenants want nodes (the load model, ``emulator load``) or the admin
revokes some, the ``Reclaimer`` picks the next nodes in its ranking of the nodes of slices
with an endpoint (``LIFO``: newest first; ``CLIENT``: lowest client value first), calls the
client's NotifyDeletePending every notify interval with max_wait_time counting down, takes
nodes at once when the client answers them with max_wait_time 0, deletes the rest when the
wait is over, and then calls NotifyDeleteComplete.

Values go the other way too, as on CloudLab: the emulator calls the client endpoint's
``SetResourceValues`` with what each node of the slice is worth (``values.py``, from the same
ranking: lowest = reclaimed next) when the endpoint registers, when the tenant load changes,
and before the first NotifyDeletePending of a reclamation.
"""
from __future__ import annotations

import ipaddress
import logging
import math
import random
import threading
import urllib.parse
from typing import Any

from elasticslice.emulator.callbacks import CallbackClient
from elasticslice.emulator.context import Context
from elasticslice.emulator.dispatch import Call, Service
from elasticslice.emulator.geni import GeniFault, optional, require
from elasticslice.emulator.sliver import SliverOps
from elasticslice.emulator.store import EndpointRow, Holder, NodeRow, ReclaimRow
from elasticslice.emulator.tenants import Tenants
from elasticslice.emulator.values import ValuePusher, resource_values
from elasticslice.rpc.codes import GeniCode

log = logging.getLogger(__name__)

POLICIES = ("LIFO", "CLIENT")
DYNSLICE_VERSION = 1
MAX_URL = 2048


def _loopback(host: str | None) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


class DynamicSliceService(Service):
    module = "dynslice"
    METHODS = frozenset({"GetVersion", "GetServerDefaults", "SetSliceClientEndpoint",
                         "RemoveSliceClientEndpoint", "SetResourceValues"})
    POSITIONAL = {
        "SetSliceClientEndpoint": ("slice_urn", "url", "credentials", "policy", "defwaittime"),
        "RemoveSliceClientEndpoint": ("slice_urn", "credentials"),
        "SetResourceValues": ("slice_urn", "credentials", "nodelist"),
    }

    def __init__(self, ctx: Context, reclaimer: Reclaimer) -> None:
        self.ctx = ctx
        self.reclaimer = reclaimer

    def _authorise(self, call: Call) -> str:
        slice_urn = require(call.params, "slice_urn")
        credentials = require(call.params, "credentials", (list, str))
        sliver = self.ctx.store.get_sliver(slice_urn)
        targets = {slice_urn} | ({sliver.sliver_urn} if sliver else set())
        self.ctx.authority.pick(credentials, call.caller, targets)
        if self.ctx.store.get_slice(slice_urn) is None:
            raise GeniFault(GeniCode.SEARCHFAILED, f"No such slice: {slice_urn}")
        return slice_urn

    def GetVersion(self, call: Call) -> Any:  # noqa: N802
        return DYNSLICE_VERSION

    def GetServerDefaults(self, call: Call) -> Any:  # noqa: N802
        return {"maxwaittime": int(self.ctx.settings.max_wait), "policy": "LIFO"}

    def SetSliceClientEndpoint(self, call: Call) -> Any:  # noqa: N802
        slice_urn = self._authorise(call)
        url = require(call.params, "url")
        if len(url) > MAX_URL:
            raise GeniFault(GeniCode.BADARGS, f"Endpoint url longer than {MAX_URL} characters")
        parts = urllib.parse.urlparse(url)
        if parts.scheme != "https" or not parts.hostname:
            raise GeniFault(GeniCode.BADARGS, f"Endpoint url must be https://host:port/...: {url}")
        if not _loopback(parts.hostname) and not self.ctx.settings.allow_remote_endpoints:
            raise GeniFault(GeniCode.BADARGS, "This emulator only calls endpoints on "
                                              f"127.0.0.1 (got {parts.hostname})")
        policy = str(optional(call.params, "policy", str, "LIFO")).upper()
        if policy not in POLICIES:
            raise GeniFault(GeniCode.BADARGS, f"Unknown policy {policy} (LIFO or CLIENT)")
        wait = optional(call.params, "defwaittime", int, 0)
        if wait < 0:
            raise GeniFault(GeniCode.BADARGS, f"defwaittime must be 0 (the server's maximum) "
                                              f"or more: {wait}")
        if wait > self.ctx.settings.max_wait:
            raise GeniFault(GeniCode.BADARGS, f"defwaittime {wait} is more than the server's "
                                              f"maxwaittime {self.ctx.settings.max_wait}")
        self.ctx.store.put_endpoint(EndpointRow(slice_urn, url, policy, wait,
                                                call.caller))
        log.info("slice %s: client endpoint %s, policy %s", slice_urn, url, policy)
        self.reclaimer.values.mark(slice_urn)
        return 1

    def RemoveSliceClientEndpoint(self, call: Call) -> Any:  # noqa: N802
        slice_urn = self._authorise(call)
        if self.ctx.store.get_endpoint(slice_urn) is None:
            raise GeniFault(GeniCode.SEARCHFAILED, f"No endpoint for {slice_urn}")
        self.ctx.store.delete_endpoint(slice_urn)
        return 1

    def SetResourceValues(self, call: Call) -> Any:  # noqa: N802
        """Emulator extension, client -> server: the client's own node values, which only
        the CLIENT policy uses. (On CloudLab, SetResourceValues is a call the server makes
        to the client's endpoint: see ``values.py``.)"""
        slice_urn = self._authorise(call)
        nodelist = require(call.params, "nodelist", list)
        nodes = {n.node_id: n for n in self.ctx.store.nodes(slice_urn=slice_urn)}
        by_client = {n.client_id: n for n in nodes.values()}
        updates: list[tuple[NodeRow, float]] = []
        for item in nodelist:
            if not isinstance(item, dict) or not isinstance(item.get("value"), (int, float)):
                raise GeniFault(GeniCode.BADARGS, "nodelist items need node_id|client_id, value")
            node = nodes.get(str(item.get("node_id", ""))) or \
                by_client.get(str(item.get("client_id", "")))
            if node is None:
                which = item.get("node_id", item.get("client_id"))
                raise GeniFault(GeniCode.BADARGS,
                                f"Not a node of this slice: {str(which)[:64]!r}")
            value = float(item["value"])
            if not 0.0 <= value <= 1.0:
                raise GeniFault(GeniCode.BADARGS, f"value must be within 0..1: {value}")
            updates.append((node, value))
        for node, value in updates:
            self.ctx.store.update_node(node.node_id, node.sliver_urn, value=value)
        return len(updates)


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
        self.values.stop()

    def wake(self) -> None:
        self.ctx.wakeup.set()

    def _run(self) -> None:
        tick = max(0.02, min(0.5, self.ctx.settings.notify_interval / 4))
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
        interval = self.ctx.settings.notify_interval
        by_slice: dict[str, list[ReclaimRow]] = {}
        for row in self.ctx.store.reclaims(pending_only=True):
            if row.notifications == 0 or now >= row.last_notified + interval or now >= row.deadline:
                by_slice.setdefault(row.slice_urn, []).append(row)
        for slice_urn, rows in by_slice.items():
            endpoint = self.ctx.store.get_endpoint(slice_urn)
            nodelist = [{"node_id": r.node_id, "client_id": r.client_id,
                         "max_wait_time": max(0, math.ceil(r.deadline - now))} for r in rows]
            early: set[str] = set()
            if endpoint is not None:
                if any(r.notifications == 0 for r in rows):  # values first, then the notice
                    self.values.push_now(slice_urn)
                early = self.callbacks.notify_delete_pending(endpoint, nodelist)
            for r in rows:
                if endpoint is not None:  # nobody is told when the slice has no endpoint
                    r.notifications += 1
                r.last_notified = now
                self.ctx.store.count_notice(r)
            # the client may have given a node back during the callback (its DeleteNodes
            # ended that reclamation "early"): those rows are no longer ours to take
            pending = {r.id for r in self.ctx.store.reclaims(pending_only=True)}
            rows = [r for r in rows if r.id in pending]
            done_early = [r for r in rows if r.node_id in early and now < r.deadline]
            forced = [r for r in rows if now >= r.deadline and r not in done_early]
            self._take(slice_urn, done_early, "early")
            self._take(slice_urn, forced, "forced")

    def _take(self, slice_urn: str, rows: list[ReclaimRow], outcome: str) -> None:
        if not rows:
            return
        change = None
        with self.ctx.lock:
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
        if change is not None:
            change.teardown.wait()  # "complete" once the nodes' processes are gone
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
            row.outcome = reason if reason in ("early", "forced") else "early"
            self.ctx.store.update_reclaim(row)
            node = self.ctx.store.get_node(old.node_id)
            if node is not None:
                self.tenants.receive(node, row.tenant)
            log.info("reclaimed %s from %s (%s)", row.node_id, row.slice_urn, row.outcome)
