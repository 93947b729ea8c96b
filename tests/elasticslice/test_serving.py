"""The guarded listener: a request is read whole off the accepting thread before a worker
answers it, within its deadline; a full table evicts its oldest silent connection, then its
oldest unfinished one; an answer the peer does not read is cut; strangers are counts in one
log line an interval, never a traceback."""
from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from elasticslice.pilots.publish import serve_in_thread, stop_serving
from elasticslice.serving import BufferedRequestHandler, GuardedServer, Limits
from elasticslice.tally import Tally
from tests.helpers import wait_for

QUICK = Limits(max_connections=8, handshake_deadline=0.5, request_deadline=0.5,
               response_deadline=0.5, io_timeout=5.0, workers=1, max_body=1024,
               log_interval=60.0, fresh=0.0)


class Echo(BufferedRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:  # noqa: N802
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self.send_error(411)
            return
        if length > self.server.limits.max_body:
            self.send_error(413)
            return
        self._send(self.rfile.read(length))

    def do_GET(self) -> None:  # noqa: N802
        self._send(b"x" * (int(self.path.strip("/") or 2) * 1024 * 1024))

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def serving(**changes: object) -> Iterator[GuardedServer]:
    server = GuardedServer(("127.0.0.1", 0), Echo, limits=dataclasses.replace(QUICK, **changes),
                           name="test listener")
    thread = serve_in_thread(server, "test-listener")
    try:
        yield server
    finally:
        stop_serving(server, thread)


def connect(server: GuardedServer) -> socket.socket:
    sock = socket.create_connection(server.server_address[:2], timeout=10)
    return sock


def answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_request_sent_in_pieces_is_answered_once_whole() -> None:
    with serving(request_deadline=10.0) as server:
        sock = connect(server)
        for piece in (b"POST / HTTP/1.0\r\nContent-", b"Length: 5\r\n\r\nhe", b"llo"):
            sock.sendall(piece)
        assert answer(sock).endswith(b"\r\n\r\nhello")
        sock.close()


def test_a_trickling_peer_is_cut_at_the_request_deadline_and_counted() -> None:
    with serving() as server:
        sock = connect(server)
        sock.sendall(b"POST / HTTP/1.0\r\n")

        def cut() -> bool:
            try:
                sock.sendall(b"X")
                sock.settimeout(0.1)
                return sock.recv(1) == b""
            except TimeoutError:
                return False
            except OSError:
                return True
        wait_for(cut, timeout=30, what="the trickler cut")
        assert server.tally.total("requests over their deadline") == 1
        sock.close()


def test_a_full_table_evicts_the_oldest_silent_then_the_oldest_unfinished() -> None:
    with serving(max_connections=3, request_deadline=30.0) as server:
        talker = connect(server)
        talker.sendall(b"GET /")                 # unfinished, but heard
        wait_for(lambda: server.open_connections() == 1, what="the talker held")
        silent = [connect(server) for _ in range(2)]
        wait_for(lambda: server.open_connections() == 3, what="the table full")
        newcomer = connect(server)
        silent[0].settimeout(10)
        assert silent[0].recv(1) == b""          # the oldest silent one, not the talker
        newcomer.sendall(b"G")                    # heard: no longer silent
        silent[1].sendall(b"G")
        wait_for(lambda: server.open_connections() == 3, what="three held")
        last = connect(server)                    # nothing silent left: the oldest unfinished
        talker.settimeout(10)
        assert talker.recv(1) == b""
        assert server.tally.totals() == {"idle connections evicted (all slots taken)": 1,
                                         "unfinished connections evicted (all slots taken)": 1}
        for sock in (talker, newcomer, last, *silent):
            sock.close()


def test_a_connection_just_made_is_evicted_for_its_silence_after_the_tricklers() -> None:
    """A scraper's request comes a moment after its connect: under a flood of partial HTTP
    heads (every other connection heard, unfinished), the newest connection was the only
    silent one, and the next newcomer evicted it before any trickler
    (tests/hostile/test_starvation.py's metrics, once, under the whole suite's load)."""
    with serving(max_connections=3, request_deadline=30.0, fresh=30.0) as server:
        tricklers = [connect(server) for _ in range(2)]
        for sock in tricklers:
            sock.sendall(b"GET /")                # unfinished, heard
        wait_for(lambda: server.open_connections() == 2, what="the tricklers held")
        scraper = connect(server)                 # silent for now
        wait_for(lambda: server.open_connections() == 3, what="the table full")
        newcomer = connect(server)
        tricklers[0].settimeout(10)
        assert tricklers[0].recv(1) == b""        # the oldest trickler, not the scraper
        scraper.sendall(b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\nok")
        assert answer(scraper).endswith(b"\r\n\r\nok")
        assert server.tally.totals() == {"unfinished connections evicted (all slots taken)": 1}
        for sock in (newcomer, scraper, *tricklers):
            sock.close()


def test_a_request_whose_bytes_wait_goes_after_a_trickler_with_nothing_to_read() -> None:
    """Under a flood the server may accept a burst before it reads a scraper's request:
    that request (its bytes waiting) is evicted after an unfinished connection with nothing
    to read now, not before it (a metrics scrape was cut so once under the flood of
    tests/hostile/test_starvation.py)."""
    from elasticslice.serving import Phase, _Conn
    server = GuardedServer(("127.0.0.1", 0), Echo, limits=QUICK, name="test listener")
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        waiting, trickler = (_Conn(ours, "peer", 0.0, 60.0, Phase.READING, heard=True)
                             for ours, _ in pairs)
        pairs[0][1].sendall(b"GET /metrics HTTP/1.0\r\n\r\n")   # waiting to be read
        server._conns = {waiting.sock: waiting, trickler.sock: trickler}   # oldest first
        assert server._victim() is trickler
        pairs[1][1].sendall(b"X")         # both have bytes waiting: the oldest goes
        assert server._victim() is waiting
    finally:
        server.server_close()
        for pair in pairs:
            for sock in pair:
                sock.close()


def test_an_answer_the_peer_does_not_read_is_cut_and_frees_the_worker() -> None:
    with serving(request_deadline=10.0) as server:   # one worker
        hog = connect(server)
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog.sendall(b"GET /16 HTTP/1.0\r\n\r\n")       # 16 MiB, never read
        wait_for(lambda: server.tally.total("answers cut at their deadline") == 1,
                 what="the answer cut")
        sock = connect(server)
        sock.sendall(b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\nok")
        assert answer(sock).endswith(b"ok")
        for s in (hog, sock):
            s.close()


@pytest.mark.parametrize("sent", [b"\x16\x03\x01\x00\xff" + b"\0" * 300,
                                  b"GET /" + b"a" * 70000,
                                  b"NOT HTTP\r\n\r\n",
                                  b"POST / HTTP/1.0\r\nContent-Length: many\r\n\r\n",
                                  b"POST / HTTP/1.0\r\nContent-Length: 99999\r\n\r\n"])
def test_garbage_gets_an_error_or_a_close_never_a_traceback(sent: bytes, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with serving(request_deadline=1.0) as server:
        sock = connect(server)
        try:
            sock.sendall(sent)
            answer(sock)   # an HTTP error, or closed (at the deadline at the latest)
        except ConnectionResetError:
            pass
        sock.close()
        ok = connect(server)
        ok.sendall(b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\nok")
        assert answer(ok).endswith(b"ok")
        ok.close()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_the_tally_logs_one_line_an_interval(caplog) -> None:
    now = [100.0]
    tally = Tally("listener", interval=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="elasticslice.tally"):
        assert not tally.flush()
        tally.count("failed TLS handshakes")
        assert tally.flush()   # the first at once
        for _ in range(1000):
            tally.count("failed TLS handshakes")
            tally.count("idle connections evicted")
            assert not tally.flush()
        now[0] += 61
        assert tally.flush()
        assert not tally.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "listener: failed TLS handshakes: 1",
        "listener in the last 61 s: failed TLS handshakes: 1000; idle connections "
        "evicted: 1000"]
    assert tally.total("failed TLS handshakes") == 1001


@pytest.mark.parametrize("bad", [{"workers": 0}, {"reserved": 1, "workers": 1},
                                 {"max_connections": 0}, {"request_deadline": 0}])
def test_limits_that_cannot_work_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="limits"):
        dataclasses.replace(QUICK, **bad)


def test_no_thread_per_connection() -> None:
    with serving(max_connections=200, request_deadline=30.0) as server:
        ok = connect(server)   # the workers are up
        ok.sendall(b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\nok")
        assert answer(ok).endswith(b"ok")
        ok.close()
        before = threading.active_count()
        socks = [connect(server) for _ in range(150)]
        wait_for(lambda: server.open_connections() == 150, what="150 held")
        assert threading.active_count() == before
        for sock in socks:
            sock.close()
