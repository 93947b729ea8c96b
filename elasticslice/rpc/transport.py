"""XML-RPC over HTTPS with a client certificate: keep-alive, timeouts, retries.

One :class:`XmlRpcTransport` serves any number of ProtoGENI servers (SA, several CMs). It keeps
one persistent ``http.client.HTTPSConnection`` per thread and host, reconnecting when the
server closed it. Transient answers (BUSY, TIMEDOUT, RPCERROR, 503 as an HTTP status, an
XML-RPC fault or a code) and connection errors are retried with exponential backoff and
jitter, a bounded number of times; any other non-zero code is raised as an ``RPCError``
carrying the code, method and server output. Logs name method, server and duration; never
parameters (they hold credentials) nor secrets.
"""
from __future__ import annotations

import contextlib
import http.client
import logging
import random
import socket
import ssl
import threading
import time
import xmlrpc.client
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from xml.parsers.expat import ExpatError

from elasticslice.errors import CredentialError, RPCError, TransportError
from elasticslice.rpc.codes import FAULT_OVERLOADED, TRANSIENT_CODES, GeniCode
from elasticslice.rpc.fastxmlrpc import loads_result
from elasticslice.rpc.timings import CallTimings

log = logging.getLogger(__name__)

USER_AGENT = "elasticslice-xmlrpc/0.1"
MAX_RESPONSE = 256 * 1024 * 1024


def make_ssl_context(certificate: Path | None, passphrase: str | None, ca_bundle: Path | None,
                     verify: bool = True) -> ssl.SSLContext:
    """A TLS client context: our certificate + (encrypted) key, servers checked against CA.

    ``verify=False`` turns server verification off; that is explicit and logged.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if verify:
        if ca_bundle is None:
            raise CredentialError("server verification is on but no CA bundle is configured")
        try:
            ctx.load_verify_locations(cafile=str(ca_bundle))
        except (ssl.SSLError, OSError) as err:
            raise CredentialError(f"cannot load CA bundle {ca_bundle}: {err}") from err
    else:
        log.warning("TLS server verification is OFF: any server can impersonate CloudLab")
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if certificate is not None:
        try:
            ctx.load_cert_chain(str(certificate), password=passphrase or None)
        except ssl.SSLError as err:
            raise CredentialError(f"cannot load certificate and key from {certificate}: "
                                  f"{_pem_problem(certificate)}") from err
        except OSError as err:
            raise CredentialError(f"cannot read {certificate}: {err.strerror}") from err
    return ctx


def _pem_problem(path: Path) -> str:
    """Why OpenSSL would not load a certificate + key PEM (its own reasons are often None)."""
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as err:
        return f"unreadable ({err.strerror})"
    if "-----BEGIN CERTIFICATE-----" not in text:
        return "no certificate in it (want the PEM with certificate and key, like cloudlab.pem)"
    if "PRIVATE KEY-----" not in text:
        return "no private key in it (want the PEM with certificate and key, like cloudlab.pem)"
    if "ENCRYPTED" in text:
        return "wrong passphrase (or a damaged key)"
    return "the certificate or key is damaged, or they do not match"


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: ``attempts`` tries in all, delays ``base * 2**n`` capped, with jitter."""

    attempts: int = 6
    base_delay: float = 5.0
    max_delay: float = 60.0
    jitter: float = 0.5

    def delay(self, retry: int, rng: random.Random) -> float:
        raw = min(self.max_delay, self.base_delay * (2 ** retry))
        return raw * (1.0 - self.jitter * rng.random())


@dataclass(frozen=True)
class Response:
    """A ProtoGENI answer ``{code, value, output}``."""

    code: int
    value: Any
    output: str

    @property
    def ok(self) -> bool:
        return self.code == GeniCode.SUCCESS


