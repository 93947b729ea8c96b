"""The invariants of a chaos run, checked against the stores after the run: the emulator's
own records (its SQLite stores, read-only: the SA's, and each CM's in a box of several
clusters) and the manager's state store.

:class:`Watch` samples the emulator's store while the run goes (which nodes each slice
holds, whether the slice and its sliver exist, whether every task has run); :func:`figures_of`
compares with what the manager recorded (every incarnation's, one store).
``nodes_leaked``: nodes still held after the cluster's last process gave the slice back;
``duplicate_adds``: nodes a CM gave the slice that the manager never recorded, a client_id
held twice at once at one CM, more nodes than ``maxthreshold`` in all; ``slice_lapses``:
samples where the slice or one of its slivers (at any CM it had one) had gone (or
expired) while the workflow ran (once every task has run, the slice goes back on purpose).
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


@dataclasses.dataclass(frozen=True)
class Stores:
    """Where the emulator keeps its records: the SA's store (slices), and each CM's
    (slivers, nodes) by cluster name ("" for a box of one CM, whose store is the SA's)."""

    sa: Path
    cms: tuple[tuple[str, Path], ...]

    @classmethod
    def of(cls, emu_dir: Path, sites: tuple[str, ...] = ()) -> Stores:
        db = emu_dir / "state.db"
        if not sites:
            return cls(db, (("", db),))
        return cls(db, tuple((s, emu_dir / "cms" / s / "state.db") for s in sites))


@dataclasses.dataclass
class Sample:
    at: float
    slices: dict[str, float]            # slice urn -> expires
    slivers: set[tuple[str, str]]       # (cluster, slice urn) of each sliver
    held: list[tuple[str, str, str, str]]  # (slice_urn, client_id, node_id, cluster)
    ended: bool = False                 # every task had run (the slice may go back)


def _read(db: Path, query: str) -> list[tuple] | None:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error:
        return None
    try:
        return [tuple(r) for r in conn.execute(query).fetchall()]
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def sample(stores: Stores) -> Sample | None:
    """The emulator's records now (None if a store cannot be read at this moment)."""
    slices = _read(stores.sa, "SELECT urn, expires FROM slices")
    if slices is None:
        return None
    slivers: set[tuple[str, str]] = set()
    held: list[tuple[str, str, str, str]] = []
    for site, db in stores.cms:
        rows = _read(db, "SELECT slice_urn FROM slivers")
        nodes = _read(db, "SELECT slice_urn, client_id, node_id FROM nodes "
                          "WHERE holder = 'slice'")
        if rows is None or nodes is None:
            return None
        slivers |= {(site, r[0]) for r in rows}
        held += [(u, c, n, site) for u, c, n in nodes]
    return Sample(time.time(), dict(slices), slivers, held)  # type: ignore[arg-type]


class Watch:
    """Samples the emulator's stores every ``interval`` seconds in a thread; ``ended()``
    says whether the workflow's work is all done."""

    def __init__(self, stores: Stores, ended: Callable[[], bool],
                 interval: float = 0.25) -> None:
        self.db = stores
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
    """Times the slice (or a sliver of it, at a CM it had one) went missing or expired
    after it first existed."""
    lapses, up, seen = 0, False, set()
    for s in samples:
        if s.ended:
            break
        at = {site for site, u in s.slivers if u == slice_urn}
        ok = (slice_urn in s.slices and bool(at) and seen <= at
              and s.slices[slice_urn] > s.at)
        if up and not ok:
            lapses += 1
        seen |= at
        up = ok if (up or ok) else up
    return lapses


def duplicate_adds(samples: list[Sample], slice_urn: str | None, known_nodes: set[str],
                   known_clients: set[str], maxthreshold: int) -> int:
    """Adds the manager did not account for (see the module docstring)."""
    strangers: set[str] = set()
    doubled = over = 0
    for s in samples:
        mine = [(c, n, site) for u, c, n, site in s.held if u == slice_urn]
        counts = Counter((site, c) for c, _, site in mine)
        doubled += sum(1 for v in counts.values() if v > 1)
        over = max(over, len(mine) - maxthreshold)
        strangers |= {n for c, n, _ in mine if n not in known_nodes and c not in known_clients}
    return len(strangers) + doubled + over


def held_by(stores: Stores, slice_urn: str | None) -> list[str] | None:
    s = sample(stores)
    return None if s is None else sorted(f"{site}/{c}" if site else c
                                         for u, c, _, site in s.held if u == slice_urn)


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
            "nodes_peak_cm": max((sum(1 for h in s.held if h[0] == slice_urn)
                                  for s in samples), default=0),
            "nodes_peak_by_site": {site: max((sum(1 for h in s.held if h[0] == slice_urn
                                                  and h[3] == site) for s in samples),
                                             default=0)
                                   for site in sorted({h[3] for s in samples for h in s.held})
                                   if site}}
