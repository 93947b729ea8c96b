"""The emulator's state in SQLite (WAL): slices, slivers, nodes, endpoints, reclamations.

One connection guarded by one re-entrant lock: the emulator is small and every mutation is
short, so a single writer keeps the state consistent without cross-thread surprises. A
restarted emulator opens the same file and carries on with the same slices and nodes.
"""
from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError


class Holder(str, Enum):
    """Who holds a physical node."""

    FREE = "free"
    SLICE = "slice"
    TENANT = "tenant"


class BootState(str, Enum):
    """Node status as SliverStatus reports it."""

    NOTREADY = "notready"
    CHANGING = "changing"
    READY = "ready"
    FAILED = "failed"


class ExecState(str, Enum):
    """State of a node's startup command (SliverStatus ``execute_state``)."""

    NONE = ""
    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"


@dataclass
class NodeRow:
    node_id: str
    hardware_type: str
    cores: int
    memory: int
    holder: Holder = Holder.FREE
    tenant: str = ""
    slice_urn: str = ""
    client_id: str = ""
    sliver_urn: str = ""
    sliver_type: str = "raw-pc"
    disk_image: str = ""
    boot_state: BootState = BootState.NOTREADY
    boot_started: float = 0.0
    allocated_at: float = 0.0
    startup: str = ""
    shell: str = "sh"
    tarballs: list[list[str]] = field(default_factory=list)
    interfaces: list[dict[str, Any]] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    execute_state: ExecState = ExecState.NONE
    execute_status: int | None = None
    value: float = 1.0


@dataclass
class SliceRow:
    urn: str
    hrn: str
    uuid: str
    creator_urn: str
    expires: float
    created: float
    gid: str = ""


@dataclass
class SliverRow:
    slice_urn: str
    sliver_urn: str
    uuid: str
    creator_urn: str
    expires: float
    created: float
    links: list[dict[str, Any]] = field(default_factory=list)
    keys: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class EndpointRow:
    slice_urn: str
    url: str
    policy: str
    defwaittime: int
    owner_urn: str


@dataclass
class ReclaimRow:
    id: int
    node_id: str
    slice_urn: str
    client_id: str
    reason: str
    tenant: str
    notified_at: float
    deadline: float
    last_notified: float = 0.0
    notifications: int = 0
    released_at: float = 0.0
    outcome: str = "pending"


_JSON_FIELDS = {"tarballs", "interfaces", "attrs", "links", "keys"}
_ENUMS = {"holder": Holder, "boot_state": BootState, "execute_state": ExecState}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS slices (urn TEXT PRIMARY KEY, hrn TEXT, uuid TEXT,
    creator_urn TEXT, expires REAL, created REAL, gid TEXT);
CREATE TABLE IF NOT EXISTS slivers (slice_urn TEXT PRIMARY KEY, sliver_urn TEXT UNIQUE,
    uuid TEXT, creator_urn TEXT, expires REAL, created REAL, links TEXT, keys TEXT);
CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, hardware_type TEXT, cores INTEGER,
    memory INTEGER, holder TEXT, tenant TEXT, slice_urn TEXT, client_id TEXT, sliver_urn TEXT,
    sliver_type TEXT, disk_image TEXT, boot_state TEXT, boot_started REAL, allocated_at REAL,
    startup TEXT, shell TEXT, tarballs TEXT, interfaces TEXT, attrs TEXT, execute_state TEXT,
    execute_status INTEGER, value REAL);
CREATE INDEX IF NOT EXISTS nodes_slice ON nodes (slice_urn);
CREATE TABLE IF NOT EXISTS endpoints (slice_urn TEXT PRIMARY KEY, url TEXT, policy TEXT,
    defwaittime INTEGER, owner_urn TEXT);
CREATE TABLE IF NOT EXISTS reclaims (id INTEGER PRIMARY KEY AUTOINCREMENT, node_id TEXT,
    slice_urn TEXT, client_id TEXT, reason TEXT, tenant TEXT, notified_at REAL, deadline REAL,
    last_notified REAL, notifications INTEGER, released_at REAL, outcome TEXT);
