"""Failures against the emulator over real TLS: identity, trust, credentials, slices, BUSY."""
from __future__ import annotations

import datetime as dt

import pytest

from elasticslice.errors import ConfigError, RPCError, TransportError
from elasticslice.rpc import credential as cr
from elasticslice.rpc import pki
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.transport import RetryPolicy, XmlRpcTransport, make_ssl_context

from .helpers import genilib_request


def test_no_client_certificate_is_refused(emu):
    ctx = make_ssl_context(None, None, emu.dir / "ca.pem")
    with XmlRpcTransport(ctx, retry=RetryPolicy(attempts=2, base_delay=0.01)) as t:
        with pytest.raises(TransportError, match="(?i)certificate"):
            t.call(f"{emu.url}/sa", "GetVersion")


def test_certificate_from_another_ca_is_refused(emu, tmp_path):
    ca, ca_key = pki.make_ca("elsewhere")
    cert, key = pki.issue_certificate(ca, ca_key, "mallory",
                                      urn="urn:publicid:IDN+emulab.test+user+mallory")
    pem = pki.write_user_pem(tmp_path / "mallory.pem", cert, key, "pw")
    ctx = make_ssl_context(pem, "pw", emu.dir / "ca.pem")
    with XmlRpcTransport(ctx, retry=RetryPolicy(attempts=2, base_delay=0.01)) as t:
        with pytest.raises(TransportError, match="(?i)certificate"):
            t.call(f"{emu.url}/sa", "GetVersion")


def test_server_from_wrong_ca_is_not_trusted(emu, tmp_path):
    other, _ = pki.make_ca("not the emulator")
    (tmp_path / "other.pem").write_bytes(other)
    with emu.client(ELASTICSLICE_CA_BUNDLE=str(tmp_path / "other.pem")) as server:
        with pytest.raises(TransportError, match="server certificate not trusted") as info:
            server.get_version()
        assert info.value.method == "GetVersion"


def test_wrong_passphrase_names_the_certificate(emu, tmp_path):
    (tmp_path / "pw").write_text("wrong\n")
    with emu.client(ELASTICSLICE_PASSPHRASE_FILE=str(tmp_path / "pw")) as server:
        with pytest.raises(ConfigError, match=r"\[certificate\].*wrong passphrase"):
            server.get_version()


def _registered(emu):
    server = emu.client()
    server.register_slice()
    server.create_sliver(genilib_request("a"))
    return server


def _status_with(server, credentials):
    return server.cm().call("SliverStatus", {"slice_urn": server.slice_urn(),
                                             "credentials": credentials})


def test_tampered_credential_is_forbidden(emu):
    with _registered(emu) as server:
        cred = server.get_slice_credential()
        assert _status_with(server, [cred])["status"]
        forged = cred.replace("<uuid>", "<uuid>0")
        assert forged != cred
        with pytest.raises(RPCError) as info:
            _status_with(server, [forged])
        assert info.value.code == GeniCode.FORBIDDEN and "altered" in str(info.value)


def test_tampered_cached_credential_is_fetched_anew(emu):
    with _registered(emu) as server:
        cred = server.get_slice_credential()
    files = [f for f in emu.cache_dir.rglob("*.xml") if "slice" in f.name]
    assert len(files) == 1
    forged = cred.replace("<uuid>", "<uuid>0")
    files[0].write_text(forged)
    with emu.client() as fresh:
        assert fresh.sliver_status().nodes[0].client_id == "a"
    # Compare with the forgery itself: a fresh credential's uuid may start with "0" too.
    assert files[0].read_text() != forged


def test_expired_credential_is_forbidden(emu):
    with _registered(emu) as server:
        good = cr.parse_credential(server.get_slice_credential())
        good.expires = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)
        expired = cr.sign_credential(good, (emu.dir / "sa.pem").read_bytes(),
                                     (emu.dir / "sa-key.pem").read_bytes())
        with pytest.raises(RPCError) as info:
            _status_with(server, [expired])
        assert info.value.code == GeniCode.FORBIDDEN and "expired" in str(info.value)


def test_credentials_must_be_an_array(emu):
    with _registered(emu) as server:
        with pytest.raises(RPCError) as info:
            _status_with(server, server.get_slice_credential())
        assert info.value.code == GeniCode.BADARGS


def test_wrong_slice(emu):
    with _registered(emu) as server:
        cred = server.get_slice_credential()
        other = emu.client(ELASTICSLICE_SLICE_NAME="other")
        # a slice that was never registered
        with pytest.raises(RPCError) as info:
            other.sliver_status()
        assert info.value.code == GeniCode.SEARCHFAILED
        # a real credential, for another slice than the one named
        other.register_slice()
        with pytest.raises(RPCError) as info:
            other.cm().call("SliverStatus", {"slice_urn": other.slice_urn(),
                                             "credentials": [cred]})
        assert info.value.code == GeniCode.FORBIDDEN
        other.close()


def test_someone_elses_credential_is_not_yours(emu, tmp_path):
    with _registered(emu) as server:
        cred = server.get_slice_credential()
    ca = (emu.dir / "ca.pem").read_bytes()
    cert, key = pki.issue_certificate(ca, (emu.dir / "ca-key.pem").read_bytes(), "bob",
                                      urn="urn:publicid:IDN+emulab.test+user+bob")
    pem = pki.write_user_pem(tmp_path / "bob.pem", cert, key, "pw")
    with XmlRpcTransport(make_ssl_context(pem, "pw", emu.dir / "ca.pem")) as t:
        with pytest.raises(RPCError) as info:
            t.call(f"{emu.url}/cm", "SliverStatus",
                   {"slice_urn": server.slice_urn(), "credentials": [cred]})
    assert info.value.code == GeniCode.FORBIDDEN
    assert "This is not your credential" in str(info.value)


@pytest.mark.parametrize("emu_options", [{"boot_delay": 60.0}])
def test_busy_storm_is_retried_then_surfaced(emu, caplog):
    """DeleteSlice answers BUSY while nodes boot: the client retries, then gives up."""
    with _registered(emu) as server:
        with pytest.raises(RPCError) as info:
            server.delete_slice()
    assert info.value.code == GeniCode.BUSY and "gave up after 4 attempts" in str(info.value)
    retries = [r for r in caplog.records if "DeleteSlice" in r.getMessage() and "retry" in
               r.getMessage()]
    assert len(retries) == 3


@pytest.mark.parametrize("emu_options", [{"boot_delay": 0.05, "fault_rate": 0.4, "seed": 3,
                                          "slow_seconds": 0.1}])
def test_flaky_server_is_survived(emu):
    """BUSY, 503 and slow answers on 40% of the calls: retries carry the slice through."""
    retry = RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.05)
    with emu.client(retry=retry) as server:
        server.register_slice()
        server.create_sliver(genilib_request("a", "b"))
        for _ in range(10):
            assert server.sliver_status().nodes
    hits = {k.value: v for k, v in emu.server.faults.counts.items() if k.value != "none"}
    assert sum(hits.values()) >= 3, hits
