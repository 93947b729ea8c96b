"""The cluster's own certificate authority: who may join the pilots' Dask scheduler.

:class:`ClusterCA` keeps a CA certificate and key (``ca.pem``, ``ca.key``, mode 0600) in a
directory of the manager's state, made once and reused after a restart. It issues the
control node's members (the scheduler, Troy's client, the enrolment service: role
``control``, key and certificate in ``members/``) and certifies the keys nodes make
themselves (:meth:`ClusterCA.certify`, role ``worker``: the node's key never leaves it, and
no node key is ever on the control node). Nothing here is tied to CloudLab's CA: a user certificate of the slice
does not let anyone into the cluster, and a node certificate does not let anyone into
CloudLab. Keys are written 0600 and never logged.
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

from elasticslice.errors import ElasticSliceError
from elasticslice.rpc import pki
from troy.frameworks.dask.enrol import cert_info
from troy.frameworks.dask.tls import DaskTLS

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

    def __init__(self, directory: Path, cert_pem: bytes, key_pem: bytes) -> None:
        self.directory = directory
        self.cert_pem = cert_pem
        self._key_pem = key_pem

    def __repr__(self) -> str:  # never the key
        return f"ClusterCA({str(self.directory)!r})"

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @classmethod
    def open(cls, directory: Path, common_name: str = "elasticslice cluster CA") -> ClusterCA:
        """The CA kept in ``directory`` (made on first use; the directory is 0700)."""
        directory = Path(directory).expanduser().resolve()
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            cert_path, key_path = directory / "ca.pem", directory / "ca.key"
            if cert_path.exists() and key_path.exists():
                return cls(directory, cert_path.read_bytes(), key_path.read_bytes())
            cert, key = pki.make_ca(common_name, key_type=KEY_TYPE)
            pki.write_private_file(key_path, key)
            pki.write_private_file(cert_path, cert)
        except OSError as err:
            raise ClusterCAError(f"{directory}: cannot keep the cluster CA there: "
                                 f"{err.strerror or err}") from err
        log.info("made the cluster CA in %s", directory)
        return cls(directory, cert, key)

    def issue(self, name: str, hosts: Sequence[str] = ("127.0.0.1",),
              days: float = 7, role: str = "control") -> tuple[Path, Path]:
        """A certificate for control member ``name`` (its common name, OU ``control``) and
        its key, as files ``members/<name>.pem`` and ``members/<name>.key`` (0600); issued
        once, reused while it has more than :data:`RENEW_BEFORE` seconds to live, else
        issued again (a run resumed after a week would otherwise serve an expired
        certificate). Nodes are not issued keys here: they enrol (:meth:`certify`)."""
        if role != "control":
            raise ClusterCAError(f"cannot issue a {role!r} key for {name!r}: only the control "
                                 f"node's members get keys here; nodes make their own and "
                                 f"enrol")
        safe = _SAFE.sub("_", name)[:64]
        if not safe or safe in (".", ".."):
            raise ClusterCAError(f"cannot issue a certificate for {name!r}: not a usable name")
        members = self.directory / "members"
        cert_path, key_path = members / f"{safe}.pem", members / f"{safe}.key"
        if cert_path.exists() and key_path.exists() and _lasts(cert_path, RENEW_BEFORE):
            return cert_path, key_path
        ips = [h for h in hosts if _is_ip(h)]
        names = [h for h in hosts if not _is_ip(h)]
        cert, key = pki.issue_certificate(self.cert_pem, self._key_pem, name, hostnames=names,
                                          ips=ips, days=max(1, round(days)), role=role,
                                          key_type=KEY_TYPE)
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

    def dask_tls(self, name: str = "scheduler") -> DaskTLS:
        """The TLS files of member ``name`` for Dask (the control node's by default)."""
        cert, key = self.issue(name)
        return DaskTLS(os.fspath(self.ca_file), os.fspath(cert), os.fspath(key))


def _is_ip(host: str) -> bool:
    import ipaddress
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
