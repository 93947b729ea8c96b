"""Signed credentials: sign, parse, verify, and every way verification must fail."""
from __future__ import annotations

import datetime as dt

import pytest

from elasticslice.errors import CredentialError
from elasticslice.rpc import credential as cr
from elasticslice.rpc import pki

USER = "urn:publicid:IDN+emulab.test+user+alice"
OTHER = "urn:publicid:IDN+emulab.test+user+mallory"
SLICE = "urn:publicid:IDN+emulab.test+slice+exp1"
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def world():
    ca_cert, ca_key = pki.make_ca("Test CA")
    sa_cert, sa_key = pki.issue_certificate(ca_cert, ca_key, "sa",
                                            urn="urn:publicid:IDN+emulab.test+authority+sa")
    user_cert, _ = pki.issue_certificate(ca_cert, ca_key, "alice", urn=USER)
    slice_cert, _ = pki.issue_certificate(ca_cert, ca_key, "exp1", urn=SLICE)
    return dict(ca=ca_cert, ca_key=ca_key, sa=sa_cert, sa_key=sa_key,
                user=user_cert.decode(), slice=slice_cert.decode())


def _cred(world, *, hours: float = 2.0) -> cr.Credential:
    return cr.Credential(owner_gid=world["user"], owner_urn=USER, target_gid=world["slice"],
                         target_urn=SLICE,
                         expires=dt.datetime.now(UTC).replace(microsecond=0)
                         + dt.timedelta(hours=hours))


@pytest.mark.parametrize("algorithm", ["sha256", "sha1"])
def test_round_trip(world, algorithm):
    original = _cred(world)
    xml = cr.sign_credential(original, world["sa"], world["sa_key"], algorithm=algorithm)
    assert xml.lstrip().startswith("<?xml")
    got = cr.verify_credential(xml, [world["ca"]], caller_urn=USER, target_urn=SLICE)
    assert got.owner_urn == USER and got.target_urn == SLICE
    assert got.expires == original.expires
    assert got.uuid == original.uuid
    assert got.privileges == [("*", True)]
    assert cr.parse_credential(xml) == got
    assert cr.expires_of(xml) == original.expires


def test_signed_by_the_ca_itself_verifies(world):
    xml = cr.sign_credential(_cred(world), world["ca"], world["ca_key"])
    cr.verify_credential(xml, [world["ca"]])


def test_tampered_target_fails(world):
    xml = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    forged = xml.replace(f"<target_urn>{SLICE}</target_urn>",
                         "<target_urn>urn:publicid:IDN+emulab.test+slice+other</target_urn>")
    assert forged != xml
    with pytest.raises(CredentialError, match="altered"):
        cr.verify_credential(forged, [world["ca"]])


def test_tampered_signature_value_fails(world):
    xml = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    start = xml.index("<SignatureValue>") + len("<SignatureValue>")
    flipped = "A" if xml[start] != "A" else "B"
    forged = xml[:start] + flipped + xml[start + 1:]
    with pytest.raises(CredentialError, match="invalid"):
        cr.verify_credential(forged, [world["ca"]])


def test_wrong_ca_fails(world):
    other_ca, _ = pki.make_ca("Other CA")
    xml = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    with pytest.raises(CredentialError, match="not trusted"):
        cr.verify_credential(xml, [other_ca])


def test_self_signed_impostor_fails(world):
    rogue_ca, rogue_key = pki.make_ca("Test CA")  # same name, different key
    xml = cr.sign_credential(_cred(world), rogue_ca, rogue_key)
    with pytest.raises(CredentialError, match="not trusted"):
        cr.verify_credential(xml, [world["ca"]])


def test_expired_fails(world):
    xml = cr.sign_credential(_cred(world, hours=-1), world["sa"], world["sa_key"])
    with pytest.raises(CredentialError, match="expired"):
        cr.verify_credential(xml, [world["ca"]])
    later = dt.datetime.now(UTC) + dt.timedelta(hours=3)
    fresh = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    with pytest.raises(CredentialError, match="expired"):
        cr.verify_credential(fresh, [world["ca"]], now=later)


def test_wrong_owner_fails(world):
    xml = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    with pytest.raises(CredentialError, match="This is not your credential"):
        cr.verify_credential(xml, [world["ca"]], caller_urn=OTHER)


def test_wrong_target_fails(world):
    xml = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    with pytest.raises(CredentialError, match="not urn:publicid:IDN"):
        cr.verify_credential(xml, [world["ca"]], target_urn=SLICE + "x")


def test_unsigned_and_hostile_documents_are_refused(world):
    xml = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    unsigned = xml[:xml.index("<signatures>")] + "</signed-credential>"
    with pytest.raises(CredentialError, match="not signed"):
        cr.verify_credential(unsigned, [world["ca"]])
    bomb = ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]>'
            "<signed-credential><credential>&a;</credential></signed-credential>")
    with pytest.raises(CredentialError, match="DTD"):
        cr.parse_credential(bomb)
    with pytest.raises(CredentialError, match="well-formed"):
        cr.parse_credential("<signed-credential>")
    with pytest.raises(CredentialError, match="not a signed credential"):
        cr.parse_credential("<rspec/>")


def test_signature_wrapping_is_refused(world):
    """A second, unsigned <credential> placed first must not be taken as the signed one."""
    xml = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    evil = (f"<credential><type>privilege</type><owner_urn>{OTHER}</owner_urn>"
            f"<target_urn>{SLICE}</target_urn><expires>2099-01-01T00:00:00Z</expires>"
            "</credential>")
    head = xml.index("<credential ")
    wrapped = xml[:head] + evil + xml[head:]
    with pytest.raises(CredentialError):
        cr.verify_credential(wrapped, [world["ca"]], caller_urn=OTHER)


def test_naive_expiry_is_refused(world):
    cred = _cred(world)
    cred.expires = cred.expires.replace(tzinfo=None)
    with pytest.raises(CredentialError, match="timezone"):
        cr.sign_credential(cred, world["sa"], world["sa_key"])
