"""Listeners strangers cannot starve: a connection cap, per-connection deadlines, a lane for
trusted peers, and counts instead of a log line per stranger.

A :class:`GuardedServer` (a ``socketserver.TCPServer``) gives no thread to a connection
before its whole request has arrived. One thread (:meth:`~GuardedServer.serve_forever`)
accepts, runs the TLS handshakes and reads the requests, all non-blocking, from a selector;
only a complete request (its head and its ``Content-Length`` body) goes to one of a few
worker threads, which answer it with the server's ``RequestHandlerClass`` (an http.server
handler that reads the request from memory: :class:`BufferedRequestHandler`) and close the
connection. So:

- an idle connection, or one trickling its bytes, costs a socket and a buffer, never a
  thread, and is closed at its deadline: the TLS handshake within ``handshake_deadline``
  of the accept, the whole request within ``request_deadline`` (slow-loris; a trusted
  peer's within ``response_deadline``: 8 MiB from the CM may cross a slow link);
- at most ``max_connections`` are open; a new connection to a full table evicts the oldest
  that has sent nothing, else the oldest unfinished one of an untrusted peer with nothing
  to read now (a trickler between its bytes), else the oldest unfinished one (whose bytes
  wait to be read: a request behind a burst of accepts). Without TLS, a connection
  younger than ``fresh`` seconds that has sent nothing goes after the tricklers: a
  client's request may be a moment behind its connect (a metrics scrape was evicted so,
  under a flood of partial heads); over TLS a client mid-handshake looks like a trickler,
  and the silent go first. A trusted
  peer's connection (``trusted(sock)`` after the handshake: the CM's certificate) and a
  complete request are never evicted; when nothing may be, the newcomer is closed;
- trusted peers' requests are answered first, and ``reserved`` workers answer only them;
- a worker's connection is shut at ``response_deadline`` (a peer reading the answer a byte at
  a time; a handler may :meth:`~GuardedServer.extend` it for a big file), each read and write
  bounded by ``io_timeout``;
- what strangers did is counted (:class:`~elasticslice.tally.Tally`) and logged as one
  line at most every ``log_interval`` seconds; no line per stranger.
"""
from __future__ import annotations

import collections
import enum
import http.server
import io
import logging
import math
import re
import resource
import selectors
import socket
import socketserver
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from elasticslice.tally import Tally

log = logging.getLogger(__name__)

HEAD_END = re.compile(rb"\r?\n\r?\n")
LENGTH = re.compile(rb"^content-length[ \t]*:[ \t]*([^\r\n]*)", re.I | re.M)
CHUNK = 1 << 16


