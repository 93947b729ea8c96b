"""A small PKI for ProtoGENI: a CA, user and server certificates, the one-PEM user file.

CloudLab hands each user one PEM file (``cloudlab.pem``): the user certificate, whose
subjectAltName carries the user URN (``URI:urn:publicid:IDN+<dom>+user+<uid>``) and whose
authorityInfoAccess points at the user's slice authority, followed by an RSA key encrypted
with the account password. This module makes such files (for the emulator) and reads the
URN and SA URL out of them (for the client).
"""
from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import os
import ssl
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID

from elasticslice.errors import CredentialError

URN_PREFIX = "urn:publicid:IDN+"
KEY_BITS = 2048
DEFAULT_DAYS = 365

CertLike = x509.Certificate | bytes | str
#: key types: "rsa" (RSA-2048, what CloudLab issues and ProtoGENI's signatures need) and
#: "ec" (ECDSA P-256: the cluster CA's, whose keys are made per node and per member; an RSA
#: key costs ~40 ms of CPU to make and ~1.5 ms per TLS handshake, a P-256 key ~0.02 ms)
KEY_TYPES = ("rsa", "ec")
SigningKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def generate_key(key_type: str = "rsa") -> SigningKey:
    """A fresh key: RSA-2048 (the size CloudLab issues) or, ``"ec"``, ECDSA P-256."""
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type != "rsa":
        raise ValueError(f"key type {key_type!r}: not one of {', '.join(KEY_TYPES)}")
    return rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)


def _key_pem(key: SigningKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _load_key(key_pem: bytes | str, password: bytes | str | None = None) -> SigningKey:
    data = key_pem.encode() if isinstance(key_pem, str) else key_pem
    pwd = password.encode() if isinstance(password, str) else password
    try:  # without cryptography's RSA consistency check (36 ms of CPU a key, in every command
        # and every server start): it guards against a malformed key from someone else, and
        # every key loaded here is a signer's own, one we made or the user's from CloudLab
        key = serialization.load_pem_private_key(data, password=pwd,
                                                 unsafe_skip_rsa_key_validation=True)
    except (ValueError, TypeError) as err:
        raise CredentialError(f"cannot load private key: {err}") from err
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise CredentialError("private key is neither RSA nor EC")
    return key


@functools.lru_cache(maxsize=32)
def _load_key_cached(data: bytes, pwd: bytes | None) -> SigningKey:
    return _load_key(data, pwd)


def load_signing_key(key_pem: bytes | str, password: bytes | str | None = None) -> SigningKey:
    """Load a (possibly encrypted) PEM RSA or EC key, a CA's that signs certificates;
    CredentialError on a wrong password.

    Loading validates the key (tens of ms), and signers load the same few keys on every
    certificate or credential they issue, so loaded keys are kept in a small in-process cache.
    """
    data = key_pem.encode() if isinstance(key_pem, str) else bytes(key_pem)
    pwd = password.encode() if isinstance(password, str) else password
    return _load_key_cached(data, pwd)


def load_private_key(key_pem: bytes | str, password: bytes | str | None = None) -> rsa.RSAPrivateKey:
    """Load a (possibly encrypted) PEM RSA key, one that signs ProtoGENI credentials
    (RSA-SHA1/SHA256 XML signatures); CredentialError on a wrong password or another type."""
    key = load_signing_key(key_pem, password)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise CredentialError("private key is not RSA")
    return key


def _name(common_name: str, email: str | None = None, role: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]
    if role:  # a cluster member's role (elasticslice.pilots: "control" or "worker")
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role))
    if email:
        attrs.append(x509.NameAttribute(NameOID.EMAIL_ADDRESS, email))
    return x509.Name(attrs)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def make_ca(common_name: str, *, days: int = 3650,
            key_type: str = "rsa") -> tuple[bytes, bytes]:
    """A self-signed CA certificate and its (unencrypted) key of ``key_type``, both PEM."""
    key = generate_key(key_type)
    name = _name(common_name)
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def issue_certificate(
    ca_cert_pem: bytes | str,
    ca_key_pem: bytes | str,
    common_name: str,
    *,
    urn: str | None = None,
    hostnames: Iterable[str] = (),
    ips: Iterable[str] = (),
    aia_url: str | None = None,
    email: str | None = None,
    days: int = DEFAULT_DAYS,
    ca_key_password: bytes | str | None = None,
    role: str | None = None,
    lifetime: dt.timedelta | None = None,
    public_key_pem: bytes | str | None = None,
    key_type: str = "rsa",
) -> tuple[bytes, bytes]:
    """A certificate signed by the CA and its new (unencrypted) key, both PEM.

    ``urn`` becomes a subjectAltName URI (users, slices, authorities); ``hostnames`` and
    ``ips`` become DNS/IP SANs (servers); ``aia_url`` an authorityInfoAccess caIssuers URI
    (CloudLab points user certificates at their SA this way). ``role`` becomes the subject's
    organizationalUnitName (a cluster member's role); ``lifetime`` replaces ``days``. With
    ``public_key_pem`` (a key made elsewhere, e.g. from a certificate request) that key is
    certified and no key is made: the second item is then ``b""``; otherwise the new key is
    of ``key_type`` (:data:`KEY_TYPES`). The CA's key may be RSA or EC.
    """
    ca_cert = load_pem_cert(ca_cert_pem)
    ca_key = load_signing_key(ca_key_pem, ca_key_password)  # a CA signs many: cached
    if public_key_pem is not None:
        data = public_key_pem.encode() if isinstance(public_key_pem, str) else public_key_pem
        public = serialization.load_pem_public_key(data)
        key = None
    else:
        key = generate_key(key_type)
        public = key.public_key()
    now = _now()
    sans: list[x509.GeneralName] = []
    if urn:
        sans.append(x509.UniformResourceIdentifier(urn))
    sans.extend(x509.DNSName(h) for h in hostnames)
    sans.extend(x509.IPAddress(ipaddress.ip_address(i)) for i in ips)
    if email:
        sans.append(x509.RFC822Name(email))
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, email, role))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + (lifetime if lifetime is not None else dt.timedelta(days=days)))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH,
                                              ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if aia_url:
        builder = builder.add_extension(x509.AuthorityInformationAccess([
            x509.AccessDescription(AuthorityInformationAccessOID.CA_ISSUERS,
                                   x509.UniformResourceIdentifier(aia_url))]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), (_key_pem(key) if key else b"")


def encrypt_key_pem(key_pem: bytes | str, password: bytes | str) -> bytes:
    """The key re-encoded as a traditional encrypted PEM (``Proc-Type: 4,ENCRYPTED``)."""
    pwd = password.encode() if isinstance(password, str) else password
    if not pwd:
        raise CredentialError("refusing to encrypt a key with an empty password")
    data = key_pem.encode() if isinstance(key_pem, str) else key_pem
    try:  # only re-encoded here, never used: whoever signs with it loads (and checks) it
        key = serialization.load_pem_private_key(data, password=None,
                                                 unsafe_skip_rsa_key_validation=True)
    except (ValueError, TypeError) as err:
        raise CredentialError(f"cannot load private key: {err}") from err
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.BestAvailableEncryption(pwd))


