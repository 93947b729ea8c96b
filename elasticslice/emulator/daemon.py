"""The emulator in the background: ``serve --background`` starts it, ``emulator stop`` ends it.

The running server of a directory D is the process holding ``D/serve.lock`` (an flock the
server takes at start and the kernel drops when it ends): ``/proc/locks`` names its pid, so
a pid left in ``D/server.json`` by an emulator that was killed, and perhaps since given to
another program, is never mistaken for it (nor signalled).

``start_background`` runs ``elasticslice emulator serve ... --log-file F`` in a session of
its own (no terminal; stdin /dev/null; stdout and stderr appended to F too) and returns once
it serves, that is once ``D/server.json`` names its pid; if it ends first, its last line
says why. ``stop_emulator`` sends SIGTERM and waits for the lock to be given up.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from elasticslice.errors import ElasticSliceError

LOCK = "serve.lock"
INFO = "server.json"
DEFAULT_LOG = "serve.log"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
# what `serve --background` must not pass on to the server it starts (it would start another)
BACKGROUND_VARIABLES = ("ELASTICSLICE_EMULATOR_SERVE_BACKGROUND",)


class NotRunning(ElasticSliceError):
    """No emulator serves the directory."""


@dataclass(frozen=True)
class Running:
    """The server of a directory: its pid and URL (None while it is still starting)."""

    pid: int
    url: str | None


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, exited but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _server_info(directory: Path) -> dict:
    try:
        info = json.loads((directory / INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def lock_is_held(path: Path) -> bool:
    """Probe the lock (taken and dropped at once when free)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases it if we took it
    return False


def lock_holder(directory: Path) -> int | None:
    """The pid holding ``D/serve.lock``, None when nobody does."""
    path = directory / LOCK
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        return None
    try:
        locks = Path("/proc/locks").read_text(encoding="ascii", errors="replace")
    except OSError:
        locks = ""
    for line in locks.splitlines():
        # "3: FLOCK  ADVISORY  WRITE 4884 fe:00:2236507 0 EOF" (waiters have "->" after "3:")
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
            return int(parts[4])
    if not lock_is_held(path):
        return None
    # held, but /proc/locks does not show it (another view of the file system): believe
    # server.json only when its pid is a live emulator server
    pid = _server_info(directory).get("pid")
    if isinstance(pid, int) and process_alive(pid) and _is_emulator(pid):
        return pid
    raise ElasticSliceError(f"{directory}: {LOCK} is held, but not by the pid in {INFO}; "
                            "is an emulator still starting there?")


def _is_emulator(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"emulator" in argv and b"serve" in argv


def find_running(directory: Path) -> Running | None:
    """The emulator serving ``directory``, or None."""
    pid = lock_holder(directory)
    if pid is None:
        return None
    info = _server_info(directory)
    return Running(pid, info.get("url") if info.get("pid") == pid else None)


def stop_emulator(directory: Path, timeout: float = STOP_TIMEOUT) -> Running:
    """SIGTERM to the emulator serving ``directory``; returns once it has stopped.

    ``NotRunning`` when none serves it (a stale ``server.json`` is removed);
    ``ElasticSliceError`` when it is still running after ``timeout`` seconds."""
    running = find_running(directory)
    if running is None:
        stale = _server_info(directory).get("pid")
        (directory / INFO).unlink(missing_ok=True)
        note = (f" (removed a stale {INFO}: its pid {stale} is gone or another program's)"
                if stale else "")
        raise NotRunning(f"no emulator is running in {directory}{note}")
    try:
        os.kill(running.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while lock_holder(directory) == running.pid or process_alive(running.pid):
        if time.monotonic() > deadline:
            raise ElasticSliceError(f"emulator {running.pid} did not stop within {timeout:g} s "
                                    f"(`kill -9 {running.pid}` ends it)")
        time.sleep(0.05)
    return running


def start_background(directory: Path, serve_args: list[str], log_file: Path,
                     timeout: float = START_TIMEOUT) -> Running:
    """Start ``elasticslice [serve_args]`` (an ``emulator serve`` command line with absolute
    paths) detached, logging to ``log_file``; returns once it serves ``directory``."""
    running = find_running(directory)
    if running is not None:
        raise ElasticSliceError(f"{directory}: an emulator is already serving this directory "
                                f"(pid {running.pid}, {running.url or 'starting'}); stop it "
                                f"first: elasticslice emulator stop --dir {directory}")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    offset = os.fstat(fd).st_size
    env = {k: v for k, v in os.environ.items() if k not in BACKGROUND_VARIABLES}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "elasticslice.cli", *serve_args],
                                stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd="/",
                                env=env, start_new_session=True)
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while True:
        info = _server_info(directory)
        if info.get("pid") == proc.pid:
            return Running(proc.pid, info.get("url"))
        if proc.poll() is not None:
            raise ElasticSliceError(f"the emulator did not start: {_last_line(log_file, offset)}"
                                    f" (log: {log_file})")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            raise ElasticSliceError(f"the emulator did not serve within {timeout:g} s "
                                    f"(log: {log_file})")
        time.sleep(0.05)


def _last_line(log_file: Path, offset: int) -> str:
    """The last non-empty line the server wrote (its one-line error), without click's
    "Error: " prefix."""
    try:
        with open(log_file, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return "it ended at once"
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    last = lines[-1] if lines else "it ended at once"
    return last.removeprefix("Error: ")