def default_cap(share: int = 8, ceiling: int = 256) -> int:
    """A connection cap that leaves this process room: ``1/share`` of its open-file limit,
    at most ``ceiling``, at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return ceiling
    return max(16, min(ceiling, soft // share))


@dataclass(frozen=True)
class Limits:
    """What one listener allows (seconds, bytes, counts); see the module docstring."""

    max_connections: int = field(default_factory=default_cap)
    handshake_deadline: float = 5.0
    request_deadline: float = 10.0
    response_deadline: float = 60.0
    io_timeout: float = 10.0
    workers: int = 4
    reserved: int = 0          # of the workers, answering trusted peers only
    max_head: int = 16 << 10   # request line and headers
    max_body: int = 64 << 10   # a body waited for (larger: handed on at its head, refused)
    stranger_body: int | None = None  # the same for untrusted peers (None: max_body)
    log_interval: float = 60.0
    fresh: float = 1.0         # a connection this young is evicted for silence last

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.workers < 1 \
                or not 0 <= self.reserved < self.workers:
            raise ValueError(f"limits: need max_connections >= 1, workers >= 1 and "
                             f"0 <= reserved < workers, not {self}")
        for name in ("handshake_deadline", "request_deadline", "response_deadline",
                     "io_timeout", "log_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"limits: {name} must be > 0 seconds")
        if not self.fresh >= 0:
            raise ValueError("limits: fresh must be >= 0 seconds")


class Phase(enum.Enum):
    HANDSHAKE = "handshake"
    READING = "reading"
    QUEUED = "queued"
    SERVING = "serving"


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    address: Any
    accepted: float
    deadline: float
    phase: Phase
    heard: bool = False        # has the peer sent anything yet
    trusted: bool = False
    buf: bytearray = field(default_factory=bytearray)
    scanned: int = 0           # bytes of buf searched for the end of the head
    need: int | None = None    # bytes of the whole request, once its head is read
    events: int = 0            # what the selector waits for


class BufferedRequestHandler(http.server.BaseHTTPRequestHandler):
    """An http.server handler reading the request the server already read (never the
    socket: it cannot wait for a peer), answering once, then closed."""

    server: GuardedServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO(self.server.request_bytes(self.request))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # strangers get no log line each; subclasses log what they must


def buffered(handler: type[http.server.BaseHTTPRequestHandler]
             ) -> type[BufferedRequestHandler]:
    """``handler`` reading the request the server read (its own methods first)."""
    return type(handler.__name__, (handler, BufferedRequestHandler),
                {"__module__": handler.__module__})


class GuardedServer(socketserver.TCPServer):
    """A ``TCPServer`` serving as the module docstring says. ``limits``; ``tls``: an
    ``ssl.SSLContext`` for the server side (None: plain TCP); ``name``: for its log
    lines and threads. Override :meth:`trusted` to give a peer the reserved lane."""

    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], handler: type, *, limits: Limits,
                 tls: ssl.SSLContext | None = None, name: str = "listener") -> None:
        self.limits = limits
        self.tls = tls
        self.name = name
        self.tally = Tally(name, limits.log_interval, logger=log)
        self._conns: dict[socket.socket, _Conn] = {}
        self._lock = threading.Lock()   # the table and the lanes
        self._ready = threading.Condition(self._lock)
        self._lanes: tuple[collections.deque[_Conn], collections.deque[_Conn]] = (
            collections.deque(), collections.deque())   # trusted, others
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._workers: list[threading.Thread] = []
        self._next_check = 0.0
        self._paused = 0.0   # accepting again at (after a failed accept)
        super().__init__(address, handler)

    # -- what a subclass may change ------------------------------------------------------
    def trusted(self, sock: socket.socket) -> bool:
        """Whether the peer of ``sock`` (after its TLS handshake) gets the reserved lane."""
        return False

    # -- the table -----------------------------------------------------------------------
    def open_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def request_bytes(self, sock: socket.socket) -> bytes:
        """The request read for ``sock`` (a handler's input)."""
        with self._lock:
            conn = self._conns.get(sock)
            return bytes(conn.buf) if conn is not None else b""

    def extend(self, sock: socket.socket, seconds: float) -> None:
        """Give the answer on ``sock`` ``seconds`` more (a big file)."""
        with self._lock:
            conn = self._conns.get(sock)
            if conn is not None:
                conn.deadline = max(conn.deadline, time.monotonic() + seconds)

    # -- the loop ------------------------------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.2) -> None:
        """Serve until :meth:`shutdown` (once: a server shut down stays so)."""
        if self._stop.is_set():
            return
        self._stopped.clear()
        self.socket.setblocking(False)
        sel = selectors.DefaultSelector()
        self._sel = sel
        sel.register(self.socket, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        limits = self.limits
        self._workers = [threading.Thread(target=self._work, args=(i < limits.reserved,),
                                          name=f"{self.name}-{i}", daemon=True)
                         for i in range(limits.workers)]
        for worker in self._workers:
            worker.start()
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(min(poll_interval, 0.1) if self._paused
                                         else poll_interval):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        _drain(self._wake_r)
                    else:
                        self._ready_io(key.data)
                if self._paused and time.monotonic() >= self._paused:
                    self._paused = 0.0
                    sel.register(self.socket, selectors.EVENT_READ, None)
                self._expire()
                self.tally.flush()
        finally:
            self._close_all()
            sel.close()
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        for sock in (self._wake_r, self._wake_w):
            _close(sock)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _accept(self) -> None:
        # a few at a time, then the others' turn: a burst evicts no one whose bytes wait
        for _ in range(max(1, min(64, self.limits.max_connections // 8))):
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:   # EMFILE and the like: counted, never a busy loop
                self.tally.count(f"failed accepts ({err.strerror or err})")
                self._sel.unregister(self.socket)
                self._paused = time.monotonic() + 0.1
                return
            self._admit(sock, address)

    def _admit(self, sock: socket.socket, address: Any) -> None:
        now = time.monotonic()
        with self._lock:
            full = len(self._conns) >= self.limits.max_connections
            victim = self._victim() if full else None
        if full and victim is None:
            self.tally.count("connections refused (every slot the CM's or a whole request)")
            _close(sock)
            return
        if victim is not None:
            self.tally.count("idle connections evicted (all slots taken)" if not victim.heard
                             else "unfinished connections evicted (all slots taken)")
            self._drop(victim)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            _close(sock)
            return
        phase = Phase.HANDSHAKE if self.tls is not None else Phase.READING
        first = self.limits.handshake_deadline if self.tls is not None \
            else self.limits.request_deadline
        conn = _Conn(sock, address, now, now + first, phase)
        with self._lock:
            self._conns[sock] = conn
        self._watch(conn, selectors.EVENT_READ)

    def _victim(self) -> _Conn | None:
        """The connection a newcomer replaces (called with the lock held): the oldest that
        has sent nothing (without TLS: for :attr:`Limits.fresh` seconds), else the oldest
        unfinished one with nothing to read now (a trickler between its bytes), else
        (without TLS) the oldest that has sent nothing yet (a scraper's request a moment
        behind its connect, under a flood of partial heads, was evicted first), else the
        oldest unfinished one. A request whose bytes wait behind a burst of accepts (a
        scraper's, under a flood) goes last."""
        unfinished, fresh = [], []
        # over TLS a client mid-handshake is heard with nothing to read (waiting for us):
        # there the silent go first whatever their age, as the flood's idle ones are
        young = time.monotonic() - self.limits.fresh if self.tls is None else math.inf
        for conn in self._conns.values():   # in the order they were accepted
            if conn.trusted or conn.phase not in (Phase.HANDSHAKE, Phase.READING):
                continue
            if not conn.heard and not _waiting(conn.sock):
                if conn.accepted <= young:
                    return conn
                fresh.append(conn)
                continue
            conn.heard = True   # its bytes may wait behind this batch of accepts
            unfinished.append(conn)
        for conn in unfinished:
            if not _waiting(conn.sock):
                return conn
        return (fresh or unfinished or [None])[0]

    def _watch(self, conn: _Conn, events: int) -> None:
        if conn.events == events:
            return
        try:
            if conn.events:
                self._sel.modify(conn.sock, events, conn)
            else:
                self._sel.register(conn.sock, events, conn)
            conn.events = events
        except (OSError, ValueError, KeyError):
            self._drop(conn)

    def _unwatch(self, conn: _Conn) -> None:
        if conn.events:
            try:
                self._sel.unregister(conn.sock)
            except (OSError, ValueError, KeyError):
                pass
            conn.events = 0

    def _ready_io(self, conn: _Conn) -> None:
        conn.heard = True
        if conn.phase is Phase.HANDSHAKE:
            self._handshake(conn)
        elif conn.phase is Phase.READING:
            self._read(conn)

    def _handshake(self, conn: _Conn) -> None:
        if not isinstance(conn.sock, ssl.SSLSocket):   # TLS for a peer that speaks only
            assert self.tls is not None
            self._unwatch(conn)
            with self._lock:
                self._conns.pop(conn.sock, None)
                try:
                    conn.sock = self.tls.wrap_socket(conn.sock, server_side=True,
                                                     do_handshake_on_connect=False)
                except OSError:
                    _close(conn.sock)
                    return
                self._conns[conn.sock] = conn
        sock = conn.sock
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError):
            self.tally.count("failed TLS handshakes")
            self._drop(conn)
            return
        try:
            conn.trusted = self.trusted(sock)
        except Exception:  # noqa: BLE001 - a failing check trusts nobody
            log.exception("%s: cannot tell whether a peer is trusted", self.name)
        conn.phase = Phase.READING
        conn.deadline = conn.accepted + (self.limits.response_deadline if conn.trusted
                                         else self.limits.request_deadline)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        limits = self.limits
        while True:
            try:
                data = conn.sock.recv(CHUNK)
            except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                break
            except ssl.SSLWantWriteError:
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except (ssl.SSLError, OSError):
                data = b""
            if not data:
                self.tally.count("connections closed before their request was whole")
                self._drop(conn)
                return
            conn.buf += data
            if self._whole(conn):
                self._queue(conn)
                return
            if len(conn.buf) > limits.max_head + limits.max_body:
                break
        if conn.need is None and len(conn.buf) > limits.max_head:
            self.tally.count("requests with a head over the limit")
            self._drop(conn)
            return
        self._watch(conn, selectors.EVENT_READ)

    def _whole(self, conn: _Conn) -> bool:
        """Whether ``conn`` holds all of its request the handler will read: its head, and
        its body if its Content-Length is one this peer may send (else the handler refuses
        it at the head)."""
        if conn.need is None:
            end = HEAD_END.search(conn.buf, max(0, conn.scanned - 3))
            conn.scanned = len(conn.buf)
            if end is None:
                return False
            found = LENGTH.search(bytes(conn.buf[:end.start()]))
            try:
                length = int(found.group(1).strip()) if found else 0
            except ValueError:
                return True
            limit = self.limits.max_body if conn.trusted or self.limits.stranger_body is None \
                else self.limits.stranger_body
            if length < 0 or length > limit:
                return True
            conn.need = end.end() + length
        return len(conn.buf) >= conn.need

    def _queue(self, conn: _Conn) -> None:
        self._unwatch(conn)
        with self._ready:
            conn.phase = Phase.QUEUED
            self._lanes[0 if conn.trusted else 1].append(conn)
            self._ready.notify_all()

    def _expire(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        late: list[_Conn] = []
        soonest = now + 1.0
        with self._lock:
            for conn in self._conns.values():
                if conn.deadline <= now:
                    late.append(conn)
                else:
                    soonest = min(soonest, conn.deadline)
        self._next_check = soonest
        for conn in late:
            if conn.phase is Phase.SERVING:
                self.tally.count("answers cut at their deadline")
                _shut(conn.sock)   # its worker closes it
                conn.deadline = float("inf")
            elif conn.phase is not Phase.QUEUED:
                self.tally.count("handshakes over their deadline" if conn.phase is
                                 Phase.HANDSHAKE else "requests over their deadline")
                self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._unwatch(conn)
        with self._lock:
            self._conns.pop(conn.sock, None)
        _close(conn.sock)

    def _close_all(self) -> None:
        with self._ready:
            conns = list(self._conns.values())
            for lane in self._lanes:
                lane.clear()
            self._ready.notify_all()
        for conn in conns:
            if conn.phase is Phase.SERVING:
                _shut(conn.sock)
            else:
                self._drop(conn)
        for worker in self._workers:
            worker.join(timeout=5)
        self._workers = []
        self.tally.flush(force=True)

    # -- the workers ---------------------------------------------------------------------
    def _take(self, reserved: bool) -> _Conn | None:
        with self._ready:
            while not self._stop.is_set():
                for lane in self._lanes[:1] if reserved else self._lanes:
                    if lane:
                        conn = lane.popleft()
                        conn.phase = Phase.SERVING
                        conn.deadline = time.monotonic() + self.limits.response_deadline
                        return conn
                self._ready.wait(0.5)
        return None

    def _work(self, reserved: bool) -> None:
        while (conn := self._take(reserved)) is not None:
            self._wake()   # its deadline is new: the loop looks again
            self._next_check = 0.0
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(self.limits.io_timeout)
                self.finish_request(conn.sock, conn.address)
            except (OSError, ssl.SSLError):
                self.tally.count("answers the peer did not take")
            except Exception:  # noqa: BLE001 - a handler's bug, never the server's end
                log.exception("%s: unexpected error answering %s", self.name,
                              conn.address[0] if conn.address else "a peer")
            finally:
                with self._lock:
                    self._conns.pop(conn.sock, None)
                self.shutdown_request(conn.sock)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("%s: unexpected error answering %s", self.name, client_address[0])


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass


def _waiting(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` sent bytes not read yet (the TCP socket under TLS)."""
    try:
        return bool(socket.socket.recv(sock, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True   # reset: reading it will tell


def _shut(sock: socket.socket) -> None:
    """Shut the TCP connection under ``sock`` (a TLS socket's state untouched: another
    thread may be writing on it)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
