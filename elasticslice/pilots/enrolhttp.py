"""The enrolment service's HTTPS face: a guarded listener (:mod:`elasticslice.serving`)
that reads a request whole within its deadlines, a bounded JSON body, and the routes of
:class:`~elasticslice.pilots.enrol.EnrolmentService` (``/enrol``, ``/renew``, ``/key``).
A refusal is :class:`Refused`: its status and one line for the node, never a traceback.
Requests carry tokens: nothing here logs a request line.
"""
from __future__ import annotations

import http.server
import json
import logging
import ssl
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from elasticslice.serving import GuardedServer, Limits, buffered, default_cap

if TYPE_CHECKING:
    from elasticslice.pilots.enrol import EnrolmentService

log = logging.getLogger("elasticslice.pilots.enrol")

MAX_BODY = 64 * 1024  # a CSR and a token fit in far less



class Refused(Exception):
    """A request refused: ``status`` and one line for the node."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(line)
        self.status, self.line = status, line


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
    server: Server
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        service = self.server.service
        try:
            body = self._body()
            if self.path == "/enrol":
                answer = service.enrol(body, self.client_address[0])
            elif self.path == "/renew":
                answer = service.renew(body, self.connection.getpeercert())
            elif self.path == "/key":
                answer = service.authorise_key(body, self.connection.getpeercert())
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


class Server(GuardedServer):
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
