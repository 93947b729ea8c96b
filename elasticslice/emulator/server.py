"""The emulator's HTTPS listener: HTTP/1.1 keep-alive, TLS with a required client certificate.

The TLS handshake runs in the connection's own thread (a slow or hostile peer never stalls
``accept``). Each POST body goes to a ``Dispatcher`` together with the caller's identity, the
URN from the certificate's subjectAltName, exactly as ProtoGENI takes it.
"""
from __future__ import annotations

import http.server
import logging
import socket
import socketserver
import ssl
import threading
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024
HANDSHAKE_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Peer:
    """Who is calling: the URN from the client certificate (None when it has none) and the cert."""

    urn: str | None
    cert_pem: str
    address: str


class Dispatcher(Protocol):
    def dispatch(self, path: str, body: bytes, peer: Peer) -> tuple[int, bytes]:
        """HTTP status and XML body for one XML-RPC request."""


def peer_from_socket(sock: ssl.SSLSocket, address: str) -> Peer:
    info = sock.getpeercert() or {}
    urn = None
    for kind, value in info.get("subjectAltName", ()):
        if kind == "URI" and value.startswith("urn:publicid:IDN+"):
            urn = value
            break
    der = sock.getpeercert(binary_form=True)
    pem = ssl.DER_cert_to_PEM_cert(der) if der else ""
    return Peer(urn, pem, address)


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

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.send_error(400, "bad Content-Length")
            return
        body = self.rfile.read(length)
        assert isinstance(self.connection, ssl.SSLSocket)
        peer = peer_from_socket(self.connection, self.client_address[0])
        status, payload = self.server.dispatcher.dispatch(self.path, body, peer)
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802
        self.send_error(405, "XML-RPC wants POST")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s %s", self.client_address[0], format % args)


class TLSServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """A threading HTTPS server; ``stop()`` also closes idle keep-alive connections."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, context: ssl.SSLContext,
                 dispatcher: Dispatcher) -> None:
        self.context = context
        self.dispatcher = dispatcher
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        super().__init__((host, port), _Handler)

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
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="emulator-https", daemon=True)
        self._thread.start()

    def stop(self) -> None:
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
