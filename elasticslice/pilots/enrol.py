"""Enrolment: a node gets its cluster certificate without any private key leaving it.

Each node's install tarball carries the cluster CA's certificate and a single-use token
bound to its client_id, valid until the node's boot deadline (:meth:`EnrolmentService.
token_for`); no key. On the node, ``python -m troy.frameworks.dask.enrol`` makes the node's
key, and sends a certificate request (CSR, CN = its client_id) with the token over HTTPS
that pins the cluster CA; :class:`EnrolmentService` answers with a short-lived certificate
(CN = client_id, OU = ``worker``, ``cert_lifetime`` seconds). The node agent renews it
before it expires: it authenticates with its current worker certificate (mutual TLS) and
sends a new CSR; renewed only while the node is held.

A token is taken only from its node's own address (``address_of(client_id)``: the
control address its manifest gives it; the TCP peer of the request must be that address):
a token read elsewhere (every node of the slice can read the manifest, hence the tarball's
URL) is refused there, stays unspent for its node, and is counted (:attr:`foreign`). From
the node's address, a token is good for one presentation, whatever its outcome; a token
presented again is refused and counted (:attr:`replays`): it never costs the node anything
(whoever could replay it from the node's own address is on the node already).

Refused, each with one line (a 4xx; a 503 "try again" while the node's address is not known
yet) and a log line that never shows the token: an unknown, used or expired token, a token
from another address than its node's, a token of another node, a node the manager does not
hold (``is_held``), a request whose CN is not the client_id. Log lines of refusals are
bounded: the first of each kind per node is a WARNING, the rest DEBUG (the counters say how
many). Only a hash of each token is kept, in memory, and with ``keep`` in a file (0600) that
the next service on the same file reads: a node still booting when the control process was
killed enrols with the next one (a SHA-256 of a 256-bit token tells nothing of the token);
:meth:`EnrolmentService.forget` drops a node's, :meth:`~EnrolmentService.stop` all of them in
memory.

Certificates given to a node that left are refused from then on, not at their expiry:
:meth:`~EnrolmentService.forget` puts the serial numbers of every certificate the service
issued to that node (kept with the tokens) on the deny list ``deny``
(:class:`troy.frameworks.dask.denylist.DenyList`), which the scheduler's guard reads too; a
renewal with a denied certificate is refused.

    POST /enrol  {"token": T, "client_id": C, "csr": PEM}   -> {"certificate": PEM}
    POST /renew  {"csr": PEM}  (client certificate: OU=worker, CN=C) -> {"certificate": PEM}
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import secrets
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.enrolhttp import Refused, Server, read_csr
from elasticslice.pilots.publish import serve_in_thread, server_url, stop_serving
from elasticslice.pilots.restart import read_json, write_json
from troy.frameworks.dask import DenyList, serial_of

log = logging.getLogger(__name__)


class NotYet(ValueError):
    """``on_key`` cannot authorise the key yet (its manager is starting): answered 503, and
    the node tries again."""


class EnrolmentError(ElasticSliceError):
    """The enrolment service cannot start."""


@dataclasses.dataclass
class _Token:
    client_id: str
    deadline: float
    used: bool = False


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class EnrolmentService:
    """Issues nodes their short-lived worker certificates (see the module docstring).

    ``ca``: the cluster CA; ``listen``/``port``: where it serves HTTPS (port 0: any free);
    ``is_held(client_id)``: whether the manager holds (or is adding) that node;
    ``address_of(client_id)``: the node's control address as its manifest gives it (None:
    not known yet; the node is asked to try again); None: tokens are taken from any address
    (a service for tests and tools that know no manifest);
    ``cert_lifetime``: seconds a node certificate is valid;
    ``on_enrolled(client_id)``: called (on the request's thread) when a node got its first
    certificate (its token is spent: the slice's tarball stops carrying it); ``keep``: a
    file where the tokens' hashes and bindings, and the serials of the certificates issued,
    are kept for the next service (the cluster's next process on the same state
    directory), read now; None: in memory only; ``deny``: the deny list a node's
    certificates go on when it leaves (None: none kept)."""

    def __init__(self, ca: ClusterCA, listen: str = "127.0.0.1", port: int = 0, *,
                 is_held: Callable[[str], bool] = lambda client_id: False,
                 address_of: Callable[[str], str | None] | None = None,
                 cert_lifetime: float = 3600.0,
                 on_enrolled: Callable[[str], None] | None = None,
                 keep: Path | None = None, deny: DenyList | None = None,
                 on_key: Callable[[str, str], dict[str, str]] | None = None) -> None:
        if not cert_lifetime > 0:
            raise ValueError(f"cert_lifetime must be > 0 seconds, not {cert_lifetime!r}")
        self.ca = ca
        self.listen, self.port = listen, port
        self.is_held = is_held
        self.address_of = address_of
        self.cert_lifetime = float(cert_lifetime)
        self.on_enrolled = on_enrolled
        self.deny = deny
        self._tokens: dict[str, _Token] = {}   # sha256 of the token -> its binding
        self._issued: dict[str, dict[int, float]] = {}  # client_id -> serial -> expiry
        self._warned: set[tuple[str, int]] = set()
        self._forgotten: set[str] = set()
        self._lock = threading.Lock()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self.enrolled = 0   # certificates issued to a token
        self.renewed = 0    # certificates renewed
        self.replays = 0    # spent tokens presented again (from their node's address)
        self.foreign = 0    # tokens presented from another address than their node's
        self.refused = 0    # requests refused, all reasons
        self.keep = keep
        #: ``on_key(client_id, public_key)``: authorise a node's own public key (Parsl's
        #: CurveZMQ key) after it enrolled; its answer goes back to the node; a ValueError
        #: is a refusal (its line). None: ``/key`` is refused.
        self.on_key = on_key
        if keep is not None:
            self._tokens, self._issued = self._kept(keep)

    @staticmethod
    def _kept(path: Path) -> tuple[dict[str, _Token], dict[str, dict[int, float]]]:
        """The unexpired tokens' bindings and certificates' serials ``path`` keeps (a
        damaged file keeps none: those nodes fail to enrol and are replaced, as without
        the file)."""
        try:
            data = read_json(path) or {}
            now = time.time()
            tokens = {str(digest): _Token(str(client_id), float(deadline), bool(used))
                      for digest, (client_id, deadline, used)
                      in data.get("tokens", {}).items() if float(deadline) > now}
            issued = {str(cid): {int(str(s), 16): float(until) for s, until in serials
                                 if float(until) > now}
                      for cid, serials in data.get("issued", {}).items()}
            return tokens, issued
        except (ElasticSliceError, ValueError, TypeError, AttributeError) as err:
            log.warning("%s: the enrolment tokens of the last process are not read: %s",
                        path, err)
            return {}, {}

    def _save(self) -> None:
        """Keep the bindings (called with the lock held); a failure is one warning."""
        if self.keep is None:
            return
        data = {"tokens": {d: [t.client_id, t.deadline, t.used]
                           for d, t in self._tokens.items()},
                "issued": {cid: [[format(s, "X"), until] for s, until in serials.items()]
                           for cid, serials in self._issued.items() if serials}}
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
        context = self.ca.server_context("enrolment", hosts=(self.listen,))  # renewed
        context.load_verify_locations(cadata=self.ca.cert_pem.decode())
        context.verify_mode = ssl.CERT_OPTIONAL  # renewals show their worker certificate
        try:
            self._server = Server(self, self.listen, self.port, context)
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
        """``client_id`` left: its token and its renewals are refused from now on, and the
        certificates issued to it go on the deny list."""
        with self._lock:
            for digest in [d for d, t in self._tokens.items() if t.client_id == client_id]:
                del self._tokens[digest]
            self._forgotten.add(client_id)
            serials = self._issued.pop(client_id, {})
            self._save()
        if serials and self.deny is not None:
            try:
                self.deny.deny(serials)
            except OSError as err:
                log.error("cannot deny the certificates of %s (%s): %s", client_id,
                          self.deny.path, err.strerror or err)
            else:
                log.info("node %s left: its %d certificate(s) are refused from now on",
                         client_id, len(serials))

    def tokens(self) -> int:
        """How many tokens are kept (used ones included)."""
        with self._lock:
            return len(self._tokens)

    # ------------------------------------------------------------------ answers
    def _refuse(self, client_id: Any, status: int, line: str) -> Refused:
        """A refusal; its log line a WARNING the first time for this node and status, DEBUG
        after (a stranger retrying, or thousands of them, cannot fill the log)."""
        name = str(client_id)[:64]
        with self._lock:
            self.refused += 1
            first = (name, status) not in self._warned and len(self._warned) < 1024
            if first:
                self._warned.add((name, status))
        log.log(logging.WARNING if first else logging.DEBUG, "enrolment of %r refused: %s%s",
                name, line, " (further refusals of it: DEBUG)" if first else "")
        return Refused(status, line)

    def enrol(self, body: dict[str, Any], peer: str | None = None) -> dict[str, str]:
        """Answer a node's enrolment request ``body`` made from the address ``peer``."""
        token, client_id = body.get("token"), body.get("client_id")
        if not isinstance(client_id, str) or not client_id or len(client_id) > 64:
            raise self._refuse(client_id, 400, "expected the node's client_id in 'client_id'")
        if not isinstance(token, str) or not token or len(token) > 256:
            raise self._refuse(client_id, 400, "expected the enrolment token in 'token'")
        with self._lock:
            found = self._tokens.get(_digest(token))
        if found is None:
            raise self._refuse(client_id, 403, "unknown enrolment token (never issued, "
                                               "or its node is gone)")
        if self.address_of is not None:
            # before the token is spent: a token read elsewhere stays its node's
            expected = self.address_of(found.client_id)
            if expected is None:
                raise self._refuse(client_id, 503, f"the address of {found.client_id} is "
                                                   f"not known yet: try again")
            if peer != expected:
                with self._lock:
                    self.foreign += 1
                raise self._refuse(client_id, 403, f"this enrolment token is taken only "
                                                   f"from its node's own address, not from "
                                                   f"{peer}")
        with self._lock:
            replay, found.used = found.used, True
            if replay:
                self.replays += 1
            self._save()
        if replay:
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
        """A worker certificate for the key of the request in ``body`` (its CN checked);
        its serial kept, for the deny list when the node leaves."""
        try:
            public = read_csr(body.get("csr"), client_id)
        except Refused as err:
            raise self._refuse(client_id, err.status, err.line) from None
        pem = self.ca.certify(client_id, public, role="worker", lifetime=self.cert_lifetime)
        cert = x509.load_pem_x509_certificate(pem)
        with self._lock:
            self._issued.setdefault(client_id, {})[cert.serial_number] = \
                cert.not_valid_after_utc.timestamp()
            self._save()
        return pem

    def renew(self, body: dict[str, Any], peer: dict[str, Any] | None) -> dict[str, str]:
        subject = {k: v for rdn in (peer or {}).get("subject", ()) for k, v in rdn}
        client_id, role = subject.get("commonName"), subject.get("organizationalUnitName")
        if not peer or not client_id:
            raise self._refuse(None, 401, "renewal needs the node's current certificate")
        if role != "worker":
            raise self._refuse(client_id, 403, "only a node's worker certificate is renewed")
        if self.deny is not None and self.deny.denied(serial_of(peer)):
            raise self._refuse(client_id, 403, "this certificate was revoked (its node "
                                               "left the cluster)")
        with self._lock:
            forgotten = client_id in self._forgotten
        if forgotten or not self.is_held(client_id):
            raise self._refuse(client_id, 403, f"{client_id} is not a node of this cluster")
        cert = self._certify(client_id, body)
        self.renewed += 1
        log.info("node %s renewed its certificate (valid %g s)", client_id, self.cert_lifetime)
        return {"certificate": cert.decode()}

    def authorise_key(self, body: dict[str, Any], peer: dict[str, Any] | None
                      ) -> dict[str, str]:
        """``POST /key {"client_id": C, "public_key": K}``: a node, authenticated as
        :meth:`renew` authenticates it (its current worker certificate, CN = C, a node held
        and not forgotten), has ``on_key(C, K)`` authorise its own public key; the answer
        is ``on_key``'s. Only a public key travels: the node keeps its secret."""
        subject = {k: v for rdn in (peer or {}).get("subject", ()) for k, v in rdn}
        client_id, role = subject.get("commonName"), subject.get("organizationalUnitName")
        if not peer or not client_id:
            raise self._refuse(None, 401, "a key is authorised only with the node's worker "
                                          "certificate")
        if role != "worker":
            raise self._refuse(client_id, 403, "only a node's worker certificate authorises "
                                               "a key")
        if self.deny is not None and self.deny.denied(serial_of(peer)):
            raise self._refuse(client_id, 403, "this certificate was revoked (its node "
                                               "left the cluster)")
        claimed = body.get("client_id", client_id)
        if claimed != client_id:
            raise self._refuse(client_id, 403, f"this certificate is {client_id}'s, not "
                                               f"{str(claimed)[:64]!r}'s")
        with self._lock:
            forgotten = client_id in self._forgotten
        if forgotten or not self.is_held(client_id):
            raise self._refuse(client_id, 403, f"{client_id} is not a node of this cluster")
        if self.on_key is None:
            raise self._refuse(client_id, 404, "this cluster authorises no node keys")
        public = body.get("public_key")
        if not isinstance(public, str) or not public or len(public) > 256:
            raise self._refuse(client_id, 400, "expected the node's public key in "
                                               "'public_key'")
        try:
            answer = self.on_key(client_id, public)
        except NotYet as err:
            raise self._refuse(client_id, 503, str(err) or "not yet: try again") from None
        except ValueError as err:
            raise self._refuse(client_id, 400, str(err).splitlines()[0] if str(err)
                               else "the key is refused") from None
        log.info("node %s: its public key is authorised", client_id)
        return answer
