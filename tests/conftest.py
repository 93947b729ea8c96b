"""Shared fixtures and helpers for the whole suite."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# A copy of the project's shared/ inputs that tests use (protocol examples, schemas, WfFormat
# traces), so that a clone runs its tests wherever it lives.
SHARED = REPO / "tests" / "data" / "shared"
WORKFLOWS = REPO / "examples" / "workflows"


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.02,
             what: str = "condition") -> object:
    """Poll ``predicate`` until truthy, failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:  # reaped between the two looks
        return False


@pytest.fixture
def repo_root() -> Path:
    return REPO
