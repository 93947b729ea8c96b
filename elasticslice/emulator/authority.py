"""The emulator's authorities: who it is (domain, URNs), what it signs, and what it trusts.

The SA signs user and slice credentials with its certificate, the CM signs sliver
credentials with its own; both chain to the emulator's CA. A credential counts only when the
authority of its target signed it (a user of the same CA is no authority), its target_gid is
the target's certificate, or when it is a valid delegation of such a credential
(:mod:`elasticslice.rpc.credential`). Methods that change a slice need the ``control``
privilege; those that only read it accept ``info``. Every check says why it failed, in
CloudLab's words where we know them.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import re
import threading
import uuid as uuidlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from elasticslice.emulator.geni import GeniFault
from elasticslice.errors import CredentialError
from elasticslice.rpc import credential as credlib
from elasticslice.rpc import pki
from elasticslice.rpc.codes import GeniCode

SLICE_NAME = re.compile(r"^[a-zA-Z][-a-zA-Z0-9]{0,18}$")
URN = re.compile(r"^urn:publicid:IDN\+([^+]+)\+([a-z]+)\+(.+)$")
_CACHE_SIZE = 2048
# CM and dynslice methods that only read a slice: a credential with ``info`` will do.
READ_METHODS = frozenset({"SliverStatus", "GetSliver", "Resolve", "DiscoverResources"})


class Privilege(str, Enum):
    """The GENI privileges the emulator checks (``*`` grants both)."""

    INFO = "info"
    CONTROL = "control"

    @classmethod
    def for_method(cls, method: str) -> Privilege:
        return cls.INFO if method in READ_METHODS else cls.CONTROL


def grants(cred: credlib.Credential, privilege: Privilege) -> bool:
    """Whether ``cred`` carries ``privilege`` (``control`` implies ``info``)."""
    names = {name for name, _ in cred.privileges}
    return (not names or "*" in names or privilege.value in names
            or (privilege is Privilege.INFO and Privilege.CONTROL.value in names))


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def from_epoch(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc)


@dataclass(frozen=True)
class Urn:
    authority: str
    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> Urn | None:
        m = URN.match(text or "")
        return cls(m.group(1), m.group(2), m.group(3)) if m else None


@dataclass(frozen=True)
class Identity:
    """The emulator's names: its domain and the URNs of its authorities and admin."""

    domain: str

    @property
    def sa_urn(self) -> str:
        return f"urn:publicid:IDN+{self.domain}+authority+sa"

    @property
    def cm_urn(self) -> str:
        return f"urn:publicid:IDN+{self.domain}+authority+cm"

    @property
    def admin_urn(self) -> str:
        return f"urn:publicid:IDN+{self.domain}+user+emulator-admin"

    def user_urn(self, uid: str) -> str:
        return f"urn:publicid:IDN+{self.domain}+user+{uid}"

    def node_urn(self, node_id: str) -> str:
        return f"urn:publicid:IDN+{self.domain}+node+{node_id}"

    def sliver_urn(self, name: str) -> str:
        return f"urn:publicid:IDN+{self.domain}+sliver+{name}"

    def image_urn(self, name: str) -> str:
        return f"urn:publicid:IDN+{self.domain}+image+emulab-ops//{name}"

    def slice_urn_from(self, urn: str | None, hrn: str | None) -> str:
        """The slice URN a call names, by URN or hrn (a bare hrn gets our domain)."""
        if urn:
            parsed = Urn.parse(urn)
            if parsed is None or parsed.kind != "slice":
                raise GeniFault(GeniCode.BADARGS, f"Malformed slice urn: {urn}")
            return urn
        if not hrn:
            raise GeniFault(GeniCode.BADARGS, "Must provide a urn or hrn")
        authority, _, name = hrn.rpartition(".")
        if authority and not (authority == self.domain or authority.startswith(self.domain + ":")):
            # hrn like "emulab.test.myslice": authority is everything before the last dot.
            raise GeniFault(GeniCode.SEARCHFAILED, f"No such slice authority: {authority}")
        return f"urn:publicid:IDN+{authority or self.domain}+slice+{name}"

    def slice_name(self, slice_urn: str) -> str:
        parsed = Urn.parse(slice_urn)
        return parsed.name if parsed else slice_urn

    def check_slice_urn(self, slice_urn: str) -> str:
        """The slice name, if the URN is ours and the name CloudLab would accept."""
        parsed = Urn.parse(slice_urn)
        if parsed is None or parsed.kind != "slice":
            raise GeniFault(GeniCode.BADARGS, f"Malformed slice urn: {slice_urn}")
        if not (parsed.authority == self.domain or parsed.authority.startswith(self.domain + ":")):
            raise GeniFault(GeniCode.FORBIDDEN, f"Not a slice of this authority: {slice_urn}")
        if not SLICE_NAME.match(parsed.name):
            raise GeniFault(GeniCode.BADARGS, "Slice name must be a letter followed by at most "
                                              f"18 letters, digits or hyphens: {parsed.name}")
        return parsed.name


