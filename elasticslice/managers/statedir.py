"""One process per state directory: ``<state_dir>/manage.lock``.

Two managers of one state directory would both add nodes (and both answer for them), so the
manager daemon (``elasticslice manage``), an ``ElasticCluster`` and ``elasticslice run``
take this lock before they touch the state:

    lock = StateDirLock(state_dir).acquire()    # ElasticSliceError naming the holder
    ...
    lock.release()                              # or the process ends: the lock goes with it

The lock is an ``flock`` on the file, which holds the holder's pid for the error message;
it is never removed (a stale file holds no lock).
"""
from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)


class StateDirLock:
    """The lock of one state directory (made 0700 if missing). ``acquire`` never waits:
    another holder is an ``ElasticSliceError`` naming its pid."""

    FILE = "manage.lock"

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)
        self._fd: int | None = None

    def __repr__(self) -> str:
        return f"<StateDirLock {self.state_dir} {'held' if self.held else 'free'}>"

    @property
    def path(self) -> Path:
        return self.state_dir / self.FILE

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> StateDirLock:
        """Take the lock (idempotent); returns ``self``."""
        if self._fd is not None:
            return self
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise ElasticSliceError(f"{self.state_dir}: cannot use the state directory: "
                                    f"{err.strerror or err}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ElasticSliceError(f"{self.state_dir}: another manager (pid {holder}) is "
                                    f"running on this state directory; stop it first") from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the lock go (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)   # closing the descriptor drops the flock

    def __enter__(self) -> StateDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def make_state_dir(path: Path, whose: str = "the cluster's") -> Path:
    """``path`` made (0700) if missing; one line naming it when it cannot be."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise ElasticSliceError(f"{path}: cannot use it as {whose} state directory: "
                                f"{err.strerror or err}") from err
    return path


def lock_state_dir(state_dir: str | os.PathLike[str]) -> StateDirLock:
    """Take ``state_dir``'s lock for as long as the process lives (or until released)."""
    return StateDirLock(state_dir).acquire()
