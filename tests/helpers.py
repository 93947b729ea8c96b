"""Plain helpers for the whole suite (paths, waiting). Fixtures live in ``conftest.py`` files;
helpers that test modules share live in ``helpers.py`` modules like this one, never in a test
module or a conftest another module imports."""
from __future__ import annotations

import os
import random
import socket
import tarfile
import time
from collections.abc import Callable, Collection
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


def processes_of(marker: str, sessions: Collection[int] = ()) -> dict[int, str]:
    """The live processes of this machine (zombies left out) whose command line holds
    ``marker``, or that belong to one of ``sessions`` (a unit runs in a session of its own:
    what it started is there even without the marker): pid -> command line, read from
    ``/proc``."""
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) < 4 or fields[0] in ("Z", "X"):
            continue
        if marker.encode() in cmd or int(fields[3]) in sessions:
            found[int(entry.name)] = cmd.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def holds_for(check: Callable[[], object], seconds: float, interval: float = 0.1) -> None:
    """Call ``check`` (which asserts) every ``interval`` for ``seconds``: a thing that must
    NOT happen (a stranger joining, a node going) is watched for a while, not waited for."""
    deadline = time.monotonic() + seconds
    while True:
        check()
        if time.monotonic() > deadline:
            return
        time.sleep(interval)


def spare_port() -> int:
    """A port on 127.0.0.1 that nothing listens on and no other test will take: below the
    kernel's ephemeral range (every server of the suite binds port 0, which the kernel picks
    from that range), in a slice of its own for each pytest-xdist worker. For a test that
    makes something listen on a given port, or that needs a port where nothing listens (a
    port 0 bind released again is free for the next test's server to take)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    low = 10000
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    slot = int(worker[2:]) % 16 if worker[2:].isdigit() else 0
    width = max(1, (ephemeral - low) // 16)
    ports = list(range(low + slot * width, low + (slot + 1) * width))
    random.shuffle(ports)
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no spare port below the ephemeral range")


def scrape_metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A Prometheus endpoint read as a scraper reads it: (sample name, sorted labels) ->
    value (``prometheus_client.parser``)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def untar(tar: tarfile.TarFile, path: Path) -> None:
    """``tar.extractall(path)`` with tarfile's "data" filter where this Python has it
    (PEP 706: CPython 3.10.12, 3.11.4 and later; not Debian 12's 3.11.2)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(path, filter="data")
    else:
        tar.extractall(path)
