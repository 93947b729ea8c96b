"""The tables of ``<state_dir>/manager.db`` and the migrations between their versions.

Version 2 keeps one row per revocation (``revocations``: CloudLab's NotifyDeletePending for
a node we hold, from the first notice to the node leaving the slice) instead of one row per
node (version 1's ``pending_deletes``, which a second revocation of the same machine
overwrote). Version 3 keeps each node's control address as its manifest says (``nodes.ipv4``, the
``host@ipv4`` CloudLab gives it): the enrolment service takes a node's token only from that
address, across restarts of the control process. Version 4 keeps the nodes to give back
(``to_release``: a policy victim, a replaced node, a revoked node drained or whose delete
commands finished, one row each until the actuator's DeleteNodes took it or the node left),
so a manager that dies before the DeleteNodes gives them back when it comes back. Version 5
keeps what CloudLab said with each resource value (``node_values.client_id``,
``component_urn``): the state is the one place SetResourceValues is kept. Older files are
migrated when opened for writing.
"""
from __future__ import annotations

import json
import sqlite3

SCHEMA_VERSION = 5

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS slice (one INTEGER PRIMARY KEY CHECK (one = 1), urn TEXT,
    expires REAL, updated REAL);
CREATE TABLE IF NOT EXISTS slivers (cm TEXT PRIMARY KEY, urn TEXT, expires REAL, status TEXT,
    updated REAL);
CREATE TABLE IF NOT EXISTS nodes (cm TEXT, client_id TEXT, node_id TEXT, hostname TEXT,
    state TEXT, initial INTEGER, added_at REAL, gone_at REAL, gone_reason TEXT, updated REAL,
    ipv4 TEXT, PRIMARY KEY (cm, client_id));
CREATE INDEX IF NOT EXISTS nodes_by_node_id ON nodes (node_id);
CREATE TABLE IF NOT EXISTS history (id INTEGER PRIMARY KEY AUTOINCREMENT, cm TEXT,
    client_id TEXT, ts REAL, state TEXT, note TEXT);
CREATE INDEX IF NOT EXISTS history_by_node ON history (cm, client_id);
CREATE TABLE IF NOT EXISTS revocations (id INTEGER PRIMARY KEY AUTOINCREMENT, cm TEXT,
    node_id TEXT, client_id TEXT, deadline REAL, first_seen REAL, last_seen REAL,
    released REAL, finished REAL, outcome TEXT, note TEXT);
CREATE INDEX IF NOT EXISTS revocations_open ON revocations (node_id, finished);
CREATE TABLE IF NOT EXISTS node_values (cm TEXT, node_id TEXT, value REAL, updated REAL,
    client_id TEXT, component_urn TEXT, PRIMARY KEY (cm, node_id));
CREATE TABLE IF NOT EXISTS intents (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT, cm TEXT,
    client_ids TEXT, created REAL, finished REAL, outcome TEXT);
CREATE TABLE IF NOT EXISTS cycle (method TEXT PRIMARY KEY, last_run REAL, last_ok REAL,
    next_run REAL, last_error TEXT, last_error_at REAL, failures INTEGER DEFAULT 0,
    runs INTEGER DEFAULT 0, last_duration REAL);
CREATE TABLE IF NOT EXISTS to_release (id INTEGER PRIMARY KEY AUTOINCREMENT, cm TEXT,
    client_id TEXT, node_id TEXT, source TEXT, reason TEXT, asked REAL,
    UNIQUE (cm, client_id));
"""

_V1_TO_V2 = """
INSERT INTO revocations (cm, node_id, client_id, deadline, first_seen, last_seen, finished,
    outcome) SELECT cm, node_id, client_id, deadline, first_seen, last_seen, finished, outcome
    FROM pending_deletes;
DROP TABLE pending_deletes;
"""


def create(conn: sqlite3.Connection) -> str:
    """Make the tables (a new file gets this version); the file's version as stored."""
    exists = conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND "
                          "name='meta'").fetchone()
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() \
        if exists else None
    conn.executescript(SCHEMA)
    if row is None:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                     (str(SCHEMA_VERSION),))
        return str(SCHEMA_VERSION)
    return str(row[0])


def migrate(conn: sqlite3.Connection, version: str) -> str:
    """Bring a file of an older version up to :data:`SCHEMA_VERSION` (one transaction);
    the version it has after."""
    if version not in ("1", "2", "3", "4"):
        return version
    conn.execute("BEGIN IMMEDIATE")
    try:
        if version == "1" and conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND "
                "name='pending_deletes'").fetchone():
            for statement in filter(str.strip, _V1_TO_V2.split(";")):
                conn.execute(statement)
            _fold_pilot_counts(conn)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(nodes)")}
        if "ipv4" not in columns:   # version 3: the nodes' manifest addresses
            conn.execute("ALTER TABLE nodes ADD COLUMN ipv4 TEXT")
        # version 4: ``to_release``, made by ``create`` (nothing to give back yet)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(node_values)")}
        for column in ("client_id", "component_urn"):   # version 5: what came with a value
            if column not in columns:
                conn.execute(f"ALTER TABLE node_values ADD COLUMN {column} TEXT")
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                     (str(SCHEMA_VERSION),))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return str(SCHEMA_VERSION)


def _fold_pilot_counts(conn: sqlite3.Connection) -> None:
    """Version 1's pilots manager kept its counts apart (meta ``pilots.revocations``, node_ids
    seen, early, forced): they become the revocations' outcomes."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'pilots.revocations'").fetchone()
    try:
        counts = json.loads(row[0]) if row else {}
    except ValueError:
        counts = {}
    for node_id in counts.get("seen", ()):
        if not conn.execute("SELECT 1 FROM revocations WHERE node_id = ?",
                            (str(node_id),)).fetchone():
            conn.execute("INSERT INTO revocations (cm, node_id, deadline, first_seen, finished)"
                         " VALUES ('', ?, 0, 0, 0)", (str(node_id),))
    for outcome in ("early", "forced"):
        for node_id in counts.get(outcome, ()):
            conn.execute("UPDATE revocations SET outcome = ? WHERE node_id = ?",
                         (outcome, str(node_id)))
    conn.execute("DELETE FROM meta WHERE key = 'pilots.revocations'")