class _Transient(Exception):
    """Internal: one attempt failed in a way worth retrying."""

    def __init__(self, error: RPCError, message: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.message = message

    @classmethod
    def of(cls, kind: type[RPCError], message: str, **info: Any) -> _Transient:
        return cls(kind(message, **info), message)


def server_label(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 443}{parts.path}"


class XmlRpcTransport:
    """Calls ``method(params)`` at ProtoGENI URLs and returns the decoded answer."""

    def __init__(self, context: ssl.SSLContext, *, timeout: float = 60.0,
                 retry: RetryPolicy | None = None, seed: int | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 timings: CallTimings | None = None) -> None:
        self.context = context
        #: every call's duration by method (retries included), for the manager's metrics
        self.timings = timings if timings is not None else CallTimings()
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)
        self._sleep = sleep
        self._local = threading.local()
        self._retries = threading.local()   # a thread's own retry policy (retrying)
        self._all: list[http.client.HTTPSConnection] = []
        self._lock = threading.Lock()
        self.connections_opened = 0

    # -- connections ---------------------------------------------------------------------
    def _pool(self) -> dict[tuple[str, int], http.client.HTTPSConnection]:
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = {}
        return pool

    def _connection(self, host: str, port: int) -> tuple[http.client.HTTPSConnection, bool]:
        pool = self._pool()
        conn = pool.get((host, port))
        if conn is not None and conn.sock is not None:
            return conn, True
        conn = http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self.context)
        pool[(host, port)] = conn
        with self._lock:
            self._all.append(conn)
            self.connections_opened += 1
        return conn, False

    def _drop(self, host: str, port: int) -> None:
        conn = self._pool().pop((host, port), None)
        if conn is not None:
            conn.close()
            with self._lock:
                if conn in self._all:
                    self._all.remove(conn)

    def close(self) -> None:
        """Close every connection (of every thread)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    def __enter__(self) -> XmlRpcTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one HTTP exchange ---------------------------------------------------------------
    def _post(self, url: str, method: str, body: bytes, keep_alive: bool) -> bytes:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise TransportError(f"not an https URL: {url}", method=method)
        host, port, path = parts.hostname, parts.port or 443, parts.path or "/"
        label = server_label(url)
        headers = {"Content-Type": "text/xml", "User-Agent": USER_AGENT,
                   "Connection": "keep-alive" if keep_alive else "close"}
        for fresh_try in (False, True):
            conn, reused = self._connection(host, port)
            try:
                conn.request("POST", path, body, headers)
                resp = conn.getresponse()
                data = resp.read(MAX_RESPONSE + 1)
            except ssl.SSLCertVerificationError as err:
                self._drop(host, port)
                raise TransportError(f"server certificate not trusted: {err.verify_message}",
                                     method=method, server=label) from err
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                    ssl.SSLEOFError) as err:
                self._drop(host, port)
                if reused and not fresh_try:
                    continue  # the server closed an idle keep-alive connection: reconnect
                hint = "" if reused else " (does this server accept your client certificate?)"
                raise _Transient.of(TransportError, f"connection closed by the server: "
                                    f"{err or type(err).__name__}{hint}",
                                    method=method, server=label) from err
            except ssl.SSLError as err:
                self._drop(host, port)
                reason = str(err.reason or err)
                if any(a in reason.upper() for a in ("CERTIFICATE", "UNKNOWN_CA")):
                    reason = f"the server refused our client certificate ({reason})"
                raise TransportError(f"TLS failure: {reason}", method=method,
                                     server=label) from err
            except (socket.timeout, TimeoutError) as err:
                self._drop(host, port)
                raise _Transient.of(TransportError, f"no answer within {self.timeout:g} s",
                                    method=method, server=label) from err
            except (OSError, http.client.HTTPException) as err:
                self._drop(host, port)
                raise _Transient.of(TransportError, f"connection failed: {err}", method=method,
                                    server=label) from err
            if resp.will_close or not keep_alive:
                self._drop(host, port)
            if len(data) > MAX_RESPONSE:
                raise TransportError("response too large", method=method, server=label)
            if resp.status == 503:
                raise _Transient.of(TransportError, "server overloaded (HTTP 503)", code=503,
                                    method=method, server=label)
            if resp.status != 200:
                raise TransportError(f"HTTP {resp.status} {resp.reason}", code=resp.status,
                                     method=method, server=label)
            return data
        raise AssertionError("unreachable")

    def _attempt(self, url: str, method: str, body: bytes, keep_alive: bool) -> Any:
        label = server_label(url)
        data = self._post(url, method, body, keep_alive)
        try:
            result = loads_result(data)  # xmlrpc.client.loads's value, faster
        except xmlrpc.client.Fault as fault:
            message = f"XML-RPC fault: {fault.faultString}"
            info = dict(code=fault.faultCode, method=method, server=label)
            if fault.faultCode == FAULT_OVERLOADED:
                raise _Transient.of(TransportError, message, **info) from fault
            raise TransportError(message, **info) from fault
        except (ValueError, xmlrpc.client.ResponseError, ExpatError) as err:
            raise TransportError(f"unreadable XML-RPC answer: {err}", method=method,
                                 server=label) from err
        return result

    # -- public --------------------------------------------------------------------------
    def call_raw(self, url: str, method: str, params: dict[str, Any] | None = None, *,
                 keep_alive: bool = True, positional: tuple[Any, ...] | None = None) -> Any:
        """One call with retries on transient failures; returns the raw decoded result.

        ProtoGENI methods take one struct (``params``); ``positional`` sends other argument
        lists (the dynamic-slice server's calls).
        """
        args = positional if positional is not None else ((params or {}),)
        try:
            body = xmlrpc.client.dumps(args, methodname=method, allow_none=False,
                                       encoding="utf-8").encode("utf-8")
        except TypeError as err:
            raise RPCError(f"cannot marshal arguments: {err}", method=method) from err
        began = time.monotonic()
        try:
            return self._with_retries(url, method, body, keep_alive)
        finally:
            self.timings.record(method, time.monotonic() - began)

    @contextlib.contextmanager
    def retrying(self, policy: RetryPolicy) -> Iterator[None]:
        """Within the block, this thread's calls retry by ``policy`` (the other threads' by
        theirs): a caller with a back-off of its own tries fewer times."""
        before = getattr(self._retries, "policy", None)
        self._retries.policy = policy
        try:
            yield
        finally:
            self._retries.policy = before

    def _with_retries(self, url: str, method: str, body: bytes, keep_alive: bool) -> Any:
        label = server_label(url)
        last: _Transient | None = None
        retry = getattr(self._retries, "policy", None) or self.retry
        for attempt in range(max(1, retry.attempts)):
            if attempt:
                pause = retry.delay(attempt - 1, self._rng)
                log.warning("%s at %s: %s; retry %d/%d in %.2f s", method, label, last.message,
                            attempt, retry.attempts - 1, pause)
                self._sleep(pause)
            start = time.monotonic()
            try:
                result = self._attempt(url, method, body, keep_alive)
            except _Transient as t:
                last = t
                continue
            code = result.get("code") if isinstance(result, dict) else None
            elapsed = time.monotonic() - start
            if isinstance(code, int) and code in TRANSIENT_CODES:
                message = f"{GeniCode.name_of(code)}: {_output(result) or 'no detail'}"
                last = _Transient.of(RPCError, message, code=code, method=method, server=label,
                                     output=_output(result))
                continue
            log.debug("%s at %s: code %s in %.3f s", method, label,
                      GeniCode.name_of(code) if isinstance(code, int) else "-", elapsed)
            return result
        assert last is not None
        err = last.error
        raise type(err)(f"{last.message} (gave up after {retry.attempts} attempts)",
                        code=err.code, method=method, server=label, output=err.output) from err

    def call(self, url: str, method: str, params: dict[str, Any] | None = None, *,
             keep_alive: bool = True, positional: tuple[Any, ...] | None = None) -> Any:
        """Call and unwrap ``{code, value, output}``: the value on SUCCESS, else RPCError."""
        result = self.call_raw(url, method, params, keep_alive=keep_alive, positional=positional)
        response = as_response(result)
        if response is None:
            return result  # not a ProtoGENI struct (some dynamic-slice answers are bare)
        if not response.ok:
            raise RPCError(f"{GeniCode.name_of(response.code)}: "
                           f"{response.output or 'no detail'}", code=response.code,
                           method=method, server=server_label(url), output=response.output)
        return response.value


def _output(result: dict[str, Any]) -> str:
    out = result.get("output", "")
    return out if isinstance(out, str) else str(out)


def as_response(result: Any) -> Response | None:
    if isinstance(result, dict) and isinstance(result.get("code"), int):
        code = result["code"]
        return Response(code=code, value=result.get("value", 0), output=_output(result))
    return None
