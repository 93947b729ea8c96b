"""Waiting for a sliver's nodes: poll SliverStatus until they are ready, one has failed, or
the time is up.

:func:`progress_of` is the pure judgement of one SliverStatus answer; :func:`wait_for_nodes`
adds the polling loop (intervals growing from ``interval`` to ``max_interval``, never
sleeping past the deadline) and reports each change of the counts through ``report``.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from elasticslice.errors import ElasticSliceError
from elasticslice.rpc.cm import NodeStatus, SliverStatus

#: How long ``--wait`` waits by default: CloudLab boots a node in 5-15 minutes.
DEFAULT_TIMEOUT = 1800.0


class SliverWaitError(ElasticSliceError):
    """Waiting for a sliver's nodes ended without them all ready."""


class SliverFailedError(SliverWaitError):
    """A node being waited for failed (``failed`` is the first of them)."""

    def __init__(self, message: str, failed: NodeStatus) -> None:
        self.failed = failed
        super().__init__(message)


class SliverWaitTimeout(SliverWaitError):
    """The nodes were not all ready within the timeout."""


@dataclass
class Progress:
    """How far the wanted nodes are: ``counts`` per status, ``missing`` the client_ids
    SliverStatus does not list (yet)."""

    wanted: int
    ready: int
    counts: dict[str, int] = field(default_factory=dict)
    failed: list[NodeStatus] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.wanted > 0 and self.ready == self.wanted

    def summary(self) -> str:
        """``2/3 ready, 1 changing``: the counts, ready first."""
        parts = [f"{self.ready}/{self.wanted} ready"]
        parts += [f"{n} {status or 'no status'}" for status, n in sorted(self.counts.items())
                  if status != "ready"]
        if self.missing:
            parts.append(f"{len(self.missing)} not listed yet")
        return ", ".join(parts)


def progress_of(status: SliverStatus, client_ids: Collection[str] | None = None) -> Progress:
    """Judge one SliverStatus answer for the nodes ``client_ids`` (None: every node)."""
    nodes = status.nodes if client_ids is None else \
        [n for n in status.nodes if n.client_id in client_ids]
    listed = {n.client_id for n in nodes}
    missing = sorted(set(client_ids or ()) - listed)
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.status] = counts.get(node.status, 0) + 1
    return Progress(wanted=len(nodes) + len(missing), ready=counts.get("ready", 0),
                    counts=counts, failed=[n for n in nodes if n.failed], missing=missing)


def wait_for_nodes(poll: Callable[[], SliverStatus], *, timeout: float = DEFAULT_TIMEOUT,
                   client_ids: Collection[str] | None = None, interval: float = 0.5,
                   max_interval: float = 5.0, report: Callable[[str], None] | None = None,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> SliverStatus:
    """Poll until the nodes ``client_ids`` (None: all of the sliver's) are ready; return that
    SliverStatus. Raise :class:`SliverFailedError` as soon as one of them has failed, or
    :class:`SliverWaitTimeout` after ``timeout`` seconds. ``report`` gets a line whenever
    the counts change (``waiting: 1/2 ready, 1 changing (4s)``)."""
    start = clock()
    deadline = start + timeout
    last = ""
    while True:
        status = poll()
        progress = progress_of(status, client_ids)
        if progress.failed:
            node = progress.failed[0]
            raise SliverFailedError(
                f"node {node.client_id} failed" + (f": {node.error}" if node.error else "")
                + f" ({progress.summary()})", node)
        now = clock()
        line = progress.summary()
        if report is not None and line != last:
            report(f"waiting: {line} ({now - start:.0f}s)")
            last = line
        if progress.done:
            return status
        if now >= deadline:
            raise SliverWaitTimeout(f"timed out after {timeout:g}s waiting for the nodes: "
                                    f"{line}")
        sleep(max(0.0, min(interval, deadline - now)))
        interval = min(interval * 1.5, max_interval)
