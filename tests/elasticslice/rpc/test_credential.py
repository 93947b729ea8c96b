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


BOB = "urn:publicid:IDN+emulab.test+user+bob"
SLIVER = "urn:publicid:IDN+emulab.test+sliver+7"


@pytest.fixture(scope="module")
def world():
    ca_cert, ca_key = pki.make_ca("Test CA")
    sa_cert, sa_key = pki.issue_certificate(ca_cert, ca_key, "sa",
                                            urn="urn:publicid:IDN+emulab.test+authority+sa")
    cm_cert, cm_key = pki.issue_certificate(ca_cert, ca_key, "cm",
                                            urn="urn:publicid:IDN+emulab.test+authority+cm")
    user_cert, user_key = pki.issue_certificate(ca_cert, ca_key, "alice", urn=USER)
    mallory_cert, mallory_key = pki.issue_certificate(ca_cert, ca_key, "mallory", urn=OTHER)
    bob_cert, bob_key = pki.issue_certificate(ca_cert, ca_key, "bob", urn=BOB)
    slice_cert, _ = pki.issue_certificate(ca_cert, ca_key, "exp1", urn=SLICE)
    sliver_cert, _ = pki.issue_certificate(ca_cert, ca_key, "sliver", urn=SLIVER)
    return dict(ca=ca_cert, ca_key=ca_key, sa=sa_cert, sa_key=sa_key, cm=cm_cert, cm_key=cm_key,
                user=user_cert.decode(), user_key=user_key, mallory=mallory_cert.decode(),
                mallory_key=mallory_key, bob=bob_cert.decode(), bob_key=bob_key,
                slice=slice_cert.decode(), sliver=sliver_cert.decode())


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


# ---------------------------------------------------------------- who may sign what

def _alice_slice_cred(world, *, hours: float = 2.0, privileges=None) -> str:
    cred = _cred(world, hours=hours)
    if privileges is not None:
        cred.privileges = privileges
    return cr.sign_credential(cred, world["sa"], world["sa_key"])


def test_user_of_the_same_ca_forging_a_slice_credential_is_refused(world):
    """The critical bug: any user of the CA could sign a credential for any slice."""
    forged = cr.Credential(owner_gid=world["mallory"], owner_urn=OTHER,
                           target_gid=world["slice"], target_urn=SLICE,
                           expires=dt.datetime.now(UTC).replace(microsecond=0)
                           + dt.timedelta(days=3650))
    xml = cr.sign_credential(forged, world["mallory"], world["mallory_key"])
    with pytest.raises(CredentialError, match="not its authority"):
        cr.verify_credential(xml, [world["ca"]], caller_urn=OTHER)
    own = cr.Credential(owner_gid=world["mallory"], owner_urn=OTHER,
                        target_gid=world["mallory"], target_urn=OTHER,
                        expires=forged.expires)  # a self-made user credential: no better
    with pytest.raises(CredentialError, match="not its authority"):
        cr.verify_credential(cr.sign_credential(own, world["mallory"], world["mallory_key"]),
                             [world["ca"]], caller_urn=OTHER)


def test_sa_signs_slices_and_cm_signs_slivers_not_the_other_way(world):
    slice_by_cm = cr.sign_credential(_cred(world), world["cm"], world["cm_key"])
    with pytest.raises(CredentialError, match="not its authority"):
        cr.verify_credential(slice_by_cm, [world["ca"]])
    sliver = _cred(world)
    sliver.target_urn, sliver.target_gid = SLIVER, world["sliver"]
    cr.verify_credential(cr.sign_credential(sliver, world["cm"], world["cm_key"]), [world["ca"]])
    with pytest.raises(CredentialError, match="not its authority"):
        cr.verify_credential(cr.sign_credential(sliver, world["sa"], world["sa_key"]),
                             [world["ca"]])


def test_pinned_authorities_refuse_an_impostor_with_the_authority_urn(world):
    impostor, impostor_key = pki.issue_certificate(
        world["ca"], world["ca_key"], "sa", urn="urn:publicid:IDN+emulab.test+authority+sa")
    xml = cr.sign_credential(_cred(world), impostor, impostor_key)
    cr.verify_credential(xml, [world["ca"]])  # by URN alone it would pass
    sa = pki.load_pem_cert(world["sa"])
    with pytest.raises(CredentialError, match="not its authority"):
        cr.verify_credential(xml, [world["ca"]], authorities=lambda urn: [sa])


def test_target_gid_must_be_the_targets_own_certificate(world):
    cred = _cred(world)
    cred.target_gid = world["user"]  # some other certificate of the same CA
    xml = cr.sign_credential(cred, world["sa"], world["sa_key"])
    with pytest.raises(CredentialError, match="target_gid is not the certificate"):
        cr.verify_credential(xml, [world["ca"]])
    good = cr.sign_credential(_cred(world), world["sa"], world["sa_key"])
    with pytest.raises(CredentialError, match="target_gid is not the certificate"):
        cr.verify_credential(good, [world["ca"]], target_gid=lambda urn: world["user"])
    cr.verify_credential(good, [world["ca"]], target_gid=lambda urn: world["slice"])


def test_owner_gid_must_name_the_owner(world):
    cred = _cred(world)
    cred.owner_gid = world["mallory"]
    xml = cr.sign_credential(cred, world["sa"], world["sa_key"])
    with pytest.raises(CredentialError, match="owner_gid is not the certificate"):
        cr.verify_credential(xml, [world["ca"]], caller_urn=USER)