class Authority:
    """Signs and checks credentials with the keys in the emulator directory."""

    identity_days = 30

    def __init__(self, directory: Path, identity: Identity, cm_home: Path | None = None
                 ) -> None:
        self.directory = directory
        self.cm_home = cm_home or directory  # where this CM's cm.pem is (a cluster's home)
        self.identity = identity
        self._cache: OrderedDict[str, credlib.Credential] = OrderedDict()
        self._lock = threading.Lock()
        self.ca_pem = b""
        self._gid_parts: dict[str, tuple[x509.Certificate, Any, Any]] = {}
        # target URN -> the certificate the emulator keeps for it (slices: their GID)
        self.known_gid: Callable[[str], str | None] | None = None

    def load(self) -> Authority:
        d = self.directory
        self.ca_pem = (d / "ca.pem").read_bytes()
        self.ca_key = (d / "ca-key.pem").read_bytes()
        self.sa_cert = (d / "sa.pem").read_bytes()
        self.sa_key = (d / "sa-key.pem").read_bytes()
        self.cm_cert = (self.cm_home / "cm.pem").read_bytes()
        self.cm_key = (self.cm_home / "cm-key.pem").read_bytes()
        self._roots = pki.load_trusted([self.ca_pem])
        self._signers = {"sa": [pki.load_pem_cert(self.sa_cert)],
                         "cm": [pki.load_pem_cert(self.cm_cert)]}
        return self

    def authorities(self, target_urn: str) -> list[x509.Certificate]:
        """Who may sign credentials for a target: the SA for slices and users, the CM for
        slivers, no one else (a user's certificate from the same CA is no authority)."""
        parsed = Urn.parse(target_urn)
        role = credlib.AUTHORITY_ROLES.get(parsed.kind) if parsed else None
        return self._signers.get(role or "", [])

    # ---- issuing
    def _gid_signer(self, role: str) -> tuple[x509.Certificate, Any, Any]:
        if role not in self._gid_parts:  # loading an RSA key costs ~50 ms: do it once
            cert = self.sa_cert if role == "sa" else self.cm_cert
            self._gid_parts[role] = (pki.load_pem_cert(self.ca_pem),
                                     pki.load_private_key(self.ca_key),
                                     pki.load_pem_cert(cert).public_key())
        return self._gid_parts[role]

    def slice_gid(self, slice_urn: str) -> str:
        """A CA-signed certificate naming the slice (its GID).

        No one ever holds a slice's key, so every slice GID shares the SA's public key:
        issuing one is a signature, not an RSA key generation.
        """
        return self._gid(slice_urn, self.identity.slice_name(slice_urn), "sa")

    def sliver_gid(self, sliver_urn: str) -> str:
        """A CA-signed certificate naming the sliver (the target of sliver credentials)."""
        return self._gid(sliver_urn, "sliver " + sliver_urn.rsplit("+", 1)[-1], "cm")

    def _gid(self, urn: str, common_name: str, role: str) -> str:
        ca, ca_key, public = self._gid_signer(role)
        now = utcnow()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca.subject)
                .public_key(public).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=self.identity_days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName(
                    [x509.UniformResourceIdentifier(urn)]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        return cert.public_bytes(serialization.Encoding.PEM).decode()

    def credential(self, owner_gid: str, owner_urn: str, target_gid: str, target_urn: str,
                   expires: dt.datetime, *, by_cm: bool = False,
                   within: credlib.Credential | None = None) -> str:
        """A credential signed by the SA (or the CM: ``by_cm``).

        ``within``: a credential the new one must stay within (its privileges, its expiry).
        Callers pass the credential a delegate presented, so that asking again (GetSliver,
        RenewSlice) never widens what the slice's owner delegated.
        """
        privileges: list[tuple[str, bool]] = [("*", True)]
        if within is not None:
            privileges = list(within.privileges)
            expires = min(expires, within.expires)
        cred = credlib.Credential(owner_gid=owner_gid, owner_urn=owner_urn,
                                  target_gid=target_gid, target_urn=target_urn,
                                  expires=expires.replace(microsecond=0), privileges=privileges)
        cert, key = (self.cm_cert, self.cm_key) if by_cm else (self.sa_cert, self.sa_key)
        return credlib.sign_credential(cred, cert, key)

    # ---- checking
    def verify(self, xml: str, caller_urn: str,
               privilege: Privilege | None = None) -> credlib.Credential:
        """A credential that is valid (who may sign what), unexpired, the caller's, and
        grants ``privilege`` if given; otherwise FORBIDDEN naming why."""
        if not isinstance(xml, str) or not xml.strip():
            raise GeniFault(GeniCode.BADARGS, "Malformed credential")
        digest = hashlib.sha256(xml.encode("utf-8", "replace")).hexdigest()
        with self._lock:
            cred = self._cache.get(digest)
        if cred is None:
            try:
                cred = credlib.verify_credential(xml, self._roots, caller_urn=caller_urn,
                                                 authorities=self.authorities,
                                                 target_gid=self.known_gid)
            except CredentialError as err:
                raise GeniFault(GeniCode.FORBIDDEN, f"Could not verify credential: {err}") from err
            with self._lock:
                self._cache[digest] = cred
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        if cred.expired(utcnow()):
            raise GeniFault(GeniCode.FORBIDDEN,
                            f"Credential expired at {credlib.format_expires(cred.expires)}")
        if cred.owner_urn != caller_urn:
            raise GeniFault(GeniCode.FORBIDDEN, "This is not your credential")
        if privilege is not None and not grants(cred, privilege):
            raise GeniFault(GeniCode.FORBIDDEN, f"Credential does not grant the "
                                                f"{privilege.value!r} privilege")
        return cred

    def pick(self, credentials: object, caller_urn: str, targets: set[str] | None,
             privilege: Privilege = Privilege.CONTROL) -> credlib.Credential:
        """The first of ``credentials`` (an array) that is valid, grants ``privilege`` and
        names one of ``targets``.

        ``targets`` None accepts any valid credential (a user credential will do).
        """
        if not isinstance(credentials, list):
            raise GeniFault(GeniCode.BADARGS, "Malformed argument: credentials (must be an array)")
        if not credentials:
            raise GeniFault(GeniCode.BADARGS, "Missing argument: credentials")
        first_error: GeniFault | None = None
        for xml in credentials:
            try:
                cred = self.verify(xml, caller_urn, privilege)
            except GeniFault as err:
                first_error = first_error or err
                continue
            if targets is None or cred.target_urn in targets:
                return cred
            first_error = first_error or GeniFault(
                GeniCode.FORBIDDEN, f"Credential is for {cred.target_urn}, not "
                                    f"{' or '.join(sorted(targets))}")
        assert first_error is not None
        raise first_error


def new_uuid() -> str:
    return str(uuidlib.uuid4())


def stable_uuid(urn: str) -> str:
    """The same UUID for the same URN, every time (users have no stored record)."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, urn))
