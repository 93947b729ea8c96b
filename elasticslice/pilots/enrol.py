"""Enrolment: a node gets its cluster certificate without any private key leaving it.

Each node's install tarball carries the cluster CA's certificate and a single-use token
bound to its client_id, valid until the node's boot deadline (:meth:`EnrolmentService.
token_for`); no key. On the node, ``python -m troy.frameworks.dask.enrol`` makes the node's
key, and sends a certificate request (CSR, CN = its client_id) with the token over HTTPS
that pins the cluster CA; :class:`EnrolmentService` answers with a short-lived certificate
(CN = client_id, OU = ``worker``, ``cert_lifetime`` seconds). The node agent renews it
before it expires: it authenticates with its current worker certificate (mutual TLS) and
sends a new CSR; renewed only while the node is held.

Refused, each with one line (a 4xx) and a log line that never shows the token: an unknown,
used or expired token, a token of another node, a node the manager does not hold
(``is_held``), a request whose CN is not the client_id. A token is good for one
presentation, whatever its outcome; a token presented again is an alarm:
``on_alarm(client_id, why)`` (the cluster replaces that node). Only a hash of each token is
kept, in memory, and with ``keep`` in a file (0600) that the next service on the same file
reads: a node still booting when the control process was killed enrols with the next one
(a SHA-256 of a 256-bit token tells nothing of the token); :meth:`EnrolmentService.forget`
drops a node's, :meth:`~EnrolmentService.stop` all of them in memory.

    POST /enrol  {"token": T, "client_id": C, "csr": PEM}   -> {"certificate": PEM}
    POST /renew  {"csr": PEM}  (client certificate: OU=worker, CN=C) -> {"certificate": PEM}
"""
from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import logging
import os
import secrets
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.publish import serve_in_thread, server_url, stop_serving
from elasticslice.pilots.restart import read_json, write_json
from elasticslice.serving import GuardedServer, Limits, buffered, default_cap

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # a CSR and a token fit in far less


class EnrolmentError(ElasticSliceError):
    """The enrolment service cannot start."""


