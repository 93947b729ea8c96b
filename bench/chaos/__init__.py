"""The chaos suite (``make chaos``, ``python -m bench.chaos --runs N --seed S --json OUT``).

Each run executes a small WfCommons workflow on an elastic cluster whose nodes are real
Troy pilots on the emulator while a seeded schedule restarts the manager, SIGKILLs node
agents, makes the emulator answer BUSY/503/slowly, revokes nodes with short and zero
notice, restarts the emulator and drops the callback endpoint; then it checks the
invariants against the emulator's records and the manager's state. See docs/chaos.md.
"""
from __future__ import annotations

from bench.chaos.run import RunResult, chaos_run
from bench.chaos.schedule import Fault, Kind, make_schedule

__all__ = ["Fault", "Kind", "RunResult", "chaos_run", "make_schedule"]
