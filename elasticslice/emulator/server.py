"""The emulator's HTTPS listener: HTTP/1.1 keep-alive, TLS with a required client certificate.

The TLS handshake runs in the connection's own thread (a slow or hostile peer never stalls
``accept``). Each POST body goes to a ``Dispatcher`` together with the caller's identity, the
URN from the certificate's subjectAltName, exactly as ProtoGENI takes it.

Bounds (``Limits``): at most ``max_connections`` connection threads (more connections are
closed at once); a body longer than the largest limit is refused by its Content-Length
before any of it is read; the method name, peeked from the first bytes, picks the limit
(``CreateSliver`` may send 32 MiB, every other call 8 MiB: refused with HTTP 413); a request
is handled only when a slot of its lane (small or large body) and its Content-Length fit in
the lane's budget (``Admission``, in arrival order), else after ``queue_timeout`` it gets
HTTP 503.
The body then goes to the dispatcher as a ``Body`` it reads in chunks. A refused request
is answered at once and its body read and dropped for a few seconds (no memory) before the
connection closes, so the client sees the answer rather than a reset.
"""
from __future__ import annotations

import http.server
import logging
import socket
import socketserver
import ssl
import threading
import xmlrpc.client
from dataclasses import dataclass
from typing import Protocol

from elasticslice.emulator.bounds import (Admission, Body, Limits, peek_method, read_head,
                                          trim_memory, tune_malloc)
from elasticslice.rpc import pki

log = logging.getLogger(__name__)
# One line per request (address, caller URN, path, method, HTTP status, bytes): only where
# `serve --log-file` (or --debug) sends it, never up to the root logger of a program
# embedding the emulator.
access = logging.getLogger("elasticslice.emulator.access")
access.propagate = False

HANDSHAKE_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0
REFUSAL_DRAIN = 5.0  # seconds a refused body is still read (and dropped) before closing


@dataclass(frozen=True)
class Peer:
    """Who is calling: the URN from the client certificate (None when it has none) and the cert."""

    urn: str | None
    cert_pem: str
    address: str


class Dispatcher(Protocol):
    def dispatch(self, path: str, body: Body, peer: Peer) -> tuple[int, bytes]:
        """HTTP status and XML body for one XML-RPC request (reading of ``body`` as needed)."""


def peer_from_socket(sock: ssl.SSLSocket, address: str) -> Peer:
    der = sock.getpeercert(binary_form=True)
    pem = ssl.DER_cert_to_PEM_cert(der) if der else ""
    return Peer(pki.peer_urn(sock), pem, address)