class Refused(Exception):
    """A request refused: ``status`` and one line for the node."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(line)
        self.status, self.line = status, line


@dataclasses.dataclass
class _Token:
    client_id: str
    deadline: float
    used: bool = False


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_csr(pem: Any, client_id: str) -> bytes:
    """The public key (PEM) of a CSR whose signature verifies and whose CN is
    ``client_id``; :class:`Refused` otherwise."""
    if not isinstance(pem, str) or "BEGIN CERTIFICATE REQUEST" not in pem:
        raise Refused(400, "expected a PEM certificate request in 'csr'")
    try:
        csr = x509.load_pem_x509_csr(pem.encode())
    except ValueError as err:
        raise Refused(400, f"the certificate request cannot be read: {err}") from None
    if not csr.is_signature_valid:
        raise Refused(400, "the certificate request's signature does not verify")
    names = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names != [client_id]:
        raise Refused(403, f"the certificate request is for {names[0] if names else 'no CN'!r},"
                           f" not {client_id!r}")
    return csr.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        service = self.server.service
        try:
            body = self._body()
            if self.path == "/enrol":
                answer = service.enrol(body)
            elif self.path == "/renew":
                answer = service.renew(body, self.connection.getpeercert())
            else:
                raise Refused(404, f"no such service: {self.path[:64]!r}")
        except Refused as err:
            self._send(err.status, (err.line + "\n").encode(), "text/plain; charset=utf-8")
            return
        except Exception:  # noqa: BLE001 - never a traceback to the node
            log.exception("enrolment: cannot answer %s", self.path[:64])
            self._send(500, b"internal error: see the control node's log\n", "text/plain")
            return
        self._send(200, json.dumps(answer).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802
        self._send(405, b"POST /enrol or /renew\n", "text/plain")

    def _body(self) -> dict[str, Any]:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise Refused(411, "a Content-Length is required") from None
        if not 0 < length <= MAX_BODY:
            raise Refused(413, f"a request of {length} bytes: at most {MAX_BODY}")
        try:
            data = json.loads(self.rfile.read(length))
        except ValueError:
            raise Refused(400, "expected a JSON object") from None
        if not isinstance(data, dict):
            raise Refused(400, "expected a JSON object")
        return data

    def _send(self, status: int, data: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # requests carry tokens: the service logs its own lines, without them


class _Server(GuardedServer):
    """A guarded listener (:mod:`elasticslice.serving`): TLS handshakes and whole requests
    are read off the accepting thread within deadlines, no thread is given to an idle or
    trickling stranger, and refused handshakes are counts in a log line a minute."""

    #: a node enrols once and renews hourly; a CSR is small
    LIMITS = Limits(max_connections=default_cap(), handshake_deadline=5.0,
                    request_deadline=10.0, response_deadline=30.0, io_timeout=10.0,
                    workers=4, max_body=MAX_BODY)

    def __init__(self, service: EnrolmentService, host: str, port: int,
                 context: ssl.SSLContext, limits: Limits | None = None) -> None:
        self.service = service
        self.context = context
        super().__init__((host, port), buffered(_Handler), limits=limits or self.LIMITS,
                         tls=context, name="enrolment service")


class EnrolmentService:
    """Issues nodes their short-lived worker certificates (see the module docstring).

    ``ca``: the cluster CA; ``listen``/``port``: where it serves HTTPS (port 0: any free);
    ``is_held(client_id)``: whether the manager holds (or is adding) that node;
    ``cert_lifetime``: seconds a node certificate is valid; ``on_alarm(client_id, why)``:
    called (on the request's thread) when a token is presented a second time;
    ``on_enrolled(client_id)``: called (on the request's thread) when a node got its first
    certificate (its token is spent: the slice's tarball stops carrying it); ``keep``: a
    file where the tokens' hashes and bindings are kept for the next service (the cluster's
    next process on the same state directory), read now; None: in memory only."""

    def __init__(self, ca: ClusterCA, listen: str = "127.0.0.1", port: int = 0, *,
                 is_held: Callable[[str], bool] = lambda client_id: False,
                 cert_lifetime: float = 3600.0,
                 on_alarm: Callable[[str, str], None] | None = None,
                 on_enrolled: Callable[[str], None] | None = None,
                 keep: Path | None = None) -> None:
        if not cert_lifetime > 0:
            raise ValueError(f"cert_lifetime must be > 0 seconds, not {cert_lifetime!r}")
        self.ca = ca
        self.listen, self.port = listen, port
        self.is_held = is_held
        self.cert_lifetime = float(cert_lifetime)
        self.on_alarm = on_alarm
        self.on_enrolled = on_enrolled
        self._tokens: dict[str, _Token] = {}   # sha256 of the token -> its binding
        self._forgotten: set[str] = set()
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.enrolled = 0   # certificates issued to a token
        self.renewed = 0    # certificates renewed
        self.keep = keep
        if keep is not None:
            self._tokens = self._kept(keep)

    @staticmethod
    def _kept(path: Path) -> dict[str, _Token]:
        """The unexpired tokens' bindings ``path`` keeps (a damaged file keeps none: those
        nodes fail to enrol and are replaced, as without the file)."""
        try:
            data = read_json(path) or {}
            now = time.time()
            return {str(digest): _Token(str(client_id), float(deadline), bool(used))
                    for digest, (client_id, deadline, used) in data.get("tokens", {}).items()
                    if float(deadline) > now}
        except (ElasticSliceError, ValueError, TypeError, AttributeError) as err:
            log.warning("%s: the enrolment tokens of the last process are not read: %s",
                        path, err)
            return {}

    def _save(self) -> None:
        """Keep the bindings (called with the lock held); a failure is one warning."""
        if self.keep is None:
            return
        data = {"tokens": {d: [t.client_id, t.deadline, t.used]
                           for d, t in self._tokens.items()}}
        try:
            write_json(self.keep, data)
        except OSError as err:
            log.warning("%s: cannot keep the enrolment tokens' hashes: %s", self.keep,
                        err.strerror or err)

    def __repr__(self) -> str:  # never a token
        return f"EnrolmentService({self.url if self._server else 'not started'})"

    # ------------------------------------------------------------------ serving
    @property
    def url(self) -> str:
        if self._server is None:
            raise EnrolmentError("the enrolment service is not started")
        return server_url(self._server, "https")

    @property
    def bound_port(self) -> int:
        if self._server is None:
            raise EnrolmentError("the enrolment service is not started")
        return int(self._server.server_address[1])

    def start(self) -> EnrolmentService:
        cert, key = self.ca.issue("enrolment", hosts=(self.listen,))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(os.fspath(cert), os.fspath(key))
        context.load_verify_locations(cadata=self.ca.cert_pem.decode())
        context.verify_mode = ssl.CERT_OPTIONAL  # renewals show their worker certificate
        try:
            self._server = _Server(self, self.listen, self.port, context)
        except OSError as err:
            raise EnrolmentError(f"cannot serve enrolment on {self.listen}:{self.port}: "
                                 f"{err.strerror or err}") from err
        self._thread = serve_in_thread(self._server, "pilot-enrolment")
        return self

    def stop(self) -> None:
        """Stop serving; every token is gone."""
        with self._lock:
            self._tokens.clear()
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        stop_serving(server, thread)

    # ------------------------------------------------------------------ tokens
    def token_for(self, client_id: str, deadline: float) -> str:
        """A new single-use token for ``client_id``, valid until ``deadline`` (epoch
        seconds); an earlier token of the same node is void."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            for digest in [d for d, t in self._tokens.items() if t.client_id == client_id]:
                del self._tokens[digest]
            self._tokens[_digest(token)] = _Token(client_id, float(deadline))
            self._forgotten.discard(client_id)
            self._save()
        return token

    def forget(self, client_id: str) -> None:
        """``client_id`` left: its token and its renewals are refused from now on."""
        with self._lock:
            for digest in [d for d, t in self._tokens.items() if t.client_id == client_id]:
                del self._tokens[digest]
            self._forgotten.add(client_id)
            self._save()

    def tokens(self) -> int:
        """How many tokens are kept (used ones included)."""
        with self._lock:
            return len(self._tokens)

    # ------------------------------------------------------------------ answers
    def _refuse(self, client_id: Any, status: int, line: str) -> Refused:
        log.warning("enrolment of %r refused: %s", str(client_id)[:64], line)
        return Refused(status, line)

    def enrol(self, body: dict[str, Any]) -> dict[str, str]:
        token, client_id = body.get("token"), body.get("client_id")
        if not isinstance(client_id, str) or not client_id or len(client_id) > 64:
            raise self._refuse(client_id, 400, "expected the node's client_id in 'client_id'")
        if not isinstance(token, str) or not token or len(token) > 256:
            raise self._refuse(client_id, 400, "expected the enrolment token in 'token'")
        alarm = None
        with self._lock:
            found = self._tokens.get(_digest(token))
            if found is not None:
                alarm, found.used = found.used, True
                self._save()
        if found is None:
            raise self._refuse(client_id, 403, "unknown enrolment token (never issued, "
                                               "or its node is gone)")
        if alarm:
            why = (f"its enrolment token was presented again (by a node saying it is "
                   f"{client_id!r}): the token leaked")
            log.warning("ALARM: node %s: %s", found.client_id, why)
            if self.on_alarm is not None:
                try:
                    self.on_alarm(found.client_id, why)
                except Exception:  # noqa: BLE001 - the refusal stands
                    log.exception("enrolment: the alarm handler failed")
            raise self._refuse(client_id, 403, "enrolment token already used")
        if found.client_id != client_id:
            raise self._refuse(client_id, 403, f"this enrolment token is not {client_id}'s")
        if time.time() > found.deadline:
            raise self._refuse(client_id, 403, "enrolment token expired (the node's boot "
                                               "deadline passed)")
        if not self.is_held(client_id):
            raise self._refuse(client_id, 403, f"{client_id} is not a node of this cluster")
        cert = self._certify(client_id, body)
        self.enrolled += 1
        log.info("node %s enrolled (certificate valid %g s)", client_id, self.cert_lifetime)
        if self.on_enrolled is not None:
            try:
                self.on_enrolled(client_id)
            except Exception:  # noqa: BLE001 - the node has its certificate
                log.exception("enrolment: the handler of %s's enrolment failed", client_id)
        return {"certificate": cert.decode()}

    def _certify(self, client_id: str, body: dict[str, Any]) -> bytes:
        """A worker certificate for the key of the request in ``body`` (its CN checked)."""
        try:
            public = read_csr(body.get("csr"), client_id)
        except Refused as err:
            raise self._refuse(client_id, err.status, err.line) from None
        return self.ca.certify(client_id, public, role="worker", lifetime=self.cert_lifetime)

    def renew(self, body: dict[str, Any], peer: dict[str, Any] | None) -> dict[str, str]:
        subject = {k: v for rdn in (peer or {}).get("subject", ()) for k, v in rdn}
        client_id, role = subject.get("commonName"), subject.get("organizationalUnitName")
        if not peer or not client_id:
            raise self._refuse(None, 401, "renewal needs the node's current certificate")
        if role != "worker":
            raise self._refuse(client_id, 403, "only a node's worker certificate is renewed")
        with self._lock:
            forgotten = client_id in self._forgotten
        if forgotten or not self.is_held(client_id):
            raise self._refuse(client_id, 403, f"{client_id} is not a node of this cluster")
        cert = self._certify(client_id, body)
        self.renewed += 1
        log.info("node %s renewed its certificate (valid %g s)", client_id, self.cert_lifetime)
        return {"certificate": cert.decode()}
