"""The client endpoint CloudLab calls back: an HTTPS XML-RPC server that serves one object.

An experiment registers the URL of this server with the CM's SetSliceClientEndpoint; the CM
then calls it (NotifyDeletePending, NotifyDeleteComplete, SetResourceValues) presenting its
own certificate. The server trusts nobody else:

- TLS with a client certificate REQUIRED and verified against ``ca_file`` (the CM's CA);
- the caller's URN (the certificate's subjectAltName ``urn:publicid:IDN+...`` URI, read the
  way ProtoGENI reads it) must be one of ``allowed_urns``, else the answer is FORBIDDEN and
  no method runs; the request body is not even parsed;
- one params struct in, ``{code, value, output}`` out; an unknown method is XML-RPC fault
  -32497; a body that is not XML-RPC, or carries a DOCTYPE (entities, external references:
  XML-RPC has no use for them), fault -32700; malformed params BADARGS; a method that raises SERVERERROR (logged with context);
- bounded: request body size, worker threads (a connection beyond them is refused at once),
  handshake and read timeouts, and a lifetime per connection (a peer trickling bytes is cut
  off), so a slow or hostile peer can neither stall nor exhaust it.

The served object knows nothing of HTTP: it is a :class:`ProtoGeniClientServerEndpoint`
whose ``RPC_METHODS`` name the methods that may be called.
"""
from __future__ import annotations

import http.server
import logging
import socket
import socketserver
import ssl
import threading
import time
import xmlrpc.client
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from xml.parsers import expat

from elasticslice.errors import ElasticSliceError
from elasticslice.rpc import pki
from elasticslice.rpc.codes import FAULT_NO_SUCH_METHOD, FAULT_PARSE, GeniCode

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 5.0
READ_TIMEOUT = 10.0
CONNECTION_LIFETIME = 60.0  # a connection older than this is closed, however busy it looks
MAX_OUTPUT = 200


class EndpointError(ElasticSliceError):
    """The callback endpoint could not start or serve."""


def _no_doctype(*_: Any) -> None:
    raise ValueError("a DOCTYPE is not allowed in an XML-RPC call")


def loads_call(body: bytes) -> tuple[tuple[Any, ...], str | None]:
    """Params and method name of an XML-RPC call, as ``xmlrpc.client.loads`` gives them,
    refusing a DOCTYPE (its entities would be expanded, its external ones silently dropped)."""
    target = xmlrpc.client.Unmarshaller()
    parser = expat.ParserCreate(None, None)
    parser.buffer_text = True
    parser.StartElementHandler = target.start
    parser.EndElementHandler = target.end
    parser.CharacterDataHandler = target.data
    parser.StartDoctypeDeclHandler = _no_doctype
    target.xml(None, None)
    parser.Parse(body, True)
    return target.close(), target.getmethodname()


class BadArgs(EndpointError):
    """The caller's params are malformed; the message is the one line the caller gets back."""


def response(code: GeniCode, value: Any = 0, output: str = "") -> dict[str, Any]:
    """A ProtoGENI answer struct."""
    return {"code": int(code), "value": value, "output": output}


