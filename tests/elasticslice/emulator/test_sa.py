"""The slice authority: credentials, Register/Resolve by urn and hrn, renewals, keys."""
from __future__ import annotations

import datetime as dt

import pytest

from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.credential import parse_credential, verify_credential
from tests.elasticslice.emulator.helpers import Session, ok, sign_with, user_cert_pem

USER = "urn:publicid:IDN+emulab.test+user+elastic"
SLICE = "urn:publicid:IDN+emulab.test+slice+myslice"


def _utc(**delta: float) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(**delta)


def test_self_credential_is_signed_for_the_caller(emulator):
    s = Session(emulator)
    cred = verify_credential(s.user_cred, [(emulator.dir / "ca.pem").read_bytes()],
                             caller_urn=USER, target_urn=USER)
    assert not cred.expired()


def test_register_by_hrn_then_resolve_by_hrn_and_urn(emulator):
    s = Session(emulator)
    urn, slice_cred = s.register("myslice")
    assert parse_credential(slice_cred).target_urn == SLICE == urn
    for key, value in (("hrn", "myslice"), ("hrn", "emulab.test.myslice"), ("urn", SLICE)):
        got = ok(s.sa.Resolve({"credential": s.user_cred, "type": "Slice", key: value}))
        assert got["urn"] == SLICE and got["creator_urn"] == USER
        assert "BEGIN CERTIFICATE" in got["gid"]
    again = ok(s.sa.GetCredential({"credential": s.user_cred, "type": "Slice", "hrn": "myslice"}))
    assert parse_credential(again).target_urn == SLICE


def test_resolve_user_lists_slices_and_keys(emulator):
    s = Session(emulator)
    s.register("one")
    user = ok(s.sa.Resolve({"credential": s.user_cred, "type": "User", "hrn": "elastic"}))
    assert user["urn"] == USER and user["uid"] == "elastic"
    assert user["slices"] == ["urn:publicid:IDN+emulab.test+slice+one"]
    assert user["pubkeys"][0].startswith("ssh-rsa ")


def test_register_refusals(emulator):
    s = Session(emulator)
    s.register("dup")
    again = s.sa.Register({"credential": s.user_cred, "type": "Slice", "hrn": "dup"})
    assert again["code"] == GeniCode.ERROR
    soon = s.sa.Register({"credential": s.user_cred, "type": "Slice", "hrn": "soon",
                          "expiration": _utc(minutes=2).isoformat()})
    assert soon["code"] == GeniCode.BADARGS and "5 minutes" in soon["output"]
    far = s.sa.Register({"credential": s.user_cred, "type": "Slice", "hrn": "far",
                         "expiration": _utc(days=400).isoformat()})
    assert far["code"] == GeniCode.BADARGS
    bad = s.sa.Register({"credential": s.user_cred, "type": "Slice", "hrn": "no_underscores"})
    assert bad["code"] == GeniCode.BADARGS


def test_unknown_slice_is_searchfailed(emulator):
    s = Session(emulator)
    got = s.sa.Resolve({"credential": s.user_cred, "type": "Slice", "hrn": "ghost"})
    assert got["code"] == GeniCode.SEARCHFAILED


def test_renew_accepts_both_formats_and_cannot_shorten(emulator):
    s = Session(emulator)
    _, cred = s.register("renewme")
    first = _utc(hours=30).replace(microsecond=0)
    new = ok(s.sa.RenewSlice({"credential": cred, "expiration": first.strftime("%Y%m%dT%H:%M:%S")}))
    assert parse_credential(new).expires == first
    later = _utc(hours=40).replace(microsecond=0)
    new = ok(s.sa.RenewSlice({"credential": new,
                              "expiration": later.strftime("%Y-%m-%dT%H:%M:%SZ")}))
    assert parse_credential(new).expires == later
    shorter = s.sa.RenewSlice({"credential": new, "expiration": first.isoformat()})
    assert shorter["code"] == GeniCode.ERROR and "Cannot shorten" in shorter["output"]


