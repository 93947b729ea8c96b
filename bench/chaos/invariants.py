"""The invariants of a chaos run, checked against the stores after the run: the emulator's
own records (its SQLite store, read-only) and the manager's state store.

:class:`Watch` samples the emulator's store while the run goes (which nodes each slice
holds, whether the slice and its sliver exist, whether every task has run); :func:`figures_of`
compares with what the manager recorded (every incarnation's, one store).
``nodes_leaked``: nodes still held after the cluster's last process gave the slice back;
``duplicate_adds``: nodes the CM gave the slice that the manager never recorded, a client_id
held twice at once, more nodes than ``maxthreshold``; ``slice_lapses``: samples where the
slice or its sliver had gone (or expired) while the workflow ran (once every task has run,
the slice goes back on purpose).
"""
from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Sample:
    at: float
    slices: dict[str, float]            # slice urn -> expires
    slivers: set[str]                   # slice urns with a sliver
    held: list[tuple[str, str, str]]    # (slice_urn, client_id, node_id) held by slices
    ended: bool = False                 # every task had run (the slice may go back)


def sample(db: Path) -> Sample | None:
    """The emulator's records now (None if the store cannot be read at this moment)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error:
        return None
    try:
        slices = dict(conn.execute("SELECT urn, expires FROM slices").fetchall())
        slivers = {r[0] for r in conn.execute("SELECT slice_urn FROM slivers")}
        held = [tuple(r) for r in conn.execute(
            "SELECT slice_urn, client_id, node_id FROM nodes WHERE holder = 'slice'")]
        return Sample(time.time(), slices, slivers, held)  # type: ignore[arg-type]
    except sqlite3.Error:
        return None
    finally:
        conn.close()


class Watch:
    """Samples the emulator's store every ``interval`` seconds in a thread; ``ended()``
    says whether the workflow's work is all done."""

    def __init__(self, db: Path, ended: Callable[[], bool], interval: float = 0.25) -> None:
        self.db = db
        self.ended = ended
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-watch", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            ended = self.ended()
            s = sample(self.db)
            if s is not None:
                s.ended = ended
                self.samples.append(s)


def slice_lapses(samples: list[Sample], slice_urn: str | None) -> int:
    """Times the slice (or its sliver) went missing or expired after it first existed."""
    lapses, up = 0, False
    for s in samples:
        if s.ended:
            break
        ok = (slice_urn in s.slices and slice_urn in s.slivers
              and s.slices[slice_urn] > s.at)
        if up and not ok:
            lapses += 1
        up = ok if (up or ok) else up
    return lapses


def duplicate_adds(samples: list[Sample], slice_urn: str | None, known_nodes: set[str],
                   known_clients: set[str], maxthreshold: int) -> int:
    """Adds the manager did not account for (see the module docstring)."""
    strangers: set[str] = set()
    doubled = over = 0
    for s in samples:
        mine = [(c, n) for u, c, n in s.held if u == slice_urn]
        counts = Counter(c for c, _ in mine)
        doubled += sum(1 for v in counts.values() if v > 1)
        over = max(over, len(mine) - maxthreshold)
        strangers |= {n for c, n in mine if n not in known_nodes and c not in known_clients}
    return len(strangers) + doubled + over


def held_by(db: Path, slice_urn: str | None) -> list[str] | None:
    s = sample(db)
    return None if s is None else sorted(c for u, c, _ in s.held if u == slice_urn)


def figures_of(samples: list[Sample], state_dir: Path, slice_urn: str,
               maxthreshold: int) -> dict[str, Any]:
    """slice_lapses, duplicate_adds, nodes_peak_cm, from the samples and the manager's
    state store in ``state_dir`` (read after its process ended)."""
    from elasticslice.managers.state import ManagerState
    state = ManagerState.read_only(state_dir)
    try:
        recs = state.nodes(include_gone=True)
    finally:
        state.close()
    return {"slice_lapses": slice_lapses(samples, slice_urn),
            "duplicate_adds": duplicate_adds(
                samples, slice_urn, {r.node_id for r in recs if r.node_id},
                {r.client_id for r in recs}, maxthreshold),
            "nodes_peak_cm": max((sum(1 for u, _, _ in s.held if u == slice_urn)
                                  for s in samples), default=0)}
