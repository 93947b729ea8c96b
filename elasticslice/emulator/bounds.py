"""What the emulator's listener takes on at once: connections, requests, body bytes.

``Limits`` holds the numbers. ``Admission`` (one per lane) lets a request in when a slot
and its body's bytes fit in the lane's budget (first come, first served; after
``queue_timeout`` the caller answers 503). ``Body`` reads a request body in chunks on demand, so nothing holds a
whole body unless it asks for one, and a body that trickles in slower than ``MIN_RATE`` is
cut off. ``peek_method`` reads the XML-RPC method name from the first bytes of a body, so
the size limit of a call is known before the rest of it is read.
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import io
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

MIB = 1024 * 1024
PEEK = 4096
CHUNK = 256 * 1024
MIN_RATE = 256 * 1024  # bytes/s a body must average, after a grace of ``grace`` seconds

_METHOD = re.compile(rb"<methodName>\s*([^<\s]{1,128})\s*</methodName>")


@dataclass(frozen=True)
class Limits:
    """Bounds of one listener (the defaults keep an emulator under a few hundred MB).

    Requests go through one of two lanes by Content-Length: up to ``small_body`` the small
    lane (``max_requests`` at once, ``small_budget`` body bytes together), above it the large
    lane (``max_large`` at once, ``large_budget`` bytes together), so ordinary calls never
    queue behind a 60 MB CreateSliver.
    """

    max_connections: int = 512      # connection threads; more connections are closed at once
    max_requests: int = 16
    small_budget: int = 16 * MIB
    max_large: int = 2
    large_budget: int = 32 * MIB
    queue_timeout: float = 30.0     # how long a request waits to be let in before HTTP 503
    small_body: int = 8 * MIB       # every call but the large ones
    large_body: int = 32 * MIB      # the calls in ``large_methods`` (~200,000 RSpec nodes)
    large_methods: frozenset[str] = field(default_factory=lambda: frozenset({"CreateSliver"}))

    def body_limit(self, method: str | None) -> int:
        """The largest body a call of ``method`` may send (None: the method is not known)."""
        return self.large_body if method in self.large_methods else self.small_body


def peek_method(head: bytes) -> str | None:
    """The ``methodName`` of an XML-RPC call from its first bytes (None when not there)."""
    match = _METHOD.search(head[:PEEK])
    return match.group(1).decode("ascii", "replace") if match else None


def read_head(stream: BinaryIO, length: int) -> bytes:
    """The first bytes of a body, up to its method name (at most ``PEEK`` bytes): reads only
    what the peer has sent, so a refusal can come before the rest of the body is sent."""
    want = min(length, PEEK)
    head = b""
    read1 = getattr(stream, "read1", stream.read)
    while len(head) < want and b"</methodName>" not in head:
        data = read1(want - len(head))
        if not data:
            break
        head += data
    return head


class Admission:
    """Request slots and a byte budget, handed out in arrival order."""

    def __init__(self, slots: int, budget: int) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self._slots = slots
        self._budget = budget
        self.refused = 0
        self.admitted = 0
        self.peak_bytes = 0
        self._total = budget

    def acquire(self, nbytes: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for a slot and ``nbytes`` of budget; False: refused."""
        ticket = object()
        deadline = time.monotonic() + timeout
        with self._cond:
            self._queue.append(ticket)
            try:
                while not (self._queue[0] is ticket and self._slots > 0
                           and self._budget >= nbytes):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.refused += 1
                        return False
                    self._cond.wait(left)
                self._slots -= 1
                self._budget -= nbytes
                self.admitted += 1
                self.peak_bytes = max(self.peak_bytes, self._total - self._budget)
                return True
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._slots += 1
            self._budget += nbytes
            self._cond.notify_all()


class BodyError(OSError):
    """A request body could not be read: the peer went away, or it came too slowly."""


class Body:
    """A request body of ``length`` bytes, read in chunks on demand (``head`` already read).

    ``method`` is the method name peeked from the head (the size limit was chosen by it).
    """

    def __init__(self, stream: BinaryIO, length: int, head: bytes = b"",
                 method: str | None = None, grace: float = 60.0) -> None:
        self.length = length
        self.method = method
        self._stream = stream
        self._head = head
        self._left = length - len(head)
        self._deadline = time.monotonic() + grace + length / MIN_RATE

    @classmethod
    def of(cls, data: bytes) -> Body:
        """A body already in memory (tests, tools)."""
        head = data[:PEEK]
        return cls(io.BytesIO(data[len(head):]), len(data), head, peek_method(head))

    @property
    def remaining(self) -> int:
        """Bytes not read yet."""
        return self._left + len(self._head)

    def chunks(self) -> Iterator[bytes]:
        """The body, chunk by chunk (each chunk is handed out once)."""
        if self._head:
            head, self._head = self._head, b""
            yield head
        while self._left > 0:
            if time.monotonic() > self._deadline:
                raise BodyError(f"request body too slow ({self._left} of {self.length} "
                                "bytes still missing)")
            read1 = getattr(self._stream, "read1", self._stream.read)
            data = read1(min(CHUNK, self._left))
            if not data:
                raise BodyError(f"request body ended {self._left} bytes early")
            self._left -= len(data)
            yield data

    def read(self) -> bytes:
        """The rest of the body in one piece."""
        return b"".join(self.chunks())

    def drain(self, seconds: float | None = None) -> bool:
        """Read and drop the rest (within ``seconds`` when given); False when that failed
        or took too long (the connection must close then)."""
        if seconds is not None:
            self._deadline = min(self._deadline, time.monotonic() + seconds)
        try:
            for _ in self.chunks():
                pass
        except (OSError, ValueError):
            return False
        return True


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def tune_malloc() -> None:
    """Blocks of 1 MiB and more get their own mappings, returned to the system when freed
    (glibc otherwise raises that threshold as large blocks come and go, up to 32 MiB, and
    a 31 MiB string then stays in the heap of the thread that parsed it)."""
    if _LIBC is not None:
        _LIBC.mallopt(M_MMAP_THRESHOLD, MIB)


def trim_memory() -> None:
    """Give memory freed by a large request back to the system (glibc keeps freed memory of
    each thread's arena otherwise: 20 threads that each parsed 60 MB kept ~900 MB)."""
    gc.collect()  # cyclic garbage (tracebacks, frames) can still hold a large call's params
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
