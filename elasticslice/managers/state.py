"""The manager's memory: what must survive a restart, in SQLite (WAL) under ``state_dir``.

One file, ``<state_dir>/manager.db`` (directory 0700, file 0600): the slice and slivers (and
whether this state directory created or adopted the slice), every node with its history,
CloudLab's revocations (one row each: its deadline, when we released the node, how it
ended), resource values, the nodes to give back (``to_release``: one row each until the
actuator's DeleteNodes took it), the intent log (a row written BEFORE each
AddNodes/DeleteNodes and closed after, so a manager killed in between knows what to
reconcile), and the cycle's runs for ``status``. Secrets are never stored. One connection
guarded by one lock: every method is atomic and thread-safe; :meth:`ManagerState.transaction`
groups several. :meth:`ManagerState.read_only` opens the same file for ``status`` while the
daemon writes it.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from elasticslice.managers.records import (
    CycleRecord, Intent, IntentKind, IntentOutcome, NodeRecord, PendingDelete, Release,
    ReleaseSource, SliceRecord, SliverRecord, StateError,
)
from elasticslice.managers.revocations import RevocationLog
from elasticslice.managers.staterows import CycleLog, ReleaseQueue
from elasticslice.managers.schema import SCHEMA_VERSION, create, migrate

DB_NAME = "manager.db"

NODE_FIELDS = ("node_id", "hostname", "state", "initial", "added_at", "ipv4")
__all__ = ["DB_NAME", "SCHEMA_VERSION", "CycleRecord", "Intent", "IntentKind", "IntentOutcome",
           "ManagerState", "NodeRecord", "PendingDelete", "Release", "ReleaseSource",
           "SliceRecord", "SliverRecord", "StateError"]


def _text(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


class ManagerState:
    """Typed access to ``<state_dir>/manager.db``. Use :meth:`open` or :meth:`read_only`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.RLock()
        self.revocations = RevocationLog(self)
        self.to_release = ReleaseQueue(self)
        self.cycle_log = CycleLog(self)

    # --- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, state_dir: Path) -> ManagerState:
        """Open (creating the directory 0700, the file 0600 and the schema) for writing."""
        state_dir = Path(state_dir).expanduser()
        path = state_dir / DB_NAME
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
            conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None,
                                   timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = migrate(conn, create(conn))
        except (OSError, sqlite3.Error) as err:
            raise StateError(f"{path}: cannot open the manager state: {err}") from err
        state = cls(path, conn)
        state._check_version(version)
        if state.get_meta("state_id") is None:
            state.set_meta("state_id", uuid.uuid4().hex)
        return state

    @classmethod
    def in_memory(cls) -> ManagerState:
        """A state of this process only (an endpoint without a manager keeps its notices
        here)."""
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        create(conn)
        return cls(Path(":memory:"), conn)

    @classmethod
    def read_only(cls, state_dir: Path) -> ManagerState:
        """Open for reading only (``status``), whether or not the daemon is writing it."""
        path = Path(state_dir).expanduser() / DB_NAME
        if not path.is_file():
            raise StateError(f"{path}: no manager state (has `elasticslice manage` run?)")
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                   check_same_thread=False, isolation_level=None, timeout=30.0)
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.Error as err:
            raise StateError(f"{path}: cannot read the manager state: {err}") from err
        state = cls(path, conn, readonly=True)
        state._check_version(row[0] if row else None)
        return state

    def _check_version(self, version: str | None) -> None:
        if version != str(SCHEMA_VERSION):
            self.close()
            raise StateError(f"{self.path}: state schema version {version!r}, this manager "
                             f"reads version {SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> ManagerState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing --------------------------------------------------------------------------
    def _run(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            if self._conn is None:
                raise StateError(f"{self.path}: the manager state is closed")
            try:
                return self._conn.execute(sql, tuple(_text(a) for a in args))
            except sqlite3.Error as err:
                raise StateError(f"{self.path}: {err}") from err

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._run(sql, args).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes atomically (re-entrant: nested uses join the outer one)."""
        with self._lock:
            if self._conn is not None and self._conn.in_transaction:
                yield
                return
            self._run("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._run("ROLLBACK")
                raise
            self._run("COMMIT")

    # --- meta ------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM meta WHERE key=?", (key,))
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._run("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # --- slice and slivers -----------------------------------------------------------------
    def set_slice(self, urn: str, expires: float | None, *, now: float | None = None) -> None:
        # (every cycle writes it: unchanged, the upsert changes no row and writes nothing)
        self._run("INSERT INTO slice (one, urn, expires, updated) VALUES (1, ?1, ?2, ?3) "
                  "ON CONFLICT (one) DO UPDATE SET urn = ?1, expires = ?2, updated = ?3 "
                  "WHERE urn IS NOT ?1 OR expires IS NOT ?2 OR updated IS NOT ?3",
                  (urn, expires, now))

    def slice(self) -> SliceRecord | None:
        rows = self._rows("SELECT urn, expires, updated FROM slice")
        return SliceRecord(*rows[0]) if rows else None


    def set_sliver(self, cm: str, urn: str | None, expires: float | None, status: str | None,
                   *, now: float | None = None) -> None:
        self._run("INSERT INTO slivers (cm, urn, expires, status, updated) "
                  "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (cm) DO UPDATE SET urn = ?2, "
                  "expires = ?3, status = ?4, updated = ?5 WHERE urn IS NOT ?2 OR "
                  "expires IS NOT ?3 OR status IS NOT ?4 OR updated IS NOT ?5",
                  (cm, urn, expires, status, now))

    def slivers(self) -> list[SliverRecord]:
        return [SliverRecord(*r) for r in self._rows(
            "SELECT cm, urn, expires, status, updated FROM slivers ORDER BY cm")]

    # --- nodes -----------------------------------------------------------------------------
    _NODE_SELECT = (
        "SELECT n.cm, n.client_id, n.node_id, n.hostname, n.state, n.initial, n.added_at, "
        "n.gone_at, v.value, (SELECT MIN(p.deadline) FROM revocations p WHERE p.cm = n.cm "
        "AND p.finished IS NULL AND (p.node_id = n.node_id OR p.client_id = n.client_id)), "
        "n.gone_reason, n.ipv4 FROM nodes n LEFT JOIN node_values v ON v.cm = n.cm "
        "AND v.node_id = n.node_id")

    @staticmethod
    def _node(row: tuple[Any, ...]) -> NodeRecord:
        cm, cid, nid, host, state, initial, added, gone, value, deadline, reason, ipv4 = row
        return NodeRecord(cm, cid, nid, host, state, bool(initial), added, gone, value,
                          deadline, reason, ipv4)

    def upsert_node(self, cm: str, client_id: str, *, now: float, note: str = "",
                    **fields: Any) -> NodeRecord:
        """Insert or update a node; a changed ``state`` (or a node coming back after
        :meth:`mark_gone`) appends to its history. Fields: node_id, hostname, state, initial,
        added_at (default: now), ipv4 (its manifest's control address)."""
        unknown = set(fields) - set(NODE_FIELDS)
        if unknown:
            raise TypeError(f"upsert_node: unknown field(s) {sorted(unknown)}")
        if "state" in fields:
            fields["state"] = _text(fields["state"])
        with self.transaction():
            old = self.node(cm, client_id)
            if old is None:
                state = fields.get("state") or "notready"
                self._run("INSERT INTO nodes (cm, client_id, node_id, hostname, state, initial, "
                          "added_at, updated, ipv4) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          (cm, client_id, fields.get("node_id"), fields.get("hostname"), state,
                           int(bool(fields.get("initial", False))),
                           fields.get("added_at", now), now, fields.get("ipv4")))
                self._history(cm, client_id, now, state, note or "added")
            else:
                sets = {k: (int(bool(v)) if k == "initial" else v) for k, v in fields.items()}
                if old.gone_at is not None:
                    sets.update(gone_at=None, gone_reason=None)
                    if "added_at" not in fields:
                        sets["added_at"] = now
                sets["updated"] = now
                assign = ", ".join(f"{k} = ?" for k in sets)
                self._run(f"UPDATE nodes SET {assign} WHERE cm = ? AND client_id = ?",
                          (*sets.values(), cm, client_id))
                state = fields.get("state") or old.state
                if old.gone_at is not None:
                    self._history(cm, client_id, now, state, note or "back")
                elif state != old.state:
                    self._history(cm, client_id, now, state, note)
            record = self.node(cm, client_id)
        assert record is not None
        return record

    def _history(self, cm: str, client_id: str, ts: float, state: str, note: str) -> None:
        self._run("INSERT INTO history (cm, client_id, ts, state, note) VALUES (?, ?, ?, ?, ?)",
                  (cm, client_id, ts, state, note))

    def nodes(self, cm: str | None = None, include_gone: bool = False) -> list[NodeRecord]:
        where, args = [], []
        if cm is not None:
            where.append("n.cm = ?")
            args.append(cm)
        if not include_gone:
            where.append("n.gone_at IS NULL")
        sql = self._NODE_SELECT + (" WHERE " + " AND ".join(where) if where else "")
        return [self._node(r) for r in self._rows(sql + " ORDER BY n.cm, n.added_at, n.client_id",
                                                  args)]

    def node(self, cm: str, client_id: str) -> NodeRecord | None:
        rows = self._rows(self._NODE_SELECT + " WHERE n.cm = ? AND n.client_id = ?",
                          (cm, client_id))
        return self._node(rows[0]) if rows else None

    def find_node(self, node_id: str, cm: str | None = None) -> NodeRecord | None:
        """The node holding ``node_id`` (a live one before a gone one, newest first)."""
        sql = self._NODE_SELECT + " WHERE n.node_id = ?" + (" AND n.cm = ?" if cm else "")
        rows = self._rows(sql + " ORDER BY n.gone_at IS NOT NULL, n.added_at DESC",
                          (node_id, cm) if cm else (node_id,))
        return self._node(rows[0]) if rows else None

    def mark_gone(self, cm: str, client_id: str, *, now: float, reason: str) -> None:
        with self.transaction():
            old = self.node(cm, client_id)
            if old is None or old.gone_at is not None:
                return
            self._run("UPDATE nodes SET gone_at = ?, gone_reason = ?, updated = ? "
                      "WHERE cm = ? AND client_id = ?", (now, reason, now, cm, client_id))
            self._history(cm, client_id, now, "gone", reason)

    def history(self, cm: str, client_id: str) -> list[tuple[float, str, str]]:
        return [(ts, state, note or "") for ts, state, note in self._rows(
            "SELECT ts, state, note FROM history WHERE cm = ? AND client_id = ? ORDER BY id",
            (cm, client_id))]

    # --- CloudLab's revocations (see :mod:`.revocations`) and values ------------------------
    def pending_deletes(self, *, open_only: bool = False) -> list[PendingDelete]:
        """Every revocation (``open_only``: those whose node has not left yet)."""
        return self.revocations.all(open_only=open_only)

    def set_values(self, cm: str, values: Mapping[str, float], *, now: float,
                   names: Mapping[str, tuple[str | None, str | None]] | None = None) -> None:
        """CloudLab's values of nodes at ``cm`` (node_id -> 0..1), with what it said of each
        (``names``: node_id -> (client_id, component_urn))."""
        names = names or {}
        with self.transaction():
            for node_id, value in values.items():
                client_id, urn = names.get(node_id, (None, None))
                self._run("INSERT OR REPLACE INTO node_values (cm, node_id, value, updated, "
                          "client_id, component_urn) VALUES (?, ?, ?, ?, ?, ?)",
                          (cm, node_id, float(value), now, client_id, urn))

    def values(self, cm: str | None = None) -> dict[str, float]:
        sql = "SELECT node_id, value FROM node_values"
        rows = self._rows(sql + " WHERE cm = ?", (cm,)) if cm else self._rows(sql)
        return {node_id: value for node_id, value in rows}

    # --- the intent log ----------------------------------------------------------------------
    def begin_intent(self, kind: str, cm: str, client_ids: Sequence[str], *, now: float) -> int:
        kind = IntentKind(kind).value
        cur = self._run("INSERT INTO intents (kind, cm, client_ids, created) VALUES (?, ?, ?, ?)",
                        (kind, cm, json.dumps(list(client_ids)), now))
        return int(cur.lastrowid)

    def finish_intent(self, intent_id: int, *, now: float, outcome: str) -> None:
        outcome = IntentOutcome(outcome).value
        self._run("UPDATE intents SET finished = ?, outcome = ? WHERE id = ? AND finished IS NULL",
                  (now, outcome, intent_id))

    def intents(self, *, open_only: bool = False) -> list[Intent]:
        sql = "SELECT id, kind, cm, client_ids, created, finished, outcome FROM intents"
        rows = self._rows(sql + (" WHERE finished IS NULL" if open_only else "") + " ORDER BY id")
        return [Intent(i, k, cm, tuple(json.loads(ids)), c, f, o) for i, k, cm, ids, c, f, o in rows]

    def open_intents(self) -> list[Intent]:
        return self.intents(open_only=True)
