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
- bounded (:mod:`elasticslice.serving`): the TLS handshake and the whole request are read
  off the accepting thread and within deadlines (5 s, 10 s: a peer trickling bytes is cut
  off), no thread is given before a request is whole, at most a cap of connections is open
  and a newcomer evicts the oldest stranger's unfinished one, the CM's calls go first with a
  worker of their own, a stranger's body is not read past 64 KiB, and what strangers did is
  one log line a minute at most; so a slow or hostile peer can neither stall nor exhaust it.

The served object knows nothing of HTTP: it is a :class:`ProtoGeniClientServerEndpoint`
whose ``RPC_METHODS`` name the methods that may be called.
"""
from __future__ import annotations

import contextvars
import logging
import socket
import ssl
import threading
import xmlrpc.client
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any
from xml.parsers import expat

from elasticslice.errors import ElasticSliceError
from elasticslice.rpc import pki
from elasticslice.rpc.codes import FAULT_NO_SUCH_METHOD, FAULT_PARSE, GeniCode
from elasticslice.serving import BufferedRequestHandler, GuardedServer, Limits, default_cap

log = logging.getLogger(__name__)

#: the URN of the certificate of the caller whose call is being handled (None outside a
#: call): a handler of a client endpoint of several CMs tells which CM calls it
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("caller", default=None)

HANDSHAKE_TIMEOUT = 5.0     # from accept to the end of the TLS handshake
REQUEST_DEADLINE = 10.0     # from accept to the whole request of a peer that is not the CM
READ_TIMEOUT = 10.0         # each read or write while a worker answers
CONNECTION_LIFETIME = 60.0  # a connection older than this is closed, however busy it looks
STRANGER_BODY = 64 << 10    # a body read from a peer that is not the CM (then FORBIDDEN)
MAX_OUTPUT = 200


def endpoint_limits(workers: int = 4, max_body: int = 8 << 20) -> Limits:
    """The callback endpoint's limits: ``workers`` threads, one of them the CM's only; at
    most :func:`~elasticslice.serving.default_cap` connections (256, or an eighth of the
    open-file limit); the deadlines above."""
    return Limits(max_connections=default_cap(), handshake_deadline=HANDSHAKE_TIMEOUT,
                  request_deadline=REQUEST_DEADLINE, response_deadline=CONNECTION_LIFETIME,
                  io_timeout=READ_TIMEOUT, workers=workers, reserved=1 if workers > 1 else 0,
                  max_body=max_body, stranger_body=min(max_body, STRANGER_BODY))


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


class _Handler(BufferedRequestHandler):
    """One request, read whole by the listener before this runs; answered, then closed."""

    protocol_version = "HTTP/1.1"
    server_version = "elasticslice-endpoint"
    timeout = READ_TIMEOUT
    server: _Listener
    caller: str | None = None

    def setup(self) -> None:
        self.timeout = self.server.limits.io_timeout
        super().setup()
        assert isinstance(self.connection, ssl.SSLSocket)
        self.caller = pki.peer_urn(self.connection)

    def _reply(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")  # one request per connection
        self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        owner = self.server.owner
        tally = self.server.tally
        if not owner.allowed(self.caller):  # before the body: a stranger's is never parsed
            tally.count("calls refused (not the CM)")
            answer = response(GeniCode.FORBIDDEN, 0, "only the CM may call this endpoint")
            self._reply(200, xmlrpc.client.dumps((answer,), methodresponse=True).encode())
            return
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
            log.warning("refused a %d-byte request from %s (limit %d)", length, self.caller,
                        owner.max_body)
            self.send_error(413, f"request body over {owner.max_body} bytes")
            self.close_connection = True
            return
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return
        self._reply(200, owner.dispatch(body, self.caller))

    def do_GET(self) -> None:  # noqa: N802
        self.server.tally.count("GETs refused")
        self.send_error(405, "XML-RPC wants POST")
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # strangers are counted by the listener, the CM's calls logged by their methods


class _Listener(GuardedServer):
    """TLS handshakes and whole requests read off the accepting thread; the CM's
    certificate has a lane of its own (see :mod:`elasticslice.serving`)."""

    def __init__(self, owner: EndpointServer, host: str, port: int, limits: Limits,
                 tls: ssl.SSLContext) -> None:
        self.owner = owner
        super().__init__((host, port), _Handler, limits=limits, tls=tls,
                         name="callback endpoint")

    def trusted(self, sock: socket.socket) -> bool:
        return self.owner.allowed(pki.peer_urn(sock))  # type: ignore[arg-type]


class EndpointServer:
    """Serve ``endpoint`` over HTTPS on ``host:port`` (port 0: any free port).

    ``limits`` (default :func:`endpoint_limits` of ``workers`` and ``max_body``): its
    connection cap and deadlines; of two workers or more, one answers the CM only."""

    def __init__(self, endpoint: ProtoGeniClientServerEndpoint, *, certfile: Path,
                 keyfile: Path | None = None, password: str | None = None, ca_file: Path,
                 allowed_urns: Callable[[], Collection[str]] | Collection[str],
                 host: str = "127.0.0.1", port: int = 0, max_body: int = 8 << 20,
                 workers: int = 4, limits: Limits | None = None) -> None:
        if workers < 1:
            raise EndpointError(f"workers must be at least 1, not {workers}")
        if max_body < 1:
            raise EndpointError(f"max_body must be positive, not {max_body}")
        self.endpoint = endpoint
        self.max_body = max_body
        self.limits = limits or endpoint_limits(workers, max_body)
        self.workers = self.limits.workers
        self._allowed = allowed_urns
        self._context = self._tls_context(Path(certfile), keyfile, password, Path(ca_file))
        self._host = host
        self._port = port
        self._listener: _Listener | None = None
        self._thread: threading.Thread | None = None

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
        token = CALLER.set(caller)
        try:
            result = getattr(self.endpoint, method)(params)
        except BadArgs as err:
            log.warning("%s from %s: bad arguments: %s", method, caller, err)
            return _answer(response(GeniCode.BADARGS, 0, f"{method}: {_one_line(str(err))}"))
        except Exception as err:
            log.exception("%s from %s failed", method, caller)
            return _answer(response(GeniCode.SERVERERROR, 0,
                                    f"{method}: internal error ({type(err).__name__})"))
        finally:
            CALLER.reset(token)
        if not isinstance(result, dict) or "code" not in result:
            result = response(GeniCode.SUCCESS, 0 if result is None else result)
        try:
            return _answer(result)
        except (TypeError, OverflowError) as err:
            log.error("%s from %s answered something XML-RPC cannot carry: %s", method, caller,
                      err)
            return _answer(response(GeniCode.SERVERERROR, 0, f"{method}: unsendable answer"))

    # -- what strangers did -------------------------------------------------------------
    def open_connections(self) -> int:
        """Connections open now (handshaking, reading, queued or answered)."""
        return self._listener.open_connections() if self._listener is not None else 0

    def stats(self) -> dict[str, int]:
        """How many connections and calls were refused, evicted or cut, by why."""
        return self._listener.tally.totals() if self._listener is not None else {}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._listener is not None:
            return
        try:
            self._listener = _Listener(self, self._host, self._port, self.limits,
                                       self._context)
        except OSError as err:
            raise EndpointError(f"cannot listen on {self._host}:{self._port}: "
                                f"{err.strerror or err}") from err
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
