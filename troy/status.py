"""``troy status STORE``: a run's progress, read from its store (``troy run --store``).

The store is opened read-only (a run may be writing it: SQLite WAL lets both go on), so a
status never changes a store, nor creates one. Per workload: its state as last recorded,
its tasks done / running / failed / canceled / pending, when it started and its last update.
A task's state comes from its units' last recorded states (a bundle unit running counts
each of its tasks as running). A run that was killed keeps its last recorded states: its
workload may read RUNNING with no process behind it; ``troy run --store`` resumes it.
"""
from __future__ import annotations

import json
import sqlite3
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from troy.errors import UsageError
from troy.resume import META_KEY
from troy.states import State, derive_task_state


@dataclass
class WorkloadStatus:
    """One workload of a store, as ``troy status`` shows it."""

    id: str
    state: str
    file: str | None
    tasks: int
    done: int
    running: int
    failed: int
    canceled: int
    pending: int
    started: float
    updated: float


def _connect(path: str) -> sqlite3.Connection:
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, timeout=10)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as err:
        raise UsageError(f"{path}: not a Troy store ({err})") from None
    if not {"units", "workloads"} <= tables:
        db.close()
        raise UsageError(f"{path}: not a Troy store (an SQLite file without Troy's units "
                         f"and workloads tables)")
    return db


def read_status(path: str) -> list[WorkloadStatus]:
    """Every workload of the store at ``path``, oldest first."""
    db = _connect(path)
    try:
        meta: dict[str, Any] = {}
        if db.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone():
            row = db.execute("SELECT value FROM meta WHERE key=?", (META_KEY,)).fetchone()
            meta = json.loads(row[0]) if row else {}
        workloads = db.execute("SELECT id, state, tasks, created, updated FROM workloads "
                               "ORDER BY created").fetchall()
        units = db.execute("SELECT workload, task_ids, state, updated FROM units").fetchall()
    except (sqlite3.Error, ValueError) as err:
        raise UsageError(f"{path}: not a Troy store ({err})") from None
    finally:
        db.close()
    per_task: dict[str, dict[str, list[State]]] = defaultdict(lambda: defaultdict(list))
    last: dict[str, float] = {}
    for wid, task_ids, state, updated in units:
        for tid in json.loads(task_ids):
            per_task[wid][tid].append(State(state))
        last[wid] = max(last.get(wid, 0.0), updated)
    out = []
    for wid, state, total, created, updated in workloads:
        count: dict[State, int] = defaultdict(int)
        for states in per_task[wid].values():
            count[derive_task_state(states)] += 1
        done, running = count[State.DONE], count[State.RUNNING]
        failed, canceled = count[State.FAILED], count[State.CANCELED]
        out.append(WorkloadStatus(
            wid, state, meta.get("file") if meta.get("workload") == wid else None, total,
            done, running, failed, canceled, max(0, total - done - running - failed - canceled),
            created, max(updated, last.get(wid, 0.0))))
    return out


def _when(t: float, now: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    ago = max(0.0, now - t)
    return f"{stamp} ({ago:.0f} s ago)" if ago < 120 else \
        f"{stamp} ({ago / 60:.0f} min ago)" if ago < 7200 else f"{stamp} ({ago / 3600:.0f} h ago)"


def format_status(path: str, workloads: list[WorkloadStatus], now: float | None = None) -> str:
    """The text ``troy status`` prints."""
    if not workloads:
        return f"{path}: no workload dispatched yet"
    now = time.time() if now is None else now
    lines = []
    for w in workloads:
        lines.append(f"workload {w.id}{' (' + w.file + ')' if w.file else ''}: {w.state}")
        lines.append(f"  tasks: {w.done}/{w.tasks} done, {w.running} running, {w.failed} "
                     f"failed, {w.canceled} canceled, {w.pending} pending")
        lines.append(f"  started {_when(w.started, now)}; last update {_when(w.updated, now)}")
    return "\n".join(lines)


def status_json(path: str, workloads: list[WorkloadStatus]) -> dict[str, Any]:
    return {"store": path, "workloads": [asdict(w) for w in workloads]}
