"""The small PKI: CA, user/server certificates, the one-PEM user file."""
from __future__ import annotations

import ssl
import stat

import pytest

from elasticslice.errors import CredentialError
from elasticslice.rpc import pki

USER_URN = "urn:publicid:IDN+emulab.test+user+alice"
SA_URL = "https://127.0.0.1:12369/protogeni/xmlrpc/sa"


@pytest.fixture(scope="module")
def ca():
    return pki.make_ca("Test CA")


def test_user_certificate_carries_urn_and_sa_url(ca):
    cert, _key = pki.issue_certificate(*ca, "alice", urn=USER_URN, aia_url=SA_URL,
                                       email="alice@example.org")
    assert pki.urn_from_certificate(cert) == USER_URN
    assert pki.urn_from_certificate(cert.decode()) == USER_URN
    assert pki.aia_url_from_certificate(cert) == SA_URL
    parsed = pki.load_pem_cert(cert)
    assert pki.issued_by(parsed, pki.load_pem_cert(ca[0]))
    der = parsed.public_bytes(pki.serialization.Encoding.DER)
    assert pki.urn_from_certificate(der) == USER_URN


def test_server_certificate_without_urn(ca):
    cert, _ = pki.issue_certificate(*ca, "localhost", hostnames=["localhost"], ips=["127.0.0.1"])
    assert pki.urn_from_certificate(cert) is None
    assert pki.aia_url_from_certificate(cert) is None


def test_other_ca_did_not_issue(ca):
    other = pki.make_ca("Other CA")
    cert, _ = pki.issue_certificate(*ca, "bob", urn=USER_URN)
    assert not pki.issued_by(pki.load_pem_cert(cert), pki.load_pem_cert(other[0]))


def test_user_pem_is_private_and_loads_with_password(ca, tmp_path):
    cert, key = pki.issue_certificate(*ca, "alice", urn=USER_URN)
    path = pki.write_user_pem(tmp_path / "cloudlab.pem", cert, key, "s3cret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert text.index("BEGIN CERTIFICATE") < text.index("BEGIN RSA PRIVATE KEY")
    assert "ENCRYPTED" in text
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_cert_chain(str(path), password="s3cret")
    with pytest.raises(ssl.SSLError):
        ctx.load_cert_chain(str(path), password="wrong")
    assert pki.urn_from_certificate(path.read_bytes()) == USER_URN


def test_wrong_password_is_credential_error(ca):
    _, key = pki.issue_certificate(*ca, "alice", urn=USER_URN)
    enc = pki.encrypt_key_pem(key, "right")
    pki.load_private_key(enc, "right")
    with pytest.raises(CredentialError):
        pki.load_private_key(enc, "wrong")


def test_urn_authority():
    assert pki.urn_authority(USER_URN) == "emulab.test"
    assert pki.urn_authority("urn:publicid:IDN+emulab.net:proj+slice+s") == "emulab.net:proj"
    with pytest.raises(CredentialError):
        pki.urn_authority("urn:foo")


def test_garbage_certificate_is_credential_error():
    with pytest.raises(CredentialError):
        pki.load_pem_cert(b"not a certificate")
