"""Nodes that failed to start, named with their cause as soon as they fail.

Two witnesses, neither enough alone: the CM says *that* a node failed (SliverStatus: its
boot failed, or its startup command exited non-zero: ``execute_status``), and the node says
*why* (its start script posts the one line that ended it to the control node,
:meth:`~elasticslice.pilots.publish.TarballPublisher.accept_reports`). The CM's word decides
(the policy gives the node back and replaces it); the node's line explains, and a line from
a node the CM does not call failed is kept but never acted on. :meth:`NodeFailures.fresh`
gives each failure once, for the run's progress lines; :meth:`NodeFailures.all` the whole
list, for its report.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

MAX_LINE = 300      # characters of a node's line kept
MAX_PENDING = 256   # lines of nodes the CM has not called failed, kept at most
CAUSE_WAIT = 5.0    # seconds a failure waits for its node's line before it is shown without


@dataclasses.dataclass
class NodeFailure:
    """One node that failed: ``what`` the CM says (``startup exited 1``, ``boot failed``),
    ``cause`` the node's own line (None: it sent none)."""

    client_id: str
    node_id: str
    what: str
    cause: str | None = None
    seen_at: float = 0.0
    shown: bool = False

    def line(self) -> str:
        where = f"{self.client_id} ({self.node_id})" if self.node_id else self.client_id
        return f"node {where} failed: {self.what}" + (f": {self.cause}" if self.cause else "")

    def to_json(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "node_id": self.node_id, "what": self.what,
                "cause": self.cause}


def one_line(text: Any) -> str | None:
    """A node's line, cleaned: printable, one line, at most :data:`MAX_LINE` characters."""
    if not isinstance(text, str):
        return None
    clean = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return clean[:MAX_LINE] or None


class NodeFailures:
    """The failures of a cluster's nodes (thread-safe; ``clock`` injected)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._lines: dict[str, str] = {}      # client_id -> the node's last line
        self._failures: list[NodeFailure] = []

    def report(self, client_id: Any, line: Any) -> bool:
        """A node's line (from its POST): kept for its failure; False when unusable."""
        cause = one_line(line)
        if not isinstance(client_id, str) or not 0 < len(client_id) <= 64 or cause is None:
            return False
        with self._lock:
            if client_id not in self._lines and len(self._lines) >= MAX_PENDING:
                return False
            self._lines[client_id] = cause
            for failure in self._failures:
                if failure.client_id == client_id and failure.cause is None:
                    failure.cause = cause
        return True

    def failed(self, client_id: str, node_id: str, what: str) -> NodeFailure:
        """The CM says ``client_id`` failed (``what``)."""
        with self._lock:
            failure = NodeFailure(client_id, node_id, what, self._lines.get(client_id),
                                  self.clock())
            self._failures.append(failure)
        log.warning("%s", failure.line())
        return failure

    def forget(self, client_id: str) -> None:
        """The node left: a line it sent later is not its failure's any more."""
        with self._lock:
            self._lines.pop(client_id, None)

    def fresh(self) -> list[NodeFailure]:
        """Failures not shown yet, once each: when their cause is known, or after
        :data:`CAUSE_WAIT` seconds without one."""
        now = self.clock()
        out = []
        with self._lock:
            for failure in self._failures:
                if not failure.shown and (failure.cause or now - failure.seen_at >= CAUSE_WAIT):
                    failure.shown = True
                    out.append(dataclasses.replace(failure))
        return out

    def all(self) -> list[NodeFailure]:
        with self._lock:
            return [dataclasses.replace(f) for f in self._failures]

    def merge(self, entries: list[dict[str, Any]]) -> None:
        """The failures another process saw (the manager daemon's, over the channel:
        ``to_json`` and ``seen_at`` each), added or given their cause; those shown stay
        shown."""
        with self._lock:
            known = {(f.client_id, f.seen_at): f for f in self._failures}
            for entry in entries:
                key = (entry["client_id"], float(entry["seen_at"]))
                failure = known.get(key)
                if failure is None:
                    failure = NodeFailure(entry["client_id"], entry["node_id"],
                                          entry["what"], entry.get("cause"), key[1])
                    self._failures.append(failure)
                    known[key] = failure
                elif failure.cause is None:
                    failure.cause = entry.get("cause")


def what_failed(entry: Any) -> str:
    """What the CM's SliverStatus entry of a failed node says, in a few words."""
    if entry is None:
        return "failed (the CM says)"
    state = str(getattr(entry, "execute_state", "") or "")
    code = getattr(entry, "execute_status", None)
    if state == "exited" and code not in (None, "", "0"):
        return f"its startup command exited {code}"
    error = one_line(getattr(entry, "error", None))
    return f"boot failed{': ' + error if error else ''}"
