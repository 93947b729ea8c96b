"""The session store: every unit and workload Troy handles, in SQLite (WAL).

A unit is written when it is submitted (synchronously: once ``submit_unit`` returns, the
unit survives a crash) and on every state change (asynchronously, by a writer thread that
batches updates). A restarted session therefore sees every unit; units whose last recorded
state is not final were in flight and are re-dispatched by ``Session.recover`` (at least
once: a unit that finished just before the crash may run again).

Python callables cannot be persisted: such units are stored with ``persistable = 0`` and the
callable's name; recovery marks them FAILED instead of re-running them.
"""
from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from troy.descriptions import ComputeUnitDescription
from troy.errors import TroyError
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS units (
    id TEXT PRIMARY KEY, session TEXT, workload TEXT, task_ids TEXT NOT NULL,
    description TEXT NOT NULL, persistable INTEGER NOT NULL, state TEXT NOT NULL,
    framework TEXT, pilot TEXT, start REAL, "end" REAL, exit_code INTEGER, error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS units_state ON units(state);
CREATE TABLE IF NOT EXISTS workloads (
    id TEXT PRIMARY KEY, session TEXT, state TEXT NOT NULL, tasks INTEGER NOT NULL,
    spec TEXT, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StoreError(TroyError):
    """The session store cannot be opened or written."""


@dataclass
class UnitRecord:
    """One stored unit, as read back from the store."""

    id: str
    session: str | None
    workload: str | None
    task_ids: list[str]
    description: dict[str, Any]
    persistable: bool
    state: State
    framework: str | None
    pilot: str | None
    start: float | None
    end: float | None
    exit_code: int | None
    error: str | None
    attempts: int

    def to_description(self) -> ComputeUnitDescription:
        return ComputeUnitDescription.coerce(self.description)


def describe_for_store(cud: ComputeUnitDescription) -> tuple[dict[str, Any], bool]:
    """A JSON-safe dict of ``cud`` and whether it can be re-run from that dict alone."""
    persistable = True

    def clean(d: ComputeUnitDescription) -> dict[str, Any]:
        nonlocal persistable
        out = d.to_dict(deep=False, defaults=False)   # members: clean()ed below
        if d.function is not None:
            persistable = False
            fn = d.function
            out["function"] = None
            name = getattr(fn, "__qualname__", repr(fn))
            out["callable"] = f"{getattr(fn, '__module__', '?')}.{name}"
            out["args"], out["kwargs"] = [], {}
        if "args" in out:   # (a tuple: JSON's list)
            out["args"] = list(out["args"] or [])
        if d.bundle:   # fields at their defaults are not written: coerce() gives them back
            out["bundle"] = [clean(m) for m in d.bundle]
        return out

    return clean(cud), persistable


def _dumps_description(cud: ComputeUnitDescription) -> tuple[str, bool]:
    data, persistable = describe_for_store(cud)
    try:
        return json.dumps(data), persistable
    except (TypeError, ValueError):  # e.g. a non-JSON value in a callable's kwargs
        return json.dumps({"unserialisable": repr(cud)[:500]}), False


class Store:
    """SQLite store of units and workloads; thread-safe; opened lazily."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._updates: queue.Queue[tuple[str, dict[str, Any]] | threading.Event | None] = \
            queue.Queue()
        self._writer: threading.Thread | None = None
        self._closed = False

    # -- connection ---------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            if self._closed:
                raise StoreError(f"store {self.path} is closed")
            try:
                conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30,
                                       isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
            except sqlite3.Error as err:
                raise StoreError(f"cannot open store {self.path}: {err}") from err
            self._conn = conn
            self._writer = threading.Thread(target=self._write_loop, name="troy-store",
                                            daemon=True)
            self._writer.start()
        return self._conn

    def close(self) -> None:
        """Write what is queued, stop the writer, close the database. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            writer = self._writer
        if writer is not None:  # not under the lock: the writer needs it to write
            self._updates.put(None)
            writer.join(timeout=10)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- units --------------------------------------------------------------------------
    def add_units(self, units: Iterable[ComputeUnit], session: str | None = None,
                  workload: str | None = None) -> None:
        """Record units synchronously (insert, or refresh a unit submitted again)."""
        now = time.time()
        rows = []
        for u in units:
            desc, persistable = _dumps_description(u.description)
            rows.append((u.id, session, workload, json.dumps(u.task_ids), desc,
                         int(persistable), u.state.value, u.framework, u.pilot,
                         u.attempts, now, now))
        if not rows:
            return
        with self._lock:
            db = self._db()
            try:
                db.execute("BEGIN")
                db.executemany(
                    "INSERT INTO units (id, session, workload, task_ids, description, "
                    "persistable, state, framework, pilot, attempts, created, updated) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
                    "session=excluded.session, state=excluded.state, "
                    "attempts=excluded.attempts, updated=excluded.updated", rows)
                db.execute("COMMIT")
            except sqlite3.Error as err:
                db.execute("ROLLBACK")
                raise StoreError(f"cannot record units in {self.path}: {err}") from err

    def record(self, unit: ComputeUnit, state: State | None = None) -> None:
        """Queue a snapshot of ``unit`` (a unit callback); written by the writer thread.

        The snapshot reads the unit's current state, not ``state``: callbacks of one unit may
        run in different threads, and the last snapshot queued must be the newest."""
        result = unit.result
        snap = {"state": unit.state.value, "framework": unit.framework,
                "pilot": unit.pilot, "start": unit.start, "end": unit.end,
                "exit_code": result.exit_code if result else None,
                "error": (result.error[:2000] if result and result.error else None),
                "attempts": unit.attempts, "updated": time.time()}
        self._updates.put((unit.id, snap))  # after close: never written, harmless

    def flush(self, timeout: float = 10.0) -> None:
        """Block until every queued update is written."""
        if self._writer is None or not self._writer.is_alive():
            return
        done = threading.Event()
        self._updates.put(done)
        done.wait(timeout)

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            item = self._updates.get()
            batch: dict[str, dict[str, Any]] = {}
            events: list[threading.Event] = []
            while True:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    events.append(item)
                else:
                    batch[item[0]] = item[1]  # the latest snapshot of a unit wins
                try:
                    item = self._updates.get_nowait()
                except queue.Empty:
                    break
            workloads = {k[1]: batch.pop(k) for k in [k for k in batch if isinstance(k, tuple)]}
            if batch:
                self._write(batch)
            if workloads:
                self._write_workloads(workloads)
            for ev in events:
                ev.set()

    def _write(self, batch: dict[str, dict[str, Any]]) -> None:
        rows = [(s["state"], s["framework"], s["pilot"], s["start"], s["end"], s["exit_code"],
                 s["error"], s["attempts"], s["updated"], uid) for uid, s in batch.items()]
        with self._lock:
            db = self._conn
            if db is None:
                return
            try:
                db.execute("BEGIN")
                db.executemany('UPDATE units SET state=?, framework=?, pilot=?, start=?, '
                               '"end"=?, exit_code=?, error=?, attempts=?, updated=? '
                               'WHERE id=?', rows)
                db.execute("COMMIT")
            except sqlite3.Error:
                log.exception("store %s: writing %d unit updates failed", self.path, len(rows))
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass

    def units(self, states: Iterable[State] | None = None,
              workload: str | None = None) -> list[UnitRecord]:
        """Every stored unit (optionally only those in ``states``, or of ``workload``),
        oldest first."""
        sql = ('SELECT id, session, workload, task_ids, description, persistable, state, '
               'framework, pilot, start, "end", exit_code, error, attempts FROM units')
        where: list[str] = []
        args: list[Any] = []
        if states is not None:
            wanted = [State(s).value for s in states]
            where.append(f"state IN ({','.join('?' * len(wanted))})")
            args.extend(wanted)
        if workload is not None:
            where.append("workload = ?")
            args.append(workload)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created, rowid"
        with self._lock:
            rows = self._db().execute(sql, args).fetchall()
        return [UnitRecord(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[4]), bool(r[5]),
                           State(r[6]), r[7], r[8], r[9], r[10], r[11], r[12], r[13])
                for r in rows]

    def unfinished_units(self) -> list[UnitRecord]:
        return [r for r in self.units() if r.state not in FINAL_STATES]

    # -- workloads ----------------------------------------------------------------------
    def put_workload(self, wid: str, state: State, tasks: int, session: str | None = None,
                     spec: dict[str, Any] | None = None) -> None:
        now = time.time()
        with self._lock:
            if self._closed:  # a late event while the session closes: nothing to keep
                return
            self._db().execute(
                "INSERT INTO workloads (id, session, state, tasks, spec, created, updated) "
                "VALUES (?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET state=excluded.state, "
                "tasks=excluded.tasks, updated=excluded.updated",
                (wid, session, state.value, tasks, json.dumps(spec) if spec else None,
                 now, now))

    def update_workload(self, wid: str, state: State, tasks: int) -> None:
        """Queue a workload's new state for the writer thread (the latest wins), as units'
        state changes are: a workload whose tasks alternate between running and queued
        changes state with about every unit, and a synchronous write each time held the
        thread that reports units' states (a quarter of its time, profiled)."""
        self._updates.put((("workload", wid), {"state": state.value, "tasks": tasks,
                                               "updated": time.time()}))

    def _write_workloads(self, batch: dict[str, dict[str, Any]]) -> None:
        rows = [(s["state"], s["tasks"], s["updated"], wid) for wid, s in batch.items()]
        with self._lock:
            db = self._conn
            if db is None:
                return
            try:
                db.executemany("UPDATE workloads SET state=?, tasks=?, updated=? WHERE id=?",
                               rows)
            except sqlite3.Error:
                log.exception("store %s: writing %d workload updates failed", self.path,
                              len(rows))

    def workload_spec(self, wid: str) -> dict[str, Any] | None:
        """The spec recorded when workload ``wid`` was dispatched (None if unknown)."""
        with self._lock:
            row = self._db().execute("SELECT spec FROM workloads WHERE id = ?",
                                     (wid,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    # -- meta: small JSON values by key (``troy run`` keeps the file it runs here) -------
    def set_meta(self, key: str, value: Any) -> None:
        with self._lock:
            self._db().execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
                               "DO UPDATE SET value=excluded.value", (key, json.dumps(value)))

    def get_meta(self, key: str) -> Any:
        """The value stored under ``key``, or None."""
        with self._lock:
            row = self._db().execute("SELECT value FROM meta WHERE key = ?",
                                     (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def workloads(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db().execute(
                "SELECT id, session, state, tasks, created, updated FROM workloads "
                "ORDER BY created").fetchall()
        return [{"id": r[0], "session": r[1], "state": State(r[2]), "tasks": r[3],
                 "created": r[4], "updated": r[5]} for r in rows]
