"""Shared fixtures and helpers for the whole suite."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from elasticslice.emulator.daemon import process_alive  # noqa: F401 - tests import it here

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




@pytest.fixture
def repo_root() -> Path:
    return REPO