def test_renew_refusals_were_badargs_and_are_error_like_cloudlab(emulator):
    """CloudLab's SA refuses a renewal it will not do with ERROR (2), not BADARGS."""
    s = Session(emulator)
    _, cred = s.register("renewno")
    for when, words in ((_utc(minutes=2), "5 minutes"), (_utc(days=400), "maximum"),
                        (_utc(hours=-1), "past"), (_utc(hours=2), "Cannot shorten")):
        got = s.sa.RenewSlice({"credential": cred, "expiration": when.isoformat()})
        assert got["code"] == GeniCode.ERROR and words in got["output"], (when, got)
    resolved = ok(s.sa.Resolve({"credential": s.user_cred, "type": "Slice", "hrn": "renewno"}))
    assert resolved["urn"].endswith("+slice+renewno")  # still there, nothing changed


def test_get_keys_v1_and_v2(emulator):
    s = Session(emulator)
    v1 = ok(s.sa.GetKeys({"credential": s.user_cred}))
    assert v1[0]["type"] == "ssh" and v1[0]["key"].startswith("ssh-rsa")
    v2 = ok(s.sa.GetKeys({"credential": s.user_cred, "version": 2}))
    assert v2[0]["urn"] == USER and v2[0]["login"] == "elastic"
    assert v2[0]["keys"] == v1


def test_tampered_credential_is_forbidden(emulator):
    s = Session(emulator)
    tampered = s.user_cred.replace("<serial>", "<serial>9", 1)
    assert tampered != s.user_cred
    got = s.sa.Register({"credential": tampered, "type": "Slice", "hrn": "x1"})
    assert got["code"] == GeniCode.FORBIDDEN


def test_expired_credential_is_forbidden(emulator):
    d = emulator.dir
    s = Session(emulator)
    expired = sign_with(d, user_cert_pem(d), USER, USER, _utc(seconds=-5))
    got = s.sa.Register({"credential": expired, "type": "Slice", "hrn": "x2"})
    assert got["code"] == GeniCode.FORBIDDEN and "expired" in got["output"]


def test_someone_elses_credential_is_forbidden(emulator):
    d = emulator.dir
    s = Session(emulator)
    other = "urn:publicid:IDN+emulab.test+user+bob"
    theirs = sign_with(d, user_cert_pem(d), other, other, _utc(hours=1))
    got = s.sa.Register({"credential": theirs, "type": "Slice", "hrn": "x3"})
    assert got["code"] == GeniCode.FORBIDDEN and "not your credential" in got["output"]


OUT_OF_RANGE = ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00")


def test_unrepresentable_expiration_was_an_overflow_traceback_and_is_badargs(emulator, caplog):
    """Register/RenewSlice with a date outside years 1..9999 UTC answered fault -32600 and
    logged an OverflowError traceback; now BADARGS with one line, through the real client."""
    from elasticslice.config import load_config
    from elasticslice.errors import RPCError
    from elasticslice.rpc.client import ProtoGeniServer

    caplog.set_level("DEBUG")
    with ProtoGeniServer(load_config(emulator.config_path)) as client:
        user_cred = client.get_credential()
        slice_cred = client.register_slice("dates")
        for when in OUT_OF_RANGE:
            for method, params in (
                    ("Register", {"credential": user_cred, "type": "Slice", "hrn": "dates2",
                                  "expiration": when}),
                    ("RenewSlice", {"credential": slice_cred, "expiration": when})):
                with pytest.raises(RPCError) as err:
                    client.sa_call(method, params)
                assert err.value.code == GeniCode.BADARGS, (method, when, err.value)
                assert "out of range" in str(err.value) and when in str(err.value)
    s = Session(emulator)
    urn, cred, _ = s.create("datescm")
    for when in OUT_OF_RANGE:  # the CM reads expirations the same way
        got = s.cm.RenewSlice({"slice_urn": urn, "credentials": [cred], "expiration": when})
        assert got["code"] == GeniCode.BADARGS and "out of range" in got["output"], got
    assert not [r for r in caplog.records if r.exc_info or "Overflow" in r.getMessage()]
