"""Two tables of the manager's state store with their own small interfaces, as
:class:`~.revocations.RevocationLog` has its own: the nodes to give back (``to_release``,
:class:`ReleaseQueue`) and each cycle method's runs (``cycle``, :class:`CycleLog`). Each
works on the :class:`~.state.ManagerState` it is given (its connection, lock and
transactions).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elasticslice.managers.records import CycleRecord, Release, ReleaseSource


class ReleaseQueue:
    """``state.to_release``: every node to give back, one row each with where it came from
    (``source``: the policy or a notice) and why; only the actuator applies them."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def ask(self, cm: str, client_id: str, *, node_id: str | None, source: str, reason: str,
            now: float) -> bool:
        """Record that ``client_id`` at ``cm`` is to be given back; False when it is already
        (the first ask stands)."""
        source = ReleaseSource(source).value
        cur = self.state._run("INSERT OR IGNORE INTO to_release (cm, client_id, node_id, "
                              "source, reason, asked) VALUES (?, ?, ?, ?, ?, ?)",
                              (cm, client_id, node_id, source, reason, now))
        return cur.rowcount > 0

    def rows(self, cm: str | None = None) -> list[Release]:
        """The nodes to give back, oldest ask first."""
        sql = "SELECT cm, client_id, node_id, source, reason, asked, id FROM to_release"
        rows = self.state._rows(sql + " WHERE cm = ? ORDER BY id", (cm,)) if cm is not None \
            else self.state._rows(sql + " ORDER BY id")
        return [Release(*r) for r in rows]

    def drop(self, cm: str, client_ids: Sequence[str]) -> None:
        """Given back, refused, or no longer held: not asked any more."""
        with self.state.transaction():
            for cid in client_ids:
                self.state._run("DELETE FROM to_release WHERE cm = ? AND client_id = ?",
                                (cm, cid))


class CycleLog:
    """``state.cycle_log``: each cycle method's last run, success, error and next run (the
    cycle's recorder; ``elasticslice status`` and the metrics read it)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def record_run(self, method: str, *, started: float, finished: float, error: str | None,
                   next_run: float | None) -> None:
        """One statement (an upsert: atomic on its own), as every method runs each cycle."""
        if error is None:
            self.state._run(
                "INSERT INTO cycle (method, last_run, last_ok, next_run, failures, runs, "
                "last_duration) VALUES (?1, ?2, ?3, ?4, 0, 1, ?5) ON CONFLICT (method) DO "
                "UPDATE SET last_run = ?2, last_ok = ?3, next_run = ?4, failures = 0, "
                "runs = runs + 1, last_duration = ?5",
                (method, started, finished, next_run, finished - started))
        else:
            self.state._run(
                "INSERT INTO cycle (method, last_run, next_run, last_error, last_error_at, "
                "failures, runs, last_duration) VALUES (?1, ?2, ?3, ?4, ?5, 1, 1, ?6) "
                "ON CONFLICT (method) DO UPDATE SET last_run = ?2, next_run = ?3, "
                "last_error = ?4, last_error_at = ?5, failures = failures + 1, "
                "runs = runs + 1, last_duration = ?6",
                (method, started, next_run, error.splitlines()[0] if error else error,
                 finished, finished - started))

    def set_next_run(self, method: str, next_run: float | None) -> None:
        with self.state.transaction():
            self.state._run("INSERT OR IGNORE INTO cycle (method) VALUES (?)", (method,))
            self.state._run("UPDATE cycle SET next_run = ? WHERE method = ?", (next_run, method))

    def records(self) -> dict[str, CycleRecord]:
        rows = self.state._rows("SELECT method, last_run, last_ok, next_run, last_error, "
                                "failures, last_error_at, runs, last_duration FROM cycle "
                                "ORDER BY method")
        return {r[0]: CycleRecord(*r) for r in rows}
