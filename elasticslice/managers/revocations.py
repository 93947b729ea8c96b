"""CloudLab's revocations of our nodes, one row each, in the manager's state store.

A revocation runs from the first NotifyDeletePending for a node we hold to the node leaving
the slice. Its ``deadline`` is the first notice's arrival plus its ``max_wait_time``; a
countdown notice may only bring it earlier. ``released`` says when we were done with the
node (answers say ``max_wait_time`` 0 from then on), ``finished`` when it left, ``outcome``
whether it went ``early`` (released by its deadline) or ``forced``. The same machine
revoked again later is another revocation, counted again.
"""
from __future__ import annotations

from typing import Any

from elasticslice.managers.records import PendingDelete

#: the one rule of an early release (an outcome, or released by the deadline while the
#: revocation is open) and of a forced one, in SQL
EARLY = "(outcome = 'early' OR (outcome IS NULL AND released <= deadline))"
FORCED = "(outcome = 'forced')"

_SELECT = ("SELECT cm, node_id, client_id, deadline, first_seen, finished, outcome, released, "
           "note, id, last_seen FROM revocations")


class RevocationLog:
    """The ``revocations`` table of ``state`` (a :class:`~.state.ManagerState`: its
    connection, lock and transactions)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    @staticmethod
    def _where(node_id: str, cm: str | None, open_only: bool = True
               ) -> tuple[str, tuple[Any, ...]]:
        where = " WHERE node_id = ?" + (" AND cm = ?" if cm is not None else "")
        where += " AND finished IS NULL" if open_only else ""
        return where, ((node_id, cm) if cm is not None else (node_id,))

    def add(self, cm: str, node_id: str, client_id: str | None, *, deadline: float,
            now: float) -> PendingDelete:
        """Record a NotifyDeletePending: a new revocation, or the countdown of the open one
        (its deadline only ever comes earlier). The revocation as recorded."""
        with self.state.transaction():
            where, args = self._where(node_id, cm)
            if self.state._rows("SELECT id FROM revocations" + where, args):
                self.state._run("UPDATE revocations SET deadline = MIN(deadline, ?), "
                                "last_seen = ?, client_id = COALESCE(client_id, ?)" + where,
                                (deadline, now, client_id, *args))
            else:
                self.state._run("INSERT INTO revocations (cm, node_id, client_id, deadline, "
                                "first_seen, last_seen) VALUES (?, ?, ?, ?, ?, ?)",
                                (cm, node_id, client_id, deadline, now, now))
            found = self.get(node_id, cm)
        assert found is not None
        return found

    def late(self, cm: str, node_id: str, client_id: str | None, *, held_since: float,
             now: float) -> bool:
        """CloudLab's word about a node of ours that left before any notice reached us (at
        max_wait_time 0 "the node may already be gone"): record that revocation, forced and
        finished, unless one of this holding (since ``held_since``) is recorded already."""
        with self.state.transaction():
            if self.state._rows("SELECT id FROM revocations WHERE node_id = ? AND cm = ? AND "
                                "first_seen >= ?", (node_id, cm, held_since)):
                return False
            self.state._run("INSERT INTO revocations (cm, node_id, client_id, deadline, "
                            "first_seen, last_seen, finished, outcome) VALUES "
                            "(?, ?, ?, ?, ?, ?, ?, 'forced')",
                            (cm, node_id, client_id, now, now, now, now))
        return True

    def get(self, node_id: str, cm: str | None = None) -> PendingDelete | None:
        """The open revocation of ``node_id`` (None: none open)."""
        where, args = self._where(node_id, cm)
        rows = self.state._rows(_SELECT + where + " ORDER BY id DESC LIMIT 1", args)
        return PendingDelete(*rows[0]) if rows else None

    def all(self, *, open_only: bool = False) -> list[PendingDelete]:
        sql = _SELECT + (" WHERE finished IS NULL" if open_only else "")
        return [PendingDelete(*r)
                for r in self.state._rows(sql + " ORDER BY deadline, cm, node_id")]

    def release(self, node_id: str, *, now: float, note: str | None = None,
                cm: str | None = None) -> bool:
        """We are done with the node; False when it was released already or no revocation
        of it is open."""
        where, args = self._where(node_id, cm)
        cur = self.state._run("UPDATE revocations SET released = ?, note = COALESCE(note, ?)"
                              + where + " AND released IS NULL", (now, note, *args))
        return cur.rowcount > 0

    def force(self, node_id: str, cm: str | None = None) -> bool:
        """CloudLab could not wait (max_wait_time 0) before we released the node: forced."""
        where, args = self._where(node_id, cm)
        cur = self.state._run("UPDATE revocations SET outcome = 'forced'" + where
                              + " AND released IS NULL AND outcome IS NULL", args)
        return cur.rowcount > 0

    def finish(self, node_id: str, *, now: float, outcome: str | None = None,
               cm: str | None = None) -> None:
        """The node left the slice: the revocation ends, ``early`` when we released it by
        its deadline, else ``forced`` (unless ``outcome`` says otherwise)."""
        where, args = self._where(node_id, cm)
        self.state._run("UPDATE revocations SET finished = ?, outcome = COALESCE(outcome, ?, "
                        "CASE WHEN released IS NOT NULL AND released <= deadline THEN 'early' "
                        "ELSE 'forced' END)" + where, (now, outcome, *args))

    def expire(self, before: float) -> None:
        """End the released revocations whose deadline passed before ``before`` (CloudLab
        never said it completed them)."""
        self.state._run("UPDATE revocations SET finished = deadline, outcome = COALESCE("
                        "outcome, 'early') WHERE finished IS NULL AND released IS NOT NULL "
                        "AND deadline < ?", (before,))

    def forget(self, node_id: str, cm: str | None = None) -> None:
        """Drop every revocation row of the node."""
        where, args = self._where(node_id, cm, open_only=False)
        self.state._run("DELETE FROM revocations" + where, args)

    def counts(self) -> dict[str, int]:
        """revocations, early (released by the deadline) and forced (taken by CloudLab)."""
        [(total, early, forced)] = self.state._rows(
            f"SELECT COUNT(*), COALESCE(SUM({EARLY}), 0), COALESCE(SUM({FORCED}), 0) "
            "FROM revocations")
        return {"revocations": total, "early": early, "forced": forced}

    def counts_by_cm(self) -> dict[str, dict[str, int]]:
        """:meth:`counts` per CM (its URL), by the same rule."""
        rows = self.state._rows(
            f"SELECT cm, COUNT(*), COALESCE(SUM({EARLY}), 0), COALESCE(SUM({FORCED}), 0) "
            "FROM revocations GROUP BY cm")
        return {r[0]: {"revocations": r[1], "early": r[2], "forced": r[3]} for r in rows}

    def nodes(self) -> dict[str, set[str]]:
        """The node_ids revoked (``seen``), released ``early``, ``forced``: by the same rule
        as :meth:`counts`, the one place it is written."""
        rows = self.state._rows(f"SELECT node_id, {EARLY}, {FORCED} FROM revocations")
        return {"seen": {r[0] for r in rows}, "early": {r[0] for r in rows if r[1]},
                "forced": {r[0] for r in rows if r[2]}}
