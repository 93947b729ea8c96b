"""Plain helpers for the whole suite (paths, waiting). Fixtures live in ``conftest.py`` files;
helpers that test modules share live in ``helpers.py`` modules like this one, never in a test
module or a conftest another module imports."""
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


def holds_for(check: Callable[[], object], seconds: float, interval: float = 0.1) -> None:
    """Call ``check`` (which asserts) every ``interval`` for ``seconds``: a thing that must
    NOT happen (a stranger joining, a node going) is watched for a while, not waited for."""
    deadline = time.monotonic() + seconds
    while True:
        check()
        if time.monotonic() > deadline:
            return
        time.sleep(interval)
