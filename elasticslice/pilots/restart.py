"""What lets an elastic cluster's process die (SIGKILL) and come back on the same state dir.

``<state_dir>/cluster.json`` (:class:`ClusterFile`) says where the Dask scheduler serves and
which process holds it: written as soon as the scheduler serves, read by the next start to
listen on the same port (the node agents rejoin that address by themselves).
``<state_dir>/stats.json`` (:class:`StatsLedger`, kept up to date by :class:`RunCounters`) keeps Troy's unit counters (requeues,
duplicate runs, lost units) of the earlier processes of the run, which die with them; the
manager's own counters already survive in its state store.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.rpc.pki import write_private_file

log = logging.getLogger(__name__)

#: Troy's counters that die with a process: summed over the processes of one run
UNIT_COUNTERS = ("units_requeued", "duplicates", "units_lost")


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a SIGKILL leaves the old or the new file), 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_private_file(tmp, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None if there is no file; an error naming the file if
    it is not a JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ElasticSliceError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ElasticSliceError(f"{path}: not JSON ({err}); move it away to start afresh") \
            from err
    if not isinstance(data, dict):
        raise ElasticSliceError(f"{path}: expected a JSON object; move it away to start afresh")
    return data


@dataclasses.dataclass
class ClusterFile:
    """``<state_dir>/cluster.json``: the scheduler's address and the process that serves it
    (``restarts``: how many times the cluster came back on this state dir; ``closed``: it
    was closed and gave its nodes back, so no agent waits for that address)."""

    scheduler: str
    pid: int
    restarts: int = 0
    closed: bool = False
    started: float = dataclasses.field(default_factory=time.time)

    NAME = "cluster.json"

    @property
    def port(self) -> int:
        return int(self.scheduler.rsplit(":", 1)[1])

    @classmethod
    def mark_closed(cls, state_dir: Path) -> None:
        """Say in the file that the cluster gave its nodes back (a warning if it cannot)."""
        try:
            found = cls.load(state_dir)
            if found is not None:
                dataclasses.replace(found, closed=True).save(state_dir)
        except (ElasticSliceError, OSError) as err:
            log.warning("cannot mark the cluster closed: %s", err)

    @classmethod
    def load(cls, state_dir: Path) -> ClusterFile | None:
        path = state_dir / cls.NAME
        data = read_json(path)
        if data is None:
            return None
        try:
            found = cls(scheduler=str(data["scheduler"]), pid=int(data["pid"]),
                        restarts=int(data.get("restarts", 0)),
                        started=float(data.get("started", 0.0)),
                        closed=data.get("closed") is True)
            if not 0 < found.port < 65536:
                raise ValueError(f"port {found.port}")
        except (KeyError, ValueError, TypeError, IndexError) as err:
            raise ElasticSliceError(f"{path}: not a cluster file ({err}); move it away to "
                                    f"start afresh") from err
        return found

    def save(self, state_dir: Path) -> None:
        write_json(state_dir / self.NAME, dataclasses.asdict(self))


class StatsLedger:
    """``<state_dir>/stats.json``: the unit counters of the run's earlier processes
    (``previous``) and of this one as last saved (``current``). Opening it folds
    ``current`` into ``previous``: the process that saved it is gone."""

    NAME = "stats.json"

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / self.NAME
        self.previous = dict.fromkeys(UNIT_COUNTERS, 0)

    def open(self) -> None:
        data = read_json(self.path) or {}
        for part in ("previous", "current"):
            counts = data.get(part) or {}
            if not isinstance(counts, dict):
                raise ElasticSliceError(f"{self.path}: {part!r} is not an object; move the "
                                        f"file away to start the counts afresh")
            for key in UNIT_COUNTERS:
                value = counts.get(key, 0)
                self.previous[key] += int(value) if isinstance(value, (int, float)) else 0
        self.save(dict.fromkeys(UNIT_COUNTERS, 0))

    def totals(self, current: Mapping[str, Any]) -> dict[str, int]:
        """The run's counters: the earlier processes' plus ``current`` (this process')."""
        return {k: self.previous[k] + int(current.get(k, 0)) for k in UNIT_COUNTERS}

    def save(self, current: Mapping[str, Any]) -> None:
        try:
            write_json(self.path, {"previous": self.previous,
                                   "current": {k: int(current.get(k, 0))
                                               for k in UNIT_COUNTERS}})
        except OSError as err:  # a full disk must not stop the run; the log says so
            log.warning("cannot save the run's counters in %s: %s", self.path,
                        err.strerror or err)


class RunCounters:
    """This process' unit counters (read from ``session()``, a Troy session, None once it
    is closed) added to those of the run's earlier processes (:class:`StatsLedger`), saved
    every ``every`` seconds by a thread of its own (:meth:`start` to :meth:`stop`) and at
    :meth:`save`. ``recovered``: units that were running when the last process died and run
    again (they count as requeued)."""

    def __init__(self, state_dir: Path, session: Callable[[], Any], every: float = 2.0) -> None:
        self.ledger = StatsLedger(state_dir)
        self.session = session
        self.every = every
        self.recovered = 0
        self._opened = False
        self._last = dict.fromkeys(UNIT_COUNTERS, 0)
        self._stop = threading.Event()

    def open(self) -> RunCounters:
        self.ledger.open()
        self._opened = True
        return self

    def start(self) -> None:
        self._stop.clear()
        threading.Thread(target=self._loop, name="cluster-stats", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.save()

    def current(self) -> dict[str, int]:
        """This process' counters."""
        session = self.session()
        if session is None:   # closed: as last saved
            return dict(self._last)
        units = session.unit_stats()
        return {"units_requeued": units.requeued + self.recovered,
                "duplicates": units.duplicates, "units_lost": units.lost}

    def save(self) -> None:
        """Persist this process' counters (also done every ``every`` seconds)."""
        if self._opened and self.session() is not None:
            self._last = self.current()
            self.ledger.save(self._last)

    def totals(self) -> dict[str, int]:
        """The run's counters: the earlier processes' and this one's."""
        current = self.current()
        return self.ledger.totals(current) if self._opened else current


def recover_session(session: Any, counters: RunCounters, state_dir: Path,
                    restarts: int) -> None:
    """Troy's side of a restart: units in flight when the last process died run again
    (those running count as requeued), dispatched workloads are rebuilt."""
    from troy.states import State
    running = sum(1 for r in session.store.unfinished_units() if r.state is State.RUNNING)
    units = session.recover()
    counters.recovered += running
    log.info("resuming the cluster in %s (restart %d): %d unit(s) dispatched again",
             state_dir, restarts, len(units))