"""


class StoreError(ElasticSliceError):
    """The emulator's state file cannot be opened or written."""


def _encode(name: str, value: Any) -> Any:
    if name in _JSON_FIELDS:
        return json.dumps(value)
    if isinstance(value, Enum):
        return value.value
    return value


def _json_list(value: Any) -> Any:
    return json.loads(value) if value else []


def _json_attrs(value: Any) -> Any:
    return (json.loads(value) if value else None) or {}


def _decoder(cls: type) -> list[tuple[str, Any]]:
    """Each field of ``cls`` with what turns its column into the field's value (None: as
    it is): worked out once per class, not per row (a DiscoverResources of the whole
    inventory decodes every node row; ``fields()`` per row was most of its cost)."""
    out: list[tuple[str, Any]] = []
    for f in fields(cls):
        if f.name == "attrs":
            out.append((f.name, _json_attrs))
        elif f.name in _JSON_FIELDS:
            out.append((f.name, _json_list))
        elif f.name in _ENUMS:
            enum = _ENUMS[f.name]
            out.append((f.name, lambda v, enum=enum: enum(v or "")))
        else:
            out.append((f.name, None))
    return out


_DECODERS: dict[type, list[tuple[str, Any]]] = {}


def _decode(cls: type, row: sqlite3.Row) -> Any:
    plan = _DECODERS.get(cls)
    if plan is None:
        plan = _DECODERS[cls] = _decoder(cls)
    return cls(**{name: row[name] if conv is None else conv(row[name])
                  for name, conv in plan})


