"""The notice book: CloudLab's delete notices, checked against what we hold, recorded once.

A NotifyDeletePending item counts only for a node we hold whose ``node_id`` and
``client_id`` both match our manifest: that is a revocation, recorded once in the state
store (``revocations``) with ONE deadline, the first notice's arrival plus its
``max_wait_time``; each countdown notice can only bring it earlier. Every other item
(a node we do not hold, or a ``client_id`` that does not match the node) is foreign: it is
counted apart (:meth:`NoticeBook.counts`), drains nothing and is answered
``max_wait_time`` 0. NotifyDeleteComplete for a node we do not hold changes nothing.

The book holds its own short lock around memory and the local SQLite file only: it never
waits for the cycle, an RPC or a pilot framework, so CloudLab's calls are answered at once.
What must follow (waking the cycle, mail) is handed on, never done on the caller's thread.
Without ``holdings`` (an endpoint used on its own, with no manifest to check against)
every notice counts.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from elasticslice.managers.records import NodeRecord, PendingDelete
from elasticslice.managers.state import ManagerState
from elasticslice.rpc.endpoint import BadArgs

log = logging.getLogger(__name__)

MAX_NODES = 10_000          # nodes in one nodelist, and revocations open at once
STALE_AFTER = 600.0         # a released revocation CloudLab never completed ends then
MAX_FOREIGN = 10_000        # foreign node_ids remembered (for counting each once)


@dataclasses.dataclass(frozen=True)
class DeleteNotice:
    """One node of a NotifyDeletePending / NotifyDeleteComplete; ``received`` is when the
    call arrived (the injected clock), once."""

    node_id: str
    client_id: str | None
    max_wait_time: int
    received: float

    @property
    def deadline(self) -> float:
        return self.received + self.max_wait_time


@dataclasses.dataclass(frozen=True)
class Entry:
    """What one item of a notice is: ``revocation`` (None: a node we do not hold), whether
    this notice opened it (``fresh``) or brought its deadline earlier (``hurried``)."""

    notice: DeleteNotice
    revocation: PendingDelete | None = None
    fresh: bool = False
    hurried: bool = False

    @property
    def ours(self) -> bool:
        return self.revocation is not None


class HeldNodes(Protocol):
    """What the book checks notices against (the manager's :class:`~.holdings.Holdings`)."""

    def find(self, node_id: str, client_id: str | None) -> NodeRecord | None: ...

    def cm_of(self, node_id: str) -> str | None: ...

    def forget(self, rec: NodeRecord, now: float, reason: str) -> None: ...


def _nothing(*_: Any) -> None:
    return None


class NoticeBook:
    """Validates notices against ``holdings``, records each revocation once in ``state``,
    wakes the cycle (``wake(*methods)``) and mails (``notify(subject, body)``, which must
    not block: the manager's posts it to a thread of its own)."""

    def __init__(self, state: ManagerState, *, holdings: HeldNodes | None = None,
                 clock: Callable[[], float] = time.time,
                 wake: Callable[..., None] = _nothing,
                 notify: Callable[[str, str], None] = _nothing,
                 calling_cm: Callable[[], str | None] = _nothing) -> None:
        self.state = state
        self.calling_cm = calling_cm  # the URL of the CM calling now (None: any may)
        self.holdings = holdings
        self.clock = clock
        self.wake = wake
        self.notify = notify
        self._lock = threading.Lock()
        self._foreign: dict[tuple[str, str | None], float] = {}
        self.foreign = int(state.get_meta("notices.foreign") or 0)

    # -- CloudLab's calls ------------------------------------------------------------------
    def _held(self, notice: DeleteNotice) -> tuple[str, str | None] | None:
        """(cm, client_id) of the node a notice names, None when it is not ours."""
        if self.holdings is None:
            return "", notice.client_id
        rec = self.holdings.find(notice.node_id, notice.client_id)
        caller = self.calling_cm()
        if rec is not None and caller is not None and rec.cm != caller:
            log.warning("%s (%s) is held at %s, not at %s which sent the notice: not ours "
                        "there", notice.node_id, notice.client_id, rec.cm, caller)
            return None
        return (rec.cm, rec.client_id) if rec is not None else None

    def pending(self, nodes: list[dict[str, Any]], received: float) -> list[Entry]:
        """A NotifyDeletePending (checked items, see ``parse_nodelist``) as it arrived."""
        notices = notices_of(nodes, received)
        entries: list[Entry] = []
        with self._lock:
            self.state.revocations.expire(received - STALE_AFTER)
            held = [(n, self._held(n)) for n in notices]
            new = sum(1 for n, h in held if h is not None and
                      self.state.revocations.get(n.node_id, h[0]) is None)
            if new and len(self.state.revocations.all(open_only=True)) + new > MAX_NODES:
                raise BadArgs(f"nodelist: more than {MAX_NODES} nodes would be pending "
                              "delete at once")
            with self.state.transaction():
                for notice, where in held:
                    if where is None:
                        self._late(notice)
                        entries.append(Entry(notice))
                        continue
                    entries.append(self._record(notice, *where))
            self._count_foreign([e.notice for e in entries if not e.ours], received)
        fresh = [e for e in entries if e.fresh]
        for e in fresh:
            log.warning("CloudLab is taking back %s (%s) within %d s", e.notice.node_id,
                        e.notice.client_id, e.notice.max_wait_time)
            self.notify(f"node {e.notice.client_id or e.notice.node_id} revoked",
                        f"CloudLab takes back {e.notice.node_id} ({e.notice.client_id}) "
                        f"within {e.notice.max_wait_time} s")
        if any(e.ours for e in entries):
            self.wake("update_sliver_status", "update_available")
        return entries

    def _record(self, notice: DeleteNotice, cm: str, client_id: str | None) -> Entry:
        before = self.state.revocations.get(notice.node_id, cm)
        after = self.state.revocations.add(cm, notice.node_id, client_id,
                                           deadline=notice.deadline, now=notice.received)
        if notice.max_wait_time == 0 and after.released is None:
            self.state.revocations.force(notice.node_id, cm)  # CloudLab cannot wait
        return Entry(notice, after, fresh=before is None,
                     hurried=before is not None and after.deadline < before.deadline)

    def complete(self, nodes: list[dict[str, Any]], received: float) -> list[Entry]:
        """A NotifyDeleteComplete: the nodes we hold are gone; others change nothing."""
        entries: list[Entry] = []
        with self._lock:
            for notice in notices_of(nodes, received):
                where = self._held(notice)
                if where is None:
                    self._late(notice)
                    entries.append(Entry(notice))
                    continue
                revocation = self.state.revocations.get(notice.node_id, where[0])
                self.state.revocations.finish(notice.node_id, now=received, cm=where[0])
                entries.append(Entry(notice, revocation or PendingDelete(
                    where[0], notice.node_id, where[1], received, received)))
            self._count_foreign([e.notice for e in entries if not e.ours], received)
        if self.holdings is not None:
            for e in entries:
                rec = self.holdings.find(e.notice.node_id, e.notice.client_id) \
                    if e.ours else None
                if rec is not None:
                    self.holdings.forget(rec, received, "taken back by CloudLab")
        if any(e.ours for e in entries):
            self.wake("update_sliver_status", "update_available")
        return entries

    def _was_ours(self, notice: DeleteNotice) -> bool:
        """A node we held, gone from our records already (its complete comes late)."""
        rec = self.state.find_node(notice.node_id)
        return rec is not None and rec.client_id == notice.client_id

    def _gone(self, notice: DeleteNotice) -> NodeRecord | None:
        rec = self.state.find_node(notice.node_id)
        if rec is None or rec.gone_at is None or rec.client_id != notice.client_id:
            return None
        return rec

    def _late(self, notice: DeleteNotice) -> None:
        """A notice about a node of ours that left before CloudLab's word reached us (taken
        at once, max_wait_time 0, or seen gone from the sliver first): still a revocation,
        forced, counted once per holding."""
        if self.holdings is None or (rec := self._gone(notice)) is None:
            return
        if self.state.revocations.late(rec.cm, notice.node_id, rec.client_id,
                                       held_since=rec.added_at, now=notice.received):
            log.warning("CloudLab took back %s (%s) before its notice reached us",
                        notice.node_id, rec.client_id)

    def _count_foreign(self, notices: list[DeleteNotice], now: float) -> None:
        """Count apart the items naming nodes we do not hold (but those of a node we held,
        gone already: CloudLab's late word about it, answered 0 all the same)."""
        fresh = 0
        for n in notices:
            if self.holdings is not None and self._was_ours(n):
                continue
            key = (n.node_id, n.client_id)
            if key not in self._foreign:
                fresh += 1
                log.warning("notice for %s (%s): not a node we hold; answered 0, ignored",
                            n.node_id, n.client_id)
            self._foreign[key] = now
        while len(self._foreign) > MAX_FOREIGN:
            del self._foreign[next(iter(self._foreign))]
        if fresh:
            self.foreign += fresh
            self.state.set_meta("notices.foreign", str(self.foreign))

    def values(self, values: list[Any]) -> None:
        """SetResourceValues: the values (items with node_id, value, client_id?) of nodes we
        hold, recorded per CM; the cycle's ``set_system_state`` hands them on."""
        by_cm: dict[str, dict[str, float]] = {}
        names = {v.node_id: (v.client_id, v.component_urn) for v in values}
        for v in values:
            if self.holdings is None:
                cm: str | None = ""
            elif v.client_id:
                rec = self.holdings.find(v.node_id, v.client_id)
                cm = rec.cm if rec is not None else None
            else:
                cm = self.holdings.cm_of(v.node_id)
            if cm is not None:
                by_cm.setdefault(cm, {})[v.node_id] = float(v.value)
        now = self.clock()
        for cm, vals in by_cm.items():
            self.state.set_values(cm, vals, now=now, names=names)
        if by_cm:
            self.wake("set_system_state")

    def recorded_values(self) -> list[tuple[str, float, str | None, str | None]]:
        """The values recorded, oldest first: (node_id, value, client_id, component_urn)."""
        return [tuple(r) for r in self.state._rows(
            "SELECT node_id, value, client_id, component_urn FROM node_values "
            "ORDER BY updated, rowid")]

    # -- what follows a notice ---------------------------------------------------------------
    def release(self, node_ids: list[str], note: str) -> list[str]:
        """We are done with these nodes: their answers say max_wait_time 0 from now. The
        node_ids newly released."""
        now = self.clock()
        with self._lock:
            return [i for i in node_ids
                    if self.state.revocations.release(i, now=now, note=note)]

    def released(self, node_id: str) -> bool:
        """Whether the open revocation of ``node_id`` was released."""
        with self._lock:
            found = self.state.revocations.get(node_id)
        return found is not None and found.released is not None

    def revocation(self, node_id: str) -> PendingDelete | None:
        """The open revocation of ``node_id``."""
        with self._lock:
            return self.state.revocations.get(node_id)

    def open(self) -> list[PendingDelete]:
        """The revocations CloudLab has not completed (after ending stale released ones)."""
        with self._lock:
            self.state.revocations.expire(self.clock() - STALE_AFTER)
            return self.state.revocations.all(open_only=True)

    def counts(self) -> dict[str, int]:
        """revocations, early and forced releases (as the CM reports them), and foreign
        notices (distinct nodes we do not hold; counted apart)."""
        with self._lock:
            return {**self.state.revocations.counts(), "foreign": self.foreign}


def notices_of(nodes: list[dict[str, Any]], received: float) -> list[DeleteNotice]:
    return [DeleteNotice(n["node_id"], n.get("client_id"), int(n.get("max_wait_time", 0)),
                         received) for n in nodes]