# ---------------------------------------------------------------- delegation

def test_delegation_to_another_user_verifies_for_them(world):
    parent = _alice_slice_cred(world)
    child = cr.delegate(parent, world["bob"], world["user"], world["user_key"],
                        privileges=["info"])
    got = cr.verify_credential(child, [world["ca"]], caller_urn=BOB, target_urn=SLICE)
    assert got.delegated and got.parent.owner_urn == USER
    assert got.privileges == [("info", False)] and got.expires == cr.expires_of(parent)
    assert cr.parse_credential(child).parent.owner_urn == USER
    with pytest.raises(CredentialError, match="This is not your credential"):
        cr.verify_credential(child, [world["ca"]], caller_urn=USER)


def test_delegation_chain_needs_can_delegate_at_each_step(world):
    parent = _alice_slice_cred(world)
    to_bob = cr.delegate(parent, world["bob"], world["user"], world["user_key"])
    with pytest.raises(CredentialError, match="can_delegate"):  # bob may not pass it on
        cr.delegate(to_bob, world["mallory"], world["bob"], world["bob_key"])
    sneaky = cr.sign_delegation(
        cr.Credential(owner_gid=world["mallory"], owner_urn=OTHER, target_gid=world["slice"],
                      target_urn=SLICE, expires=cr.expires_of(parent)),
        to_bob, world["bob"], world["bob_key"])
    with pytest.raises(CredentialError, match="does not allow delegating"):
        cr.verify_credential(sneaky, [world["ca"]], caller_urn=OTHER)
    passable = cr.delegate(parent, world["bob"], world["user"], world["user_key"],
                           can_delegate=True)
    onward = cr.delegate(passable, world["mallory"], world["bob"], world["bob_key"])
    got = cr.verify_credential(onward, [world["ca"]], caller_urn=OTHER)
    assert got.parent.parent.owner_urn == USER


def _child(world, parent: str, **changes) -> cr.Credential:
    child = cr.Credential(owner_gid=world["bob"], owner_urn=BOB, target_gid=world["slice"],
                          target_urn=SLICE, expires=cr.expires_of(parent))
    for key, value in changes.items():
        setattr(child, key, value)
    return child


def test_hostile_delegations_are_refused(world):
    parent = _alice_slice_cred(world)
    ca = [world["ca"]]
    by_stranger = cr.sign_delegation(_child(world, parent), parent, world["mallory"],
                                     world["mallory_key"])
    with pytest.raises(CredentialError, match="not signed by the owner"):
        cr.verify_credential(by_stranger, ca, caller_urn=BOB)
    longer = cr.sign_delegation(
        _child(world, parent, expires=cr.expires_of(parent) + dt.timedelta(days=3650)),
        parent, world["user"], world["user_key"])
    with pytest.raises(CredentialError, match="outlives"):
        cr.verify_credential(longer, ca, caller_urn=BOB)
    elsewhere = _child(world, parent, target_urn=SLICE + "x")
    with pytest.raises(CredentialError, match="another target"):
        cr.verify_credential(cr.sign_delegation(elsewhere, parent, world["user"],
                                                world["user_key"]), ca, caller_urn=BOB)
    no_delegate = _alice_slice_cred(world, privileges=[("*", False)])
    with pytest.raises(CredentialError, match="does not allow delegating"):
        cr.verify_credential(cr.sign_delegation(_child(world, no_delegate), no_delegate,
                                                world["user"], world["user_key"]),
                             ca, caller_urn=BOB)
    info_only = _alice_slice_cred(world, privileges=[("info", True)])
    wider = cr.sign_delegation(_child(world, info_only, privileges=[("control", False)]),
                               info_only, world["user"], world["user_key"])
    with pytest.raises(CredentialError, match="'control'"):
        cr.verify_credential(wider, ca, caller_urn=BOB)


def test_delegation_of_an_altered_or_expired_parent_is_refused(world):
    parent = _alice_slice_cred(world)
    child = cr.delegate(parent, world["bob"], world["user"], world["user_key"])
    altered = child.replace("<can_delegate>1</can_delegate>", "<can_delegate>1 </can_delegate>")
    assert altered != child
    with pytest.raises(CredentialError, match="altered"):
        cr.verify_credential(altered, [world["ca"]], caller_urn=BOB)
    short = _alice_slice_cred(world, hours=1)
    child = cr.delegate(short, world["bob"], world["user"], world["user_key"])
    later = dt.datetime.now(UTC) + dt.timedelta(hours=2)
    with pytest.raises(CredentialError, match="parent credential expired"):
        cr.verify_credential(child, [world["ca"]], caller_urn=BOB, now=later)


def test_delegate_refuses_what_the_verifier_would(world):
    parent = _alice_slice_cred(world)
    with pytest.raises(CredentialError, match="only the owner"):
        cr.delegate(parent, world["bob"], world["mallory"], world["mallory_key"])
    with pytest.raises(CredentialError, match="expire by"):
        cr.delegate(parent, world["bob"], world["user"], world["user_key"],
                    expires=cr.expires_of(parent) + dt.timedelta(hours=1))
    narrow = _alice_slice_cred(world, privileges=[("info", True)])
    with pytest.raises(CredentialError, match="cannot delegate control"):
        cr.delegate(narrow, world["bob"], world["user"], world["user_key"],
                    privileges=["control"])
