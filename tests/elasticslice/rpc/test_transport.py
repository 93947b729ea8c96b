"""The XML-RPC/TLS transport against a real scripted HTTPS server."""
from __future__ import annotations

import logging

import pytest

from elasticslice.errors import CredentialError, RPCError, TransportError
from elasticslice.rpc.transport import RetryPolicy, XmlRpcTransport, make_ssl_context

from .tlsserver import Pki, ScriptedServer

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def server(certs):
    with ScriptedServer(certs) as srv:
        yield srv


def _transport(certs, *, ca=None, cert="user", timeout=5.0, retry=FAST, verify=True):
    ctx = make_ssl_context(certs.user if cert == "user" else None, certs.PASSWORD,
                           ca or certs.ca, verify=verify)
    return XmlRpcTransport(ctx, timeout=timeout, retry=retry, seed=1)


def test_call_sends_one_struct_and_unwraps_value(certs, server):
    with _transport(certs) as t:
        value = t.call(server.url, "GetVersion", {"list": (1, 2), "flag": True})
    assert value["method"] == "GetVersion"
    assert value["params"] == [{"list": [1, 2], "flag": True}]
    assert value["peer"] == certs.USER_URN


def test_none_is_refused_before_sending(certs, server):
    with _transport(certs) as t, pytest.raises(RPCError, match="marshal"):
        t.call(server.url, "GetVersion", {"x": None})
    assert server.calls == []


def test_keep_alive_uses_one_connection(certs, server):
    with _transport(certs) as t:
        for _ in range(5):
            t.call(server.url, "GetVersion")
        assert t.connections_opened == 1
    assert server.connections == 1


def test_new_connection_per_call_when_asked(certs, server):
    with _transport(certs) as t:
        for _ in range(3):
            t.call(server.url, "GetVersion", keep_alive=False)
    assert server.connections == 3


def test_reconnects_when_server_closed_connection(certs, server):
    server.script.extend(["close"])
    with _transport(certs) as t:
        t.call(server.url, "GetVersion")
        assert t.call(server.url, "Resolve")["method"] == "Resolve"
    assert server.connections == 2
    assert [m for m, _ in server.calls] == ["GetVersion", "Resolve"]


@pytest.mark.parametrize("transient", ["busy", "http503", "fault503", ("code", 8)])
def test_transient_failures_are_retried(certs, server, transient):
    server.script.extend([transient, transient])
    with _transport(certs) as t:
        assert t.call(server.url, "SliverStatus")["method"] == "SliverStatus"
    assert len(server.calls) == 3


def test_busy_storm_gives_up_with_code(certs, server, caplog):
    server.script.extend(["busy"] * 10)
    with _transport(certs) as t, pytest.raises(RPCError) as info:
        t.call(server.url, "CreateSliver", {"credentials": ["SECRET-CRED"]})
    assert info.value.code == 14
    assert info.value.method == "CreateSliver"
    assert "BUSY" in str(info.value) and "gave up after 3 attempts" in str(info.value)
    assert len(server.calls) == 3
    assert any("retry 1/2" in r.getMessage() for r in caplog.records)


def test_other_codes_raise_at_once_with_output(certs, server):
    server.script.append(("code", 12))
    with _transport(certs) as t, pytest.raises(RPCError) as info:
        t.call(server.url, "SliverStatus")
    err = info.value
    assert not isinstance(err, TransportError)
    assert (err.code, err.method, err.output) == (12, "SliverStatus", "scripted code 12")
    assert "SEARCHFAILED" in str(err) and "127.0.0.1" in err.server
    assert len(server.calls) == 1


def test_fault_is_transport_error_with_fault_code(certs, server):
    server.script.append("fault-32500")
    with _transport(certs) as t, pytest.raises(TransportError) as info:
        t.call(server.url, "GetCredential")
    assert info.value.code == -32500 and "no URN" in str(info.value)
    assert len(server.calls) == 1


def test_slow_answer_times_out_then_retries(certs, server):
    server.script.extend([("slow", 5.0)])
    with _transport(certs, timeout=0.3) as t:
        assert t.call(server.url, "DiscoverResources")["method"] == "DiscoverResources"
    assert len(server.calls) == 2


def test_always_slow_gives_up(certs, server):
    server.script.extend([("slow", 5.0)] * 2)
    retry = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01)
    with _transport(certs, timeout=0.3, retry=retry) as t, pytest.raises(TransportError,
                                                                         match="no answer"):
        t.call(server.url, "DiscoverResources")


def test_no_client_certificate_is_refused(certs, server):
    with _transport(certs, cert=None) as t, pytest.raises(TransportError, match="certificate"):
        t.call(server.url, "GetVersion")
    assert server.calls == []


def test_wrong_ca_is_refused(certs, server):
    with _transport(certs, ca=certs.other_ca) as t, pytest.raises(
            TransportError, match="server certificate not trusted"):
        t.call(server.url, "GetVersion")
    assert server.calls == []


def test_verification_off_is_explicit_and_warned(certs, server, caplog):
    caplog.set_level(logging.WARNING)
    with _transport(certs, ca=certs.other_ca, verify=False) as t:
        t.call(server.url, "GetVersion")
    assert any("verification is OFF" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)


def test_wrong_passphrase_is_credential_error(certs):
    with pytest.raises(CredentialError, match="wrong passphrase"):
        make_ssl_context(certs.user, "nope", certs.ca)


def test_logs_never_hold_credentials_or_passphrase(certs, server, caplog):
    caplog.set_level(logging.DEBUG)
    server.script.append("busy")
    with _transport(certs) as t:
        t.call(server.url, "SliverStatus", {"credentials": ["SECRET-CRED"]})
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "SliverStatus" in text
    assert "SECRET-CRED" not in text and certs.PASSWORD not in text


def test_one_keep_alive_connection_per_thread(certs, server):
    from concurrent.futures import ThreadPoolExecutor
    with _transport(certs) as t:
        def work(i):
            return [t.call(server.url, "GetVersion", {"i": i})["params"][0]["i"]
                    for _ in range(5)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(work, range(4)))
        assert results == [[i] * 5 for i in range(4)]
        assert t.connections_opened <= 4
    assert len(server.calls) == 20


def test_each_call_is_timed_by_method_retries_and_failures_included(certs, server):
    server.script.extend(["busy", "ok", ("code", 2)])
    t = _transport(certs)
    t.call(server.url, "GetVersion", {})            # BUSY, then SUCCESS: one call, retried
    with pytest.raises(RPCError):
        t.call(server.url, "DeleteNodes", {})       # a failure is timed too
    times = t.timings.snapshot()
    assert sorted(times) == ["DeleteNodes", "GetVersion"]
    assert times["GetVersion"].calls == 1 and times["DeleteNodes"].calls == 1
    assert times["GetVersion"].cumulative()[-1] == ("+Inf", 1)
    assert times["GetVersion"].total > 0