def _one_line(text: str, limit: int = MAX_OUTPUT) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class ProtoGeniClientServerEndpoint:
    """The base of client endpoints: the methods named in ``RPC_METHODS`` are served, each
    called with the caller's params struct and answering a ``{code, value, output}`` dict."""

    RPC_METHODS: tuple[str, ...] = ("GetVersion",)

    def GetVersion(self, params: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: N802
        return response(GeniCode.SUCCESS, "1.0", "1.0")


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection: keep-alive POSTs until the peer closes or goes quiet."""

    protocol_version = "HTTP/1.1"
    server_version = "elasticslice-endpoint"
    timeout = READ_TIMEOUT
    server: _Listener
    caller: str | None = None

    def setup(self) -> None:
        self.timeout = self.server.owner.read_timeout
        super().setup()
        assert isinstance(self.connection, ssl.SSLSocket)
        self.caller = pki.peer_urn(self.connection)

    def _reply(self, status: int, payload: bytes, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(payload)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        owner = self.server.owner
        raw = self.headers.get("Content-Length")
        try:
            length = int(raw) if raw is not None else -1
        except ValueError:
            length = -1
        if length < 0:
            self.send_error(411, "Content-Length required")
            self.close_connection = True
            return
        if length > owner.max_body:
            log.warning("refused a %d-byte request from %s (limit %d)", length,
                        self.caller or "a caller without a URN", owner.max_body)
            self.send_error(413, f"request body over {owner.max_body} bytes")
            self.close_connection = True
            return
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return
        if not owner.allowed(self.caller):
            log.warning("refused a call from %s: not an allowed caller",
                        self.caller or "a certificate without a URN")
            answer = response(GeniCode.FORBIDDEN, 0, "only the CM may call this endpoint")
            self._reply(200, xmlrpc.client.dumps((answer,), methodresponse=True).encode(),
                        close=True)
            return
        self._reply(200, owner.dispatch(body, self.caller))

    def do_GET(self) -> None:  # noqa: N802
        self.send_error(405, "XML-RPC wants POST")
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s %s", self.client_address[0], format % args)


class _Listener(socketserver.TCPServer):
    """Accepts on the listening thread; TLS and requests run on a bounded worker pool."""

    allow_reuse_address = True

    def __init__(self, owner: EndpointServer, host: str, port: int) -> None:
        self.owner = owner
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.owner.submit(request, client_address)

    def handle_error(self, request: object, client_address: Any) -> None:
        log.exception("unexpected error serving %s", client_address[0])

    def service_actions(self) -> None:  # every poll of the accept loop
        self.owner.reap()


class EndpointServer:
    """Serve ``endpoint`` over HTTPS on ``host:port`` (port 0: any free port)."""

    def __init__(self, endpoint: ProtoGeniClientServerEndpoint, *, certfile: Path,
                 keyfile: Path | None = None, password: str | None = None, ca_file: Path,
                 allowed_urns: Callable[[], Collection[str]] | Collection[str],
                 host: str = "127.0.0.1", port: int = 0, max_body: int = 8 << 20,
                 workers: int = 4) -> None:
        if workers < 1:
            raise EndpointError(f"workers must be at least 1, not {workers}")
        if max_body < 1:
            raise EndpointError(f"max_body must be positive, not {max_body}")
        self.endpoint = endpoint
        self.max_body = max_body
        self.workers = workers
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        self.read_timeout = READ_TIMEOUT
        self._allowed = allowed_urns
        self._context = self._tls_context(Path(certfile), keyfile, password, Path(ca_file))
        self._host = host
        self._port = port
        self._listener: _Listener | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(workers)
        self._open: dict[socket.socket, float] = {}  # connection -> when it was accepted
        self.connection_lifetime = CONNECTION_LIFETIME
        self._open_lock = threading.Lock()
        self.refused = 0  # connections refused because every worker was busy

    @staticmethod
    def _tls_context(certfile: Path, keyfile: Path | None, password: str | None,
                     ca_file: Path) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None,
                                password=password)
        except (OSError, ssl.SSLError) as err:
            raise EndpointError(f"{certfile}: cannot load the endpoint's certificate and key "
                                f"({getattr(err, 'strerror', None) or err})") from err
        try:
            ctx.load_verify_locations(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as err:
            raise EndpointError(f"{ca_file}: cannot load the CA certificate "
                                f"({getattr(err, 'strerror', None) or err})") from err
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    # -- who may call ------------------------------------------------------------------------
    def allowed_now(self) -> set[str]:
        allowed = self._allowed() if callable(self._allowed) else self._allowed
        return {u for u in allowed if u}

    def allowed(self, urn: str | None) -> bool:
        if not urn:
            return False
        try:
            return urn in self.allowed_now()
        except Exception:  # a failing lookup refuses, it never lets through
            log.exception("cannot tell who may call the endpoint; refusing %s", urn)
            return False

    # -- one call ----------------------------------------------------------------------------
    def dispatch(self, body: bytes, caller: str | None) -> bytes:
        """The XML-RPC answer to one request body from an allowed caller."""
        try:
            args, method = loads_call(body)
        except Exception as err:  # expat, marshalling: the caller sent something unreadable
            return _fault(FAULT_PARSE, f"cannot parse the request: {_one_line(str(err))}")
        if not method or method not in self.endpoint.RPC_METHODS or \
                not callable(getattr(self.endpoint, method, None)):
            return _fault(FAULT_NO_SUCH_METHOD, f"no such method: {_one_line(str(method), 80)}")
        if len(args) == 0:
            params: Any = {}
        elif len(args) == 1:
            params = args[0]
        else:
            return _answer(response(GeniCode.BADARGS, 0,
                                    f"{method}: expected one params struct, got {len(args)} "
                                    "arguments"))
        if not isinstance(params, dict):
            return _answer(response(GeniCode.BADARGS, 0,
                                    f"{method}: params must be a struct, not "
                                    f"{type(params).__name__}"))
        try:
            result = getattr(self.endpoint, method)(params)
        except BadArgs as err:
            log.warning("%s from %s: bad arguments: %s", method, caller, err)
            return _answer(response(GeniCode.BADARGS, 0, f"{method}: {_one_line(str(err))}"))
        except Exception as err:
            log.exception("%s from %s failed", method, caller)
            return _answer(response(GeniCode.SERVERERROR, 0,
                                    f"{method}: internal error ({type(err).__name__})"))
        if not isinstance(result, dict) or "code" not in result:
            result = response(GeniCode.SUCCESS, 0 if result is None else result)
        try:
            return _answer(result)
        except (TypeError, OverflowError) as err:
            log.error("%s from %s answered something XML-RPC cannot carry: %s", method, caller,
                      err)
            return _answer(response(GeniCode.SERVERERROR, 0, f"{method}: unsendable answer"))

    # -- connections -------------------------------------------------------------------------
    def submit(self, request: socket.socket, client_address: Any) -> None:
        pool = self._pool
        if pool is None or not self._slots.acquire(blocking=False):
            self.refused += 1
            log.warning("refused a connection from %s: all %d workers busy", client_address[0],
                        self.workers)
            _close(request)
            return
        try:
            pool.submit(self._serve, request, client_address)
        except RuntimeError:  # pool shut down under us
            self._slots.release()
            _close(request)

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        tls: ssl.SSLSocket | None = None
        accepted = time.monotonic()
        try:
            request.settimeout(self.handshake_timeout)
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._open_lock:
                self._open[request] = accepted
            try:
                tls = self._context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as err:
                log.info("TLS handshake from %s refused: %s", client_address[0], err)
                return
            tls.settimeout(self.read_timeout)
            with self._open_lock:
                self._open.pop(request, None)
                self._open[tls] = accepted
            listener = self._listener
            if listener is not None:
                _Handler(tls, client_address, listener)
        except (ssl.SSLError, OSError) as err:
            log.debug("connection from %s ended: %s", client_address[0], err)
        except Exception:
            log.exception("unexpected error serving %s", client_address[0])
        finally:
            with self._open_lock:
                self._open.pop(request, None)
                if tls is not None:
                    self._open.pop(tls, None)
            _close(tls or request)
            self._slots.release()

    def reap(self, now: float | None = None) -> int:
        """Close connections open longer than ``connection_lifetime`` (a peer trickling a
        request one byte at a time must not keep a worker); how many were closed."""
        now = time.monotonic() if now is None else now
        with self._open_lock:
            old = [c for c, t in self._open.items() if now - t > self.connection_lifetime]
        for conn in old:
            log.warning("closing a connection open for over %.0f s", self.connection_lifetime)
            _shutdown(conn)
        return len(old)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._listener is not None:
            return
        try:
            self._listener = _Listener(self, self._host, self._port)
        except OSError as err:
            raise EndpointError(f"cannot listen on {self._host}:{self._port}: "
                                f"{err.strerror or err}") from err
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="endpoint")
        self._thread = threading.Thread(target=self._listener.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="endpoint-accept", daemon=True)
        self._thread.start()
        self._port = int(self._listener.server_address[1])  # the port 0 chose
        log.info("client endpoint listening on %s", self.url)

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        listener.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        listener.server_close()
        with self._open_lock:
            conns = list(self._open)
        for conn in conns:
            _shutdown(conn)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> EndpointServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port listened on (before ``start``, the one asked for: 0 means any)."""
        return self._port

    @property
    def url(self) -> str:
        return f"https://{self._host}:{self.port}/"


def _answer(result: dict[str, Any]) -> bytes:
    return xmlrpc.client.dumps((result,), methodresponse=True, allow_none=False).encode()


def _fault(code: int, message: str) -> bytes:
    return xmlrpc.client.dumps(xmlrpc.client.Fault(code, message), methodresponse=True).encode()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