def server_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """TLS server context: our certificate, and client certificates from ``ca`` required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "elasticslice-emulator"
    timeout = IDLE_TIMEOUT
    server: TLSServer
    _method: str | None = None
    _urn: str | None = None

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        limits = self.server.limits
        self._method = None
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self._refuse(400, "Content-Length is not a number", None)
            return
        if length > limits.large_body:  # refused before a byte of it is read
            self._refuse(413, f"Request body of {length} bytes is larger than "
                              f"{limits.large_body} bytes",
                         Body(self.rfile, length) if length <= 2 * limits.large_body else None)
            return
        head = read_head(self.rfile, length)
        method = self._method = peek_method(head)
        body = Body(self.rfile, length, head, method)
        limit = limits.body_limit(method)
        if length > limit:
            self._refuse(413, f"Request body of {length} bytes is too large for "
                              f"{method or 'this call'} (limit {limit} bytes)", body)
            return
        lane = self.server.lane(length)
        if not lane.acquire(length, limits.queue_timeout):
            log.info("%s: %s of %d bytes refused: too many requests in flight",
                     self.client_address[0], method, length)
            self._refuse(503, "Server is overloaded; try again later", body)
            return
        try:
            body = Body(self.rfile, length, head, method)  # its time runs from admission
            assert isinstance(self.connection, ssl.SSLSocket)
            peer = peer_from_socket(self.connection, self.client_address[0])
            self._urn = peer.urn
            status, payload = self.server.dispatcher.dispatch(self.path, body, peer)
            if not body.drain():  # what the dispatcher did not read
                self.close_connection = True
        finally:
            if length > limits.small_body:
                trim_memory()  # before the next large request comes in
            lane.release(length)
        self._answer(status, payload)

    def _answer(self, status: int, payload: bytes) -> None:
        if self.server.stopping:   # a connection that outlived stop(): this answer is its
            self.close_connection = True   # last, the client reconnects to what serves now
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        access.info("%s %s POST %s %s %d %d", self.client_address[0], self._urn or "-",
                    self.path, self._method or "-", status, len(payload))

    def _refuse(self, status: int, message: str, body: Body | None) -> None:
        """An XML-RPC fault with HTTP ``status``, then the connection closes. The unread
        body is read and dropped for a few seconds first (a lingering close: no memory), so
        that a client still sending it gets to read the answer instead of a reset."""
        self.close_connection = True
        fault = xmlrpc.client.dumps(xmlrpc.client.Fault(status, message), methodresponse=True)
        self._answer(status, fault.encode("utf-8"))
        if body is not None:
            body.drain(seconds=REFUSAL_DRAIN)

    def do_GET(self) -> None:  # noqa: N802
        self.send_error(405, "XML-RPC wants POST")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s %s", self.client_address[0], format % args)


class TLSServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """A threading HTTPS server; ``stop()`` also closes idle keep-alive connections."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, host: str, port: int, context: ssl.SSLContext,
                 dispatcher: Dispatcher, limits: Limits | None = None) -> None:
        self.context = context
        self.dispatcher = dispatcher
        self.limits = limits or Limits()
        self.small_lane = Admission(self.limits.max_requests, self.limits.small_budget)
        self.large_lane = Admission(self.limits.max_large, self.limits.large_budget)
        self._connections = threading.BoundedSemaphore(self.limits.max_connections)
        self.active_connections = 0
        self.refused_connections = 0
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        self.stopping = False
        self._thread: threading.Thread | None = None
        super().__init__((host, port), _Handler)

    def lane(self, length: int) -> Admission:
        """Where a request of ``length`` body bytes waits to be let in."""
        return self.small_lane if length <= self.limits.small_body else self.large_lane

    def process_request(self, request: socket.socket,  # type: ignore[override]
                        client_address: tuple) -> None:
        if not self._connections.acquire(blocking=False):
            self.refused_connections += 1
            if self.refused_connections % 100 == 1:
                log.warning("%d connections open: closing new ones (%d so far)",
                            self.limits.max_connections, self.refused_connections)
            self.shutdown_request(request)
            return
        with self._open_lock:
            self.active_connections += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connection_done()
            raise

    def process_request_thread(self, request: socket.socket,  # type: ignore[override]
                               client_address: tuple) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connection_done()

    def _connection_done(self) -> None:
        with self._open_lock:
            self.active_connections -= 1
        self._connections.release()

    def finish_request(self, request: socket.socket, client_address: tuple) -> None:  # type: ignore[override]
        request.settimeout(HANDSHAKE_TIMEOUT)
        # Headers and body go out as separate writes: without this, Nagle and the peer's
        # delayed ACK add ~40 ms to every answer on a keep-alive connection.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as err:
            log.info("TLS handshake from %s refused: %s", client_address[0], err)
            return
        tls.settimeout(IDLE_TIMEOUT)
        with self._open_lock:
            self._open.add(tls)
        try:
            self.RequestHandlerClass(tls, client_address, self)
        except (ssl.SSLError, OSError) as err:
            log.debug("connection from %s ended: %s", client_address[0], err)
        finally:
            with self._open_lock:
                self._open.discard(tls)
            try:
                tls.close()
            except OSError:
                pass

    def handle_error(self, request: object, client_address: tuple) -> None:
        log.exception("unexpected error serving %s", client_address[0])

    def start(self) -> None:
        tune_malloc()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="emulator-https", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping = True
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        with self._open_lock:
            conns = list(self._open)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.server_close()

    @property
    def port(self) -> int:
        return int(self.server_address[1])
