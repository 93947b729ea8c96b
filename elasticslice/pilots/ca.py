"""The cluster's own certificate authority: who may join the pilots' Dask scheduler.

:class:`ClusterCA` keeps a CA certificate and key (``ca.pem``, ``ca.key``, mode 0600) in a
directory of the manager's state, made once and reused after a restart. It issues the
control node's members (the scheduler, Troy's client, the enrolment service: role
``control``, key and certificate in ``members/``) and certifies the keys nodes make
themselves (:meth:`ClusterCA.certify`, role ``worker``: the node's key never leaves it, and
no node key is ever on the control node). Nothing here is tied to CloudLab's CA: a user certificate of the slice
does not let anyone into the cluster, and a node certificate does not let anyone into
CloudLab. Keys are written 0600 and never logged.

The members' certificates last :data:`MEMBER_LIFETIME` (7 days). A server of the control
node holds its certificate in a TLS context from :meth:`ClusterCA.server_context`, which
this process renews before it expires (:func:`keep_renewed`: one daemon thread, when less
than :func:`renew_before` is left, the certificate is issued again and loaded into the same
context; new handshakes get it), so a run or a resume longer than a week keeps its TLS.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import re
import ssl
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from elasticslice.errors import ElasticSliceError
from elasticslice.rpc import pki
from troy.frameworks.dask import DaskTLS, cert_info

if TYPE_CHECKING:
    from troy.frameworks.dask import DaskFramework

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: the cluster's keys (its CA's, the control node's members'): ECDSA P-256, as the nodes'
#: own (troy.frameworks.dask.enrol): made in microseconds where RSA-2048 takes ~40 ms, and
#: cheaper in every TLS handshake between the cluster's members. A CA made before with an
#: RSA key is used as it is.
KEY_TYPE = "ec"


#: a member's certificate with less life left than this (seconds) is issued again when
#: asked for: a process started now gets one that lasts at least this long
RENEW_BEFORE = 24 * 3600.0
#: how long the control node's members' certificates last (seconds)
MEMBER_LIFETIME = 7 * 24 * 3600.0


def renew_before(lifetime: float) -> float:
    """Seconds before its end a member's certificate of ``lifetime`` seconds is issued again:
    :data:`RENEW_BEFORE`, or half its life for a shorter one (a test's)."""
    return min(RENEW_BEFORE, lifetime / 2)


def _lasts(cert_path: Path, seconds: float) -> bool:
    """Whether the certificate in ``cert_path`` is valid for ``seconds`` more (False for
    one that cannot be read)."""
    try:
        ends = cert_info(os.fspath(cert_path))[2]
    except (OSError, ValueError):
        return False
    return ends - time.time() > seconds


class ClusterCAError(ElasticSliceError):
    """The cluster CA's directory or files cannot be used."""


class ClusterCA:
    """A CA in ``directory``: :meth:`open` makes it once; :meth:`issue` signs members."""

    def __init__(self, directory: Path, cert_pem: bytes, key_pem: bytes, *,
                 member_lifetime: float = MEMBER_LIFETIME) -> None:
        if not member_lifetime > 0:
            raise ValueError(f"member_lifetime must be > 0 seconds, not {member_lifetime!r}")
        self.directory = directory
        self.cert_pem = cert_pem
        self._key_pem = key_pem
        #: seconds a member's certificate lasts (tests make it short)
        self.member_lifetime = float(member_lifetime)

    def __repr__(self) -> str:  # never the key
        return f"ClusterCA({str(self.directory)!r})"

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @classmethod
    def open(cls, directory: Path, common_name: str = "elasticslice cluster CA", *,
             member_lifetime: float = MEMBER_LIFETIME) -> ClusterCA:
        """The CA kept in ``directory`` (made on first use; the directory is 0700);
        ``member_lifetime``: seconds the members' certificates last."""
        directory = Path(directory).expanduser().resolve()
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            cert_path, key_path = directory / "ca.pem", directory / "ca.key"
            if cert_path.exists() and key_path.exists():
                return cls(directory, cert_path.read_bytes(), key_path.read_bytes(),
                           member_lifetime=member_lifetime)
            cert, key = pki.make_ca(common_name, key_type=KEY_TYPE)
            pki.write_private_file(key_path, key)
            pki.write_private_file(cert_path, cert)
        except OSError as err:
            raise ClusterCAError(f"{directory}: cannot keep the cluster CA there: "
                                 f"{err.strerror or err}") from err
        log.info("made the cluster CA in %s", directory)
        return cls(directory, cert, key, member_lifetime=member_lifetime)

    def issue(self, name: str, hosts: Sequence[str] = ("127.0.0.1",),
              days: float | None = None, role: str = "control") -> tuple[Path, Path]:
        """A certificate for control member ``name`` (its common name, OU ``control``) and
        its key, as files ``members/<name>.pem`` and ``members/<name>.key`` (0600), valid
        ``days`` (default :attr:`member_lifetime`); issued once, reused while it has more
        than :func:`renew_before` its lifetime to live, else issued again (a run resumed
        after a week would otherwise serve an expired certificate; a server's is renewed
        while it runs: :meth:`server_context`). Nodes are not issued keys here: they enrol
        (:meth:`certify`)."""
        if role != "control":
            raise ClusterCAError(f"cannot issue a {role!r} key for {name!r}: only the control "
                                 f"node's members get keys here; nodes make their own and "
                                 f"enrol")
        safe = _SAFE.sub("_", name)[:64]
        if not safe or safe in (".", ".."):
            raise ClusterCAError(f"cannot issue a certificate for {name!r}: not a usable name")
        members = self.directory / "members"
        cert_path, key_path = members / f"{safe}.pem", members / f"{safe}.key"
        lifetime = days * 86400.0 if days is not None else self.member_lifetime
        if cert_path.exists() and key_path.exists() and _lasts(cert_path,
                                                               renew_before(lifetime)):
            return cert_path, key_path
        ips = [h for h in hosts if _is_ip(h)]
        names = [h for h in hosts if not _is_ip(h)]
        cert, key = pki.issue_certificate(self.cert_pem, self._key_pem, name, hostnames=names,
                                          ips=ips, lifetime=dt.timedelta(seconds=lifetime),
                                          role=role, key_type=KEY_TYPE)
        try:
            members.mkdir(mode=0o700, exist_ok=True)
            pki.write_private_file(key_path, key)
            pki.write_private_file(cert_path, cert)
        except OSError as err:
            raise ClusterCAError(f"{members}: cannot write the certificate of {name!r}: "
                                 f"{err.strerror or err}") from err
        return cert_path, key_path

    def certify(self, name: str, public_key_pem: bytes, *, role: str = "worker",
                lifetime: float = 3600.0) -> bytes:
        """A certificate (PEM) for a key made elsewhere (a node's, from its certificate
        request): CN ``name``, OU ``role``, valid ``lifetime`` seconds. Nothing is written."""
        import datetime as dt
        cert, _ = pki.issue_certificate(self.cert_pem, self._key_pem, name, role=role,
                                        lifetime=dt.timedelta(seconds=lifetime),
                                        public_key_pem=public_key_pem)
        return cert

    def server_context(self, name: str, hosts: Sequence[str] = ("127.0.0.1",)
                       ) -> ssl.SSLContext:
        """A TLS server context (TLS 1.2 or later) holding member ``name``'s certificate for
        ``hosts`` (:meth:`issue`), renewed in this process before it expires
        (:func:`keep_renewed`). The caller adds what else it needs (client certificates)."""
        cert, key = self.issue(name, hosts)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(os.fspath(cert), os.fspath(key))
        keep_renewed(context, self, name, tuple(hosts))
        return context

    def dask_tls(self, name: str = "scheduler") -> DaskTLS:
        """The TLS files of member ``name`` for Dask (the control node's by default)."""
        cert, key = self.issue(name)
        return DaskTLS(os.fspath(self.ca_file), os.fspath(cert), os.fspath(key))


# ------------------------------------------------------------------- renewal ------------
@dataclasses.dataclass
class _Kept:
    context: weakref.ref[ssl.SSLContext]
    ca: ClusterCA
    name: str
    hosts: tuple[str, ...]
    due: float  # epoch seconds: when to issue it again


class _Renewer:
    """The process' one renewal thread: each context kept is given its member's certificate
    again (:meth:`ClusterCA.issue`, then ``load_cert_chain`` on the same context) once less
    than :func:`renew_before` of its life is left. Contexts are held weakly: a server gone,
    its context is forgotten; the thread starts with the first context and ends with the
    last."""

    RETRY = 60.0  # seconds before a failed renewal is tried again (at most)

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._kept: list[_Kept] = []
        self._thread: threading.Thread | None = None

    def add(self, context: ssl.SSLContext, ca: ClusterCA, name: str,
            hosts: tuple[str, ...]) -> None:
        kept = _Kept(weakref.ref(context), ca, name, hosts, 0.0)
        kept.due = self._due(kept)
        with self._wake:
            self._kept.append(kept)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cert-renewer",
                                                daemon=True)
                self._thread.start()
            self._wake.notify_all()

    @staticmethod
    def _due(kept: _Kept) -> float:
        lifetime = kept.ca.member_lifetime
        path = kept.ca.directory / "members" / f"{_SAFE.sub('_', kept.name)[:64]}.pem"
        try:
            ends = cert_info(os.fspath(path))[2]
        except (OSError, ValueError):
            return time.time()
        return ends - renew_before(lifetime)

    def _run(self) -> None:
        while True:
            with self._wake:
                self._kept = [k for k in self._kept if k.context() is not None]
                if not self._kept:
                    self._thread = None
                    return
                now = time.time()
                due = [k for k in self._kept if k.due <= now]
                if not due:
                    # bounded: a context dropped is forgotten within a minute
                    self._wake.wait(min(self.RETRY, min(k.due for k in self._kept) - now))
                    continue
            for kept in due:
                self._renew(kept)

    def _renew(self, kept: _Kept) -> None:
        context = kept.context()
        if context is None:
            return
        try:
            cert, key = kept.ca.issue(kept.name, kept.hosts)
            context.load_cert_chain(os.fspath(cert), os.fspath(key))
        except Exception as err:  # noqa: BLE001 - logged; tried again, the old one serves
            log.warning("cannot renew the certificate of %s: %s", kept.name, err)
            kept.due = time.time() + min(self.RETRY, renew_before(kept.ca.member_lifetime) / 4)
            return
        kept.due = self._due(kept)
        log.info("renewed the certificate of %s (valid until %s)", kept.name,
                 time.strftime("%Y-%m-%d %H:%M:%S UTC",
                               time.gmtime(kept.due + renew_before(kept.ca.member_lifetime))))


_RENEWER = _Renewer()


def keep_renewed(context: ssl.SSLContext, ca: ClusterCA, name: str,
                 hosts: tuple[str, ...] = ("127.0.0.1",)) -> None:
    """Keep member ``name``'s certificate in ``context`` fresh while the context lives: issued
    again by ``ca`` and loaded into it when less than :func:`renew_before` of its lifetime
    is left (new handshakes get the new one; the connections open keep theirs)."""
    _RENEWER.add(context, ca, name, tuple(hosts))


def renew_scheduler(framework: DaskFramework, ca: ClusterCA, name: str = "scheduler") -> int:
    """Keep member ``name``'s certificate fresh where a Dask framework holds it
    (:func:`keep_renewed` on ``DaskFramework.tls_contexts()``: its in-process scheduler's
    TLS listeners and connections out, and its client's). How many contexts are kept (0:
    none, e.g. no TLS)."""
    contexts = framework.tls_contexts()
    for context in contexts:
        keep_renewed(context, ca, name)
    return len(contexts)


def _is_ip(host: str) -> bool:
    import ipaddress
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
