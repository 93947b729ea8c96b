"""Resource values: how much each node of a dynamic slice is worth to the testbed right now,
pushed to the slice's client endpoint with ``SetResourceValues`` (server -> client, as
CloudLab does).

The value of a node is its place in the reclaim order (``Reclaimer.ranking``): of the ``n``
nodes that could be reclaimed, the ``k``-th to go (k = 0 goes next) is worth
``(k + 1) / (n + 1)``; a node already being reclaimed is worth 0. So the lowest value is
always the node that goes next, whatever the policy: LIFO (values grow with how long the
slice has held the node) or CLIENT (the order the client's own values give).

``ValuePusher`` sends them off the reclaimer loop, on its own thread: each call has a
bounded timeout; a failed push is counted and retried later, backing off from the notify
interval up to a minute, until it gets through, the endpoint is removed, or a newer change
replaces it;
``push_now`` is the synchronous push the reclaimer makes before its first
NotifyDeletePending of a reclamation.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from elasticslice.emulator.callbacks import CallbackClient
from elasticslice.emulator.context import Context
from elasticslice.emulator.store import NodeRow

log = logging.getLogger(__name__)

MAX_BACKOFF = 60.0


def resource_values(ctx: Context, slice_urn: str, ranking: list[NodeRow],
                    pending: set[str]) -> list[dict[str, Any]]:
    """The SetResourceValues nodelist of one slice: every node it holds, valued 0..1."""
    rank = {node.node_id: i for i, node in enumerate(ranking)}
    total = len(ranking)
    out = []
    for node in ctx.store.nodes(slice_urn=slice_urn):
        if node.node_id in pending or node.node_id not in rank:
            value = 0.0
        else:
            value = (rank[node.node_id] + 1) / (total + 1)
        out.append({"node_id": node.node_id, "client_id": node.client_id,
                    "component_urn": ctx.identity.node_urn(node.node_id),
                    "value": round(value, 6)})
    return out


class ValuePusher:
    """Pushes a slice's node values to its endpoint when asked (``mark``), off the caller's
    thread; ``values_of(slice_urn)`` gives the nodelist at the time of sending."""

    def __init__(self, ctx: Context, callbacks: CallbackClient,
                 values_of: Callable[[str], list[dict[str, Any]]]) -> None:
        self.ctx = ctx
        self.callbacks = callbacks
        self.values_of = values_of
        self.pushes = 0
        self.failures = 0
        self._due: dict[str, tuple[float, int]] = {}  # slice -> (when, attempts so far)
        self._sending = 0  # pushes taken off _due and not yet answered
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="emulator-values", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.ctx.settings.values_timeout + 5)

    def mark(self, slice_urn: str) -> None:
        """Push this slice's values soon (a newer mark replaces a pending retry)."""
        with self._cond:
            self._due[slice_urn] = (time.monotonic(), 0)
            self._cond.notify_all()

    def mark_all(self) -> None:
        for endpoint in self.ctx.store.all_endpoints():
            self.mark(endpoint.slice_urn)

    def idle(self) -> bool:
        """Nothing due and nothing in flight: every push marked so far has been answered (or
        waits on a retry later than now)."""
        with self._cond:
            now = time.monotonic()
            return self._sending == 0 and all(when > now for when, _ in self._due.values())

    def push_now(self, slice_urn: str) -> bool:
        """Push at once on the caller's thread (bounded by ``values_timeout``)."""
        with self._cond:
            self._due.pop(slice_urn, None)
        return self._push(slice_urn, 0)

    def _push(self, slice_urn: str, attempts: int) -> bool:
        endpoint = self.ctx.store.get_endpoint(slice_urn)
        if endpoint is None:
            return True  # nobody to tell
        nodelist = self.values_of(slice_urn)
        if not nodelist:
            return True  # the slice holds no nodes now
        if self.callbacks.set_resource_values(endpoint, nodelist):
            self.pushes += 1
            return True
        self.failures += 1
        attempts += 1
        delay = min(MAX_BACKOFF, self.ctx.settings.notify_interval * 2 ** min(attempts, 5))
        with self._cond:
            if slice_urn not in self._due:  # a newer mark wins
                self._due[slice_urn] = (time.monotonic() + delay, attempts)
                self._cond.notify_all()
        return False

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop:
                    now = time.monotonic()
                    ready = [(s, a) for s, (when, a) in self._due.items() if when <= now]
                    if ready:
                        break
                    wait = min((when for when, _ in self._due.values()), default=now + 1.0)
                    self._cond.wait(max(0.01, wait - now))
                if self._stop:
                    return
                for slice_urn, _ in ready:
                    del self._due[slice_urn]
                self._sending = len(ready)
            for slice_urn, attempts in ready:
                try:
                    self._push(slice_urn, attempts)
                except Exception:  # the pusher must survive one bad push
                    log.exception("pushing values of %s failed", slice_urn)
            with self._cond:
                self._sending = 0
