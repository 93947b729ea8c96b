"""Capturing a unit's stdout and stderr through pipes, keeping only their last bytes.

The executing thread reads the pipes itself while the process runs (no thread per unit, no
temporary file: a task printing gigabytes costs ``TAIL_BYTES`` of memory per stream and no
disk). The process's exit is watched through a pidfd, so a background process the task
left behind holding the pipes open does not keep the unit from ending.
"""
from __future__ import annotations

import os
import select
import subprocess
import time

from troy.unit import OutputTail

TAIL_BYTES = 64 * 1024
_CHUNK = 65536
_DRAIN_CHUNKS = 256  # at most this many reads per pipe once the process has exited


class Tail:
    """The last ``TAIL_BYTES`` written to a stream, and how much was written in all."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.size = 0

    def add(self, data: bytes) -> None:
        self.size += len(data)
        self.buf += data
        if len(self.buf) > 2 * TAIL_BYTES:  # trim now and then, not on every chunk
            del self.buf[:-TAIL_BYTES]

    def result(self) -> OutputTail | None:
        if self.size == 0:
            return None
        return OutputTail(data=bytes(self.buf[-TAIL_BYTES:]), size=self.size)


def _pidfd(proc: subprocess.Popen) -> int | None:
    try:
        return os.pidfd_open(proc.pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):  # not Linux >= 5.3: proc.poll() every 50 ms instead
        return None


def pump(proc: subprocess.Popen, pipes: dict[int, Tail], deadline: float | None) -> bool:
    """Read ``pipes`` (fd -> Tail) until the process has exited and they are drained, or
    ``deadline`` (monotonic) passes; returns whether it passed. Closes the pipes' fds."""
    poller = select.poll()  # plain poll: this runs once per task, cheap matters
    open_fds = set(pipes)
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    pidfd = _pidfd(proc)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    try:
        while open_fds:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return True
            if pidfd is None:
                wait = 0.05 if wait is None else min(wait, 0.05)
            exited = False
            for fd, _ in poller.poll(None if wait is None else wait * 1000):
                if fd == pidfd:
                    exited = True
                    continue
                data = os.read(fd, _CHUNK)
                if data:
                    pipes[fd].add(data)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
            if exited or (pidfd is None and proc.poll() is not None):
                _drain(open_fds, pipes)  # what is left; a background writer is ignored
                return False
        return False
    finally:
        for fd in pipes:
            os.close(fd)
        if pidfd is not None:
            os.close(pidfd)


def _drain(open_fds: set[int], pipes: dict[int, Tail]) -> None:
    for fd in open_fds:
        os.set_blocking(fd, False)
        try:
            for _ in range(_DRAIN_CHUNKS):  # bounded: a background writer may go on
                data = os.read(fd, _CHUNK)
                if not data:
                    break
                pipes[fd].add(data)
        except BlockingIOError:
            pass
