"""A stranger holding many connections to listeners, from one thread (no thread per socket).

``Flood(targets, idle=1000, trickling=100)`` opens, to each :class:`Target`, ``idle``
connections that send nothing and ``trickling`` ones that send the target's ``payload`` one
byte every ``every`` seconds (a TLS ClientHello, or an HTTP head that never ends: slow-loris);
a connection the listener closes is opened again ``reopen`` seconds later, so the pressure
stays. Non-blocking sockets on one selector: 4,400 of them cost little CPU.
"""
from __future__ import annotations

import collections
import errno
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field


def client_hello(server_hostname: str = "localhost") -> bytes:
    """The first flight of a TLS client (its ClientHello), as a real client sends it."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


SLOW_HEAD = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 4000


@dataclass
class Target:
    name: str
    address: tuple[str, int]
    payload: bytes = SLOW_HEAD   # what a trickling connection sends, a byte at a time
    opened: int = 0              # connections established, in all
    closed: int = 0              # of them, closed by the listener
    open_now: int = 0


@dataclass(eq=False)
class _Sock:
    target: Target
    sock: socket.socket
    trickle: bool
    connected: bool = False
    sent: int = 0
    next_send: float = 0.0


@dataclass
class Flood:
    targets: list[Target]
    idle: int = 1000
    trickling: int = 100
    every: float = 1.0
    reopen: float = 2.0
    batch: int = 200          # connections opened per turn of the loop
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Flood:
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def established(self) -> bool:
        """Every target got all of its connections at least once."""
        return all(t.opened >= self.idle + self.trickling for t in self.targets)

    def _run(self) -> None:
        self._sel = sel = selectors.DefaultSelector()
        # (when, target, trickle), in the order they are due (reopen times only grow)
        self._pending: collections.deque[tuple[float, Target, bool]] = collections.deque(
            (0.0, t, i < self.trickling) for i in range(self.idle + self.trickling)
            for t in self.targets)
        self._socks: set[_Sock] = set()
        self._tricklers: set[_Sock] = set()
        try:
            while not self._stop.is_set():
                self._open_due()
                for key, _ in sel.select(0.05):
                    self._event(key.data)
                self._trickle()
        finally:
            for s in self._socks:
                s.sock.close()
            sel.close()

    def _open_due(self) -> None:
        now, pending = time.monotonic(), self._pending
        for _ in range(self.batch):
            if not pending or pending[0][0] > now:
                return
            _, target, trickle = pending.popleft()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            if sock.connect_ex(target.address) not in (0, errno.EINPROGRESS):
                sock.close()
                pending.append((now + self.reopen, target, trickle))
                continue
            s = _Sock(target, sock, trickle)
            self._socks.add(s)
            self._sel.register(sock, selectors.EVENT_WRITE, s)

    def _event(self, s: _Sock) -> None:
        if not s.connected:
            if s.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._lost(s)
                return
            s.connected = True
            s.target.opened += 1
            s.target.open_now += 1
            self._sel.modify(s.sock, selectors.EVENT_READ, s)
            if s.trickle:
                self._tricklers.add(s)
            return
        try:
            data = s.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost(s)

    def _trickle(self) -> None:
        now = time.monotonic()
        for s in [s for s in self._tricklers if s.next_send <= now]:
            if s.sent >= len(s.target.payload) - 1:   # never the last byte: never whole
                continue
            try:
                s.sock.send(s.target.payload[s.sent:s.sent + 1])
                s.sent += 1
                s.next_send = now + self.every
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._lost(s)

    def _lost(self, s: _Sock) -> None:
        if s not in self._socks:
            return
        self._socks.discard(s)
        self._tricklers.discard(s)
        try:
            self._sel.unregister(s.sock)
        except (KeyError, ValueError):
            pass
        s.sock.close()
        if s.connected:
            s.target.closed += 1
            s.target.open_now -= 1
        self._pending.append((time.monotonic() + self.reopen, s.target, s.trickle))


def main(argv: list[str]) -> int:
    """``python -m tests.hostile.flood [--idle N] [--trickling N] HOST:PORT[:tls] ...``:
    flood until stdin closes (a benchmark runs it apart from the listeners it measures);
    prints ``established`` once every target got all of its connections."""
    import argparse
    import resource
    import sys
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--trickling", type=int, default=100)
    parser.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 20000 if hard == resource.RLIM_INFINITY else min(20000, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    targets = []
    for spec in args.targets:
        host, port, *tls = spec.split(":")
        targets.append(Target(spec, (host, int(port)),
                              client_hello() if tls == ["tls"] else SLOW_HEAD))
    flood = Flood(targets, idle=args.idle, trickling=args.trickling).start()
    while not flood.established():
        time.sleep(0.1)
    print("established", flush=True)
    sys.stdin.read()
    flood.stop()
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
