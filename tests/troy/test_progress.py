"""``troy run``'s progress line: final, running and failed counts, and the ETA."""
from __future__ import annotations

import io
import json
import queue

from click.testing import CliRunner

from troy.cli import cli
from troy.progress import Counts, eta, show_progress
from troy.states import State


class Clock:
    """A clock 10 s later at every reading (no wall time involved)."""

    def __init__(self) -> None:
        self.now = 90.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


def test_eta_from_throughput_so_far():
    assert eta(0, 10, 5.0) is None          # nothing ended: no throughput yet
    assert eta(2, 10, 4.0) == 16.0          # 2 tasks in 4 s: 8 more take 16 s
    assert eta(10, 10, 4.0) == 0.0


def test_counts_follow_task_states():
    c = Counts(total=3)
    c.update("a", State.DISPATCHED)
    c.update("a", State.RUNNING)
    c.update("b", State.RUNNING)
    assert c.line(1.0) == "tasks: 0/3 final, 2 running, 0 failed, ETA ?"
    assert c.update("a", State.FAILED) is True
    assert c.update("a", State.FAILED) is False     # said twice, counted once
    assert c.line(3.0) == "tasks: 1/3 final, 1 running, 1 failed, ETA 6.0 s"
    c.update("b", State.DONE)
    c.update("c", State.CANCELED)
    assert c.line(4.0) == "tasks: 3/3 final, 0 running, 1 failed, ETA 0 s"


def test_show_progress_lines_on_a_pipe():
    events: queue.SimpleQueue = queue.SimpleQueue()
    clock, out = Clock(), io.StringIO()
    for i in range(20):
        events.put((f"t{i}", State.RUNNING))
    for i in range(20):
        events.put((f"t{i}", State.FAILED if i == 3 else State.DONE))
    events.put(None)
    # a line per tenth (2 tasks), each 10 s after the one before: 2 tasks per 10 s
    counts = show_progress(events, 20, stream=out, clock=clock)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and len(counts.final) == 20
    assert lines[0] == "tasks: 2/20 final, 18 running, 0 failed, ETA 1 min 30 s"
    assert lines[1] == "tasks: 4/20 final, 16 running, 1 failed, ETA 1 min 20 s"
    assert lines[-1] == "tasks: 20/20 final, 0 running, 1 failed, ETA 0 s"


def test_troy_run_progress_counts_failed_tasks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # task output goes to ./troy-out/ without --report
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"tasks": [
        {"id": "ok", "executable": "/bin/true", "cardinality": 3},
        {"id": "bad", "executable": "/bin/sh", "arguments": ["-c", "exit 3"]}]}))
    result = CliRunner().invoke(cli, ["run", str(f), "--no-bundle"])
    assert result.exit_code == 1, result.output
    assert "tasks: 4/4 final, 0 running, 1 failed, ETA 0 s" in result.output


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_show_progress_bar_on_a_terminal_shows_the_counts():
    events: queue.SimpleQueue = queue.SimpleQueue()
    for item in [("a", State.RUNNING), ("b", State.RUNNING), ("a", State.DONE),
                 ("b", State.FAILED), None]:
        events.put(item)
    out = Terminal()
    show_progress(events, 2, stream=out, clock=Clock())
    text = out.getvalue()
    assert "tasks" in text and "2/2" in text
    assert "0 running, 1 failed, ETA 0 s" in text
