"""Helpers for the demo tests (tests/test_demo.py, tests/test_demo_static.py): the demo as a
real subprocess read line by line, what it left running, the emulator it used."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from tests.helpers import REPO

DEMO = REPO / "bin" / "demo"
ELASTICSLICE = Path(sys.executable).parent / "elasticslice"


class DemoRun:
    """``bin/demo`` in its own session, its stdout read line by line as it comes."""

    def __init__(self, *args: str, cwd: Path, command: list[str] | None = None) -> None:
        self.proc = subprocess.Popen([*(command or [sys.executable, str(DEMO)]), *args],
                                     cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        """Exit code, stdout, stderr (stdout is drained by the reader thread alone)."""
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        return self.proc.returncode, "\n".join(self.lines), err


def _run_processes(session_id: int, directory: Path) -> list[Path]:
    """/proc entries of the demo's live processes: its session's, or running with one of
    its node sandboxes (node startup commands get a session of their own)."""
    mark = f"ELASTICSLICE_NODE_DIR={directory}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z" and (int(fields[3]) == session_id
                                     or mark in (entry / "environ").read_bytes()):
                found.append(entry)
        except (OSError, ValueError, IndexError):
            continue
    return found


def leftovers(session_id: int, directory: Path) -> list[str]:
    """Command lines of the demo's live processes (see ``_run_processes``)."""
    found = []
    for entry in _run_processes(session_id, directory):
        try:
            found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def _listeners(port: int) -> set[str]:
    """Socket inodes listening on ``port`` on this machine (IPv4 and IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def run_listens_on(port: int, session_id: int, directory: Path) -> bool:
    """Whether a process the demo left still listens on ``port``. Another test's server
    may be given the same port once the demo has let it go, so an open port alone proves
    nothing (a CI run failed so)."""
    inodes = {f"socket:[{inode}]" for inode in _listeners(port)}
    if not inodes:
        return False
    for entry in _run_processes(session_id, directory):
        try:
            if any(str(fd.readlink()) in inodes for fd in (entry / "fd").iterdir()):
                return True
        except OSError:
            continue
    return False


def emulator_port(report: dict) -> int:
    url = report.get("url") or report["emulator_url"]
    return int(url.split(":")[2].split("/")[0])