class Store:
    """Typed access to the SQLite state file; every method is atomic and thread-safe."""

    def __init__(self, path: str | Path, slices: Store | None = None) -> None:
        self.path = Path(path)
        self.lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        # a cluster's CM (clusters.py) keeps its own slivers and nodes; the slices are the
        # SA's, in the SA's store
        self._slices = slices

    def open(self) -> Store:
        try:
            conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                   timeout=10.0)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
        except sqlite3.Error as err:
            raise StoreError(f"{self.path}: cannot open emulator state: {err}") from err
        self._conn = conn
        return self

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self.path}: store is not open")
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several writes atomically (re-entrant: nested uses join the outer one)."""
        with self.lock:
            if self.conn.in_transaction:
                yield
                return
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    def _upsert(self, table: str, obj: Any) -> None:
        names = [f.name for f in fields(obj) if not (table == "reclaims" and f.name == "id")]
        values = [_encode(n, getattr(obj, n)) for n in names]
        marks = ",".join("?" for _ in names)
        with self.lock:
            self.conn.execute(f"INSERT OR REPLACE INTO {table} ({','.join(names)}) "
                              f"VALUES ({marks})", values)

    def _select(self, cls: type, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self.lock:
            rows = self.conn.execute(sql, args).fetchall()
        return [_decode(cls, r) for r in rows]

    # meta
    def get_meta(self, key: str, default: str | None = None) -> str | None:
        with self.lock:
            row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row["value"] if row else default

    def set_meta(self, key: str, value: str) -> None:
        with self.lock:
            self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                              (key, value))

    # slices
    def put_slice(self, row: SliceRow) -> None:
        (self._slices or self)._upsert("slices", row)

    def get_slice(self, urn: str) -> SliceRow | None:
        found = (self._slices or self)._select(SliceRow, "SELECT * FROM slices WHERE urn=?",
                                               (urn,))
        return found[0] if found else None

    def slices_of(self, creator_urn: str) -> list[SliceRow]:
        return (self._slices or self)._select(
            SliceRow, "SELECT * FROM slices WHERE creator_urn=? ORDER BY urn", (creator_urn,))

    def all_slices(self) -> list[SliceRow]:
        return (self._slices or self)._select(SliceRow, "SELECT * FROM slices ORDER BY urn")

    # slivers
    def put_sliver(self, row: SliverRow) -> None:
        self._upsert("slivers", row)

    def get_sliver(self, slice_urn: str) -> SliverRow | None:
        found = self._select(SliverRow, "SELECT * FROM slivers WHERE slice_urn=?", (slice_urn,))
        return found[0] if found else None

    def sliver_by_urn(self, sliver_urn: str) -> SliverRow | None:
        found = self._select(SliverRow, "SELECT * FROM slivers WHERE sliver_urn=?",
                             (sliver_urn,))
        return found[0] if found else None

    def all_slivers(self) -> list[SliverRow]:
        return self._select(SliverRow, "SELECT * FROM slivers ORDER BY slice_urn")

    def delete_sliver(self, slice_urn: str) -> None:
        with self.lock:
            self.conn.execute("DELETE FROM slivers WHERE slice_urn=?", (slice_urn,))

    # nodes
    def put_node(self, row: NodeRow) -> None:
        self._upsert("nodes", row)

    def put_nodes(self, rows: list[NodeRow]) -> None:
        with self.transaction():
            for row in rows:
                self._upsert("nodes", row)

    def get_node(self, node_id: str) -> NodeRow | None:
        found = self._select(NodeRow, "SELECT * FROM nodes WHERE node_id=?", (node_id,))
        return found[0] if found else None

    def nodes(self, *, holder: Holder | None = None, slice_urn: str | None = None,
              hardware_type: str | None = None) -> list[NodeRow]:
        where, args = [], []
        if holder is not None:
            where.append("holder=?")
            args.append(holder.value)
        if slice_urn is not None:
            where.append("slice_urn=?")
            args.append(slice_urn)
        if hardware_type is not None:
            where.append("hardware_type=?")
            args.append(hardware_type)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._select(NodeRow, f"SELECT * FROM nodes{clause} ORDER BY node_id",
                            tuple(args))

    def update_node(self, node_id: str, sliver_urn: str, **changes: Any) -> bool:
        """Change some fields of a node, only while it still belongs to ``sliver_urn``."""
        names = list(changes)
        values = [_encode(n, changes[n]) for n in names]
        with self.lock:
            cur = self.conn.execute(
                f"UPDATE nodes SET {', '.join(f'{n}=?' for n in names)} "
                "WHERE node_id=? AND sliver_urn=?", values + [node_id, sliver_urn])
        return cur.rowcount > 0

    # endpoints
    def put_endpoint(self, row: EndpointRow) -> None:
        self._upsert("endpoints", row)

    def get_endpoint(self, slice_urn: str) -> EndpointRow | None:
        found = self._select(EndpointRow, "SELECT * FROM endpoints WHERE slice_urn=?",
                             (slice_urn,))
        return found[0] if found else None

    def delete_endpoint(self, slice_urn: str) -> None:
        with self.lock:
            self.conn.execute("DELETE FROM endpoints WHERE slice_urn=?", (slice_urn,))

    def all_endpoints(self) -> list[EndpointRow]:
        return self._select(EndpointRow, "SELECT * FROM endpoints ORDER BY slice_urn")

    # reclamations
    def add_reclaim(self, row: ReclaimRow) -> int:
        names = [f.name for f in fields(row) if f.name != "id"]
        with self.lock:
            cur = self.conn.execute(
                f"INSERT INTO reclaims ({','.join(names)}) VALUES "
                f"({','.join('?' for _ in names)})", [_encode(n, getattr(row, n)) for n in names])
            row.id = int(cur.lastrowid or 0)
        return row.id

    def update_reclaim(self, row: ReclaimRow) -> None:
        with self.lock:
            self.conn.execute(
                "UPDATE reclaims SET last_notified=?, notifications=?, released_at=?, outcome=? "
                "WHERE id=?", (row.last_notified, row.notifications, row.released_at,
                               row.outcome, row.id))

    def count_notice(self, row: ReclaimRow) -> None:
        """Record that ``row``'s node was told (again), and nothing else: its outcome may have
        been written meanwhile (a DeleteNodes during the callback) and must stay."""
        with self.lock:
            self.conn.execute("UPDATE reclaims SET last_notified=?, notifications=? WHERE id=?",
                              (row.last_notified, row.notifications, row.id))

    def reclaims(self, *, pending_only: bool = False) -> list[ReclaimRow]:
        clause = " WHERE outcome='pending'" if pending_only else ""
        return self._select(ReclaimRow, f"SELECT * FROM reclaims{clause} ORDER BY id")
