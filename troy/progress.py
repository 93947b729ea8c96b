"""``troy run``'s progress on stderr: tasks final, running and failed, and an ETA.

Fed by task state events ``(task id, State)``: a run's ``WorkloadRun.events()``, or a queue
(``None`` ends it). A terminal gets
a bar; anything else a line per tenth of the tasks (and the last one)::

    tasks: 40/100 final, 4 running, 1 failed, ETA 1 min 30 s

The ETA comes from the throughput so far (tasks final per second since the start); it reads
``ETA ?`` until a task has ended, since there is no throughput to go by before.
"""
from __future__ import annotations

import queue
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import click

from troy.estimate import duration
from troy.states import State


def eta(final: int, total: int, elapsed: float) -> float | None:
    """Seconds left at the throughput so far; None while nothing has ended yet."""
    if final >= total:
        return 0.0
    if final <= 0 or elapsed <= 0:
        return None
    return (total - final) * elapsed / final


@dataclass
class Counts:
    """What the progress line shows, updated by task events."""

    total: int
    final: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)

    def update(self, tid: str, state: State) -> bool:
        """Take one event; True when a task became final (for the first time)."""
        if tid in self.final:
            return False
        if state.is_final:
            self.final.add(tid)
            self.running.discard(tid)
            if state is State.FAILED:
                self.failed.add(tid)
            return True
        if state is State.RUNNING:
            self.running.add(tid)
        else:
            self.running.discard(tid)
        return False

    def status(self, elapsed: float) -> str:
        """``4 running, 1 failed, ETA 1 min 30 s`` (``ETA ?`` while unknown)."""
        left = eta(len(self.final), self.total, elapsed)
        return (f"{len(self.running)} running, {len(self.failed)} failed, "
                f"ETA {'?' if left is None else duration(left)}")

    def line(self, elapsed: float) -> str:
        return f"tasks: {len(self.final)}/{self.total} final, {self.status(elapsed)}"


def _events(events: queue.SimpleQueue | Iterable[tuple[str, State]]
            ) -> Iterator[tuple[str, State]]:
    if not isinstance(events, queue.SimpleQueue):
        yield from events
        return
    while True:
        item = events.get()
        if item is None:
            return
        yield item


def show_progress(events: queue.SimpleQueue | Iterable[tuple[str, State]], total: int, *,
                  stream: IO[str] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> Counts:
    """Show progress until ``events`` end (an iterable, or ``None`` on a queue); returns
    the last counts."""
    err = stream if stream is not None else sys.stderr
    counts, started = Counts(total), clock()
    if err.isatty():
        def label(_: Any) -> str:
            return counts.status(clock() - started)

        with click.progressbar(length=total, label="tasks", file=err, show_pos=True,
                               show_eta=False, item_show_func=label) as bar:
            for tid, state in _events(events):
                bar.update(1 if counts.update(tid, state) else 0, tid)
        return counts
    step, shown = max(1, total // 10), 0
    for tid, state in _events(events):
        if counts.update(tid, state):
            done = len(counts.final)
            if done - shown >= step or done == total:
                shown = done
                click.echo(counts.line(clock() - started), file=err)
    return counts
