"""What the manager daemons of the split by trust share (the pilots' and Dask's,
:mod:`elasticslice.pilots.daemon`; Parsl's, :mod:`elasticslice.parsl.daemon`), and what the
workload's process reads of the daemon serving its state directory."""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def lock_pid(state_dir: Path) -> int | None:
    """The pid of the daemon holding ``state_dir``'s lock, as the lock file says (None: none
    known)."""
    from elasticslice.managers.statedir import StateDirLock
    try:
        text = (Path(state_dir) / "state" / StateDirLock.FILE).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def open_view(state_dir: Path) -> Any:
    """The daemon's state as the workload's process reads it (a read-only
    :class:`~elasticslice.pilots.snapshot.StateView`; None: no state yet)."""
    from elasticslice.managers.records import StateError
    from elasticslice.managers.state import ManagerState
    from elasticslice.pilots.snapshot import StateView
    try:
        return StateView(ManagerState.read_only(Path(state_dir) / "state"))
    except StateError:
        return None


class Orphaned:
    """How long a daemon has been without its workload: :meth:`expired` says when it has
    been alone longer than ``timeout`` seconds (each change said once in the log)."""

    def __init__(self, timeout: float, who: str) -> None:
        self.timeout, self.who = timeout, who
        self._since: float | None = time.monotonic()

    def expired(self, attached: bool) -> bool:
        if attached:
            self._since = None
        elif self._since is None:
            self._since = time.monotonic()
            log.warning("no %s attached: the nodes are kept %g s for one to come back",
                        self.who, self.timeout)
        elif time.monotonic() - self._since > self.timeout:
            log.warning("no %s attached for %g s: stopping, the nodes kept (the same %s "
                        "resumes on them)", self.who, self.timeout, self.who)
            return True
        return False


def cannot_start(server: Any, err: Exception) -> str:
    """The manager cannot start: its one line, told to the attached workload (which stops:
    another daemon would fail the same way) and logged; the line."""
    from elasticslice.managers.cycle import one_line
    line = f"the manager cannot start: {one_line(err)}"
    log.exception("%s", line)
    workload = server.workload
    if workload is not None:
        workload.refuse(line)
    return line


def log_to(path: Path, debug: bool) -> None:
    """From now on: the log in ``path``, stdout and stderr too (nobody reads the pipe)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)


def serve(daemon: Any, log_file: Path, *, debug: bool = False, name: str) -> int:
    """A started daemon's life: SIGTERM stops it (the nodes kept), SIGINT is the workload's
    to say; ``ready`` on stdout for the process that started it, then the log in
    ``log_file`` while it serves; its exit status."""
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the workload tells it when to stop
    print("ready", flush=True)
    log_to(log_file, debug)
    log.info("%s %d serving %s", name, os.getpid(), daemon.state_dir)
    try:
        daemon.serve()
    finally:
        daemon.server.close()
    return 1 if daemon.failed else 0