def write_user_pem(path: str | os.PathLike[str], cert_pem: bytes | str, key_pem: bytes | str,
                   password: bytes | str) -> Path:
    """Write the one-PEM user file: certificate, then the encrypted RSA key, mode 0600."""
    cert = cert_pem.encode() if isinstance(cert_pem, str) else cert_pem
    body = cert.rstrip(b"\n") + b"\n" + encrypt_key_pem(key_pem, password)
    return write_private_file(path, body)


def write_private_file(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` readable by the owner only (created 0600, never wider)."""
    target = Path(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
    return target


def load_pem_cert(data: CertLike) -> x509.Certificate:
    """A certificate from an x509 object, PEM (the first certificate in it) or DER."""
    if isinstance(data, x509.Certificate):
        return data
    raw = data.encode() if isinstance(data, str) else data
    try:
        if b"-----BEGIN CERTIFICATE-----" in raw:
            return x509.load_pem_x509_certificate(raw)
        return x509.load_der_x509_certificate(raw)
    except ValueError as err:
        raise CredentialError(f"cannot read certificate: {err}") from err


def load_pem_certs(data: bytes | str) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle (empty list if none)."""
    raw = data.encode() if isinstance(data, str) else data
    if b"-----BEGIN CERTIFICATE-----" not in raw:
        return []
    try:
        return x509.load_pem_x509_certificates(raw)
    except ValueError as err:
        raise CredentialError(f"cannot read certificates: {err}") from err


def cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def urn_from_certificate(cert: CertLike) -> str | None:
    """The ``urn:publicid:IDN+...`` subjectAltName URI of a certificate, or None."""
    c = load_pem_cert(cert)
    try:
        san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(URN_PREFIX):
            return uri
    return None


def peer_urn(sock: ssl.SSLSocket) -> str | None:
    """The ``urn:publicid:IDN+...`` subjectAltName URI of a TLS peer's verified certificate,
    from what ``ssl`` already parsed (servers call this per connection), or None."""
    for kind, value in (sock.getpeercert() or {}).get("subjectAltName", ()):
        if kind == "URI" and value.startswith(URN_PREFIX):
            return value
    return None


def aia_url_from_certificate(cert: CertLike) -> str | None:
    """The authorityInfoAccess caIssuers URI (a CloudLab user's SA URL), or None."""
    c = load_pem_cert(cert)
    try:
        aia = c.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        return None
    for desc in aia:
        loc = desc.access_location
        if isinstance(loc, x509.UniformResourceIdentifier):
            return loc.value
    return None


def urn_authority(urn: str) -> str:
    """The authority part of a URN: ``urn:publicid:IDN+emulab.net+user+bob`` → ``emulab.net``."""
    if not urn.startswith(URN_PREFIX):
        raise CredentialError(f"not a GENI URN: {urn!r}")
    parts = urn[len(URN_PREFIX):].split("+")
    if len(parts) != 3 or not all(parts):
        raise CredentialError(f"malformed GENI URN: {urn!r}")
    return parts[0]


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """True if ``issuer`` signed ``cert`` (names match and the signature verifies)."""
    if cert.issuer != issuer.subject:
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def chains_to(signer: x509.Certificate, intermediates: list[x509.Certificate],
              trusted: list[x509.Certificate], now: dt.datetime | None) -> bool:
    """True if ``signer`` is a trusted certificate or chains to one through ``intermediates``.

    ``now`` None skips the validity windows (a GID names an object; the credential's own
    expiry governs how long it may be used).
    """
    current = signer
    pool = list(intermediates)
    for _ in range(8):
        if now is not None and not (current.not_valid_before_utc <= now
                                    <= current.not_valid_after_utc):
            return False
        if any(current == t or issued_by(current, t) for t in trusted):
            return True
        nxt = next((c for c in pool if c != current and issued_by(current, c)), None)
        if nxt is None:
            return False
        pool.remove(nxt)
        current = nxt
    return False


def load_trusted(certs: Iterable[CertLike]) -> list[x509.Certificate]:
    """Trusted roots from certificates or PEM bundles."""
    out: list[x509.Certificate] = []
    for item in certs:
        if isinstance(item, x509.Certificate):
            out.append(item)
        else:
            out.extend(load_pem_certs(item))
    return out
