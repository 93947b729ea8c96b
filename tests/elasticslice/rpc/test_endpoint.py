"""The callback endpoint server: only the CM gets in, whatever an attacker presents; bad
requests get clear answers and the server keeps serving; a hostile peer cannot exhaust it."""
from __future__ import annotations

import dataclasses
import socket
import ssl
import xmlrpc.client
from pathlib import Path
from typing import Any

import pytest

from elasticslice.emulator.callbacks import CallbackClient
from elasticslice.emulator.store import EndpointRow
from elasticslice.rpc.codes import FAULT_NO_SUCH_METHOD, FAULT_PARSE, GeniCode
from elasticslice.rpc.endpoint import (BadArgs, EndpointError, EndpointServer,
                                       ProtoGeniClientServerEndpoint, endpoint_limits,
                                       response)
from elasticslice.serving import Limits
from tests.helpers import wait_for
from tests.elasticslice.rpc.endpointkit import CM_URN, Callers, call, post, serving


class Recorder(ProtoGeniClientServerEndpoint):
    RPC_METHODS = ("GetVersion", "Echo", "Boom", "Picky", "Unsendable")

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def Echo(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        self.calls.append(("Echo", params))
        return response(GeniCode.SUCCESS, params)

    def Boom(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        self.calls.append(("Boom", params))
        raise RuntimeError("secret-token-123 exploded")

    def Picky(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        raise BadArgs("nodelist[0].node_id: expected a string")

    def Unsendable(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        return response(GeniCode.SUCCESS, None)

    def NotServed(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        self.calls.append(("NotServed", params))
        return response(GeniCode.SUCCESS)


@pytest.fixture
def callers(emulator_pki: Path, tmp_path: Path) -> Callers:
    return Callers(emulator_pki, tmp_path)


@pytest.fixture
def served(emulator_pki: Path) -> Any:
    endpoint = Recorder()
    with serving(emulator_pki, endpoint) as server:
        yield server, endpoint


def test_listens_on_loopback_and_the_cm_gets_answers(served, callers):
    server, endpoint = served
    assert server.url == f"https://127.0.0.1:{server.port}/"
    assert call(server.url, callers.cm(), "GetVersion", {}) == \
        {"code": 0, "value": "1.0", "output": "1.0"}
    assert call(server.url, callers.cm(), "Echo", {"a": [1, "x"]})["value"] == {"a": [1, "x"]}
    assert endpoint.calls == [("Echo", {"a": [1, "x"]})]


@pytest.mark.parametrize("who", ["user", "second_user", "no_urn"])
def test_certificates_of_the_same_ca_that_are_not_the_cm_are_forbidden(served, callers, who):
    server, endpoint = served
    answer = call(server.url, getattr(callers, who)(), "Echo", {"nodelist": []})
    assert answer["code"] == GeniCode.FORBIDDEN
    assert "only the CM" in answer["output"]
    assert endpoint.calls == []  # the method never ran
    assert call(server.url, callers.cm(), "Echo", {})["code"] == 0  # and the CM still gets in


@pytest.mark.parametrize("who", ["stranger", "stranger_user", "user_signed_cm", "anonymous"])
def test_certificates_the_ca_does_not_vouch_for_never_get_past_tls(served, callers, who):
    server, endpoint = served
    ctx = callers.stranger("urn:publicid:IDN+emulab.test+user+alice") \
        if who == "stranger_user" else getattr(callers, who)()
    with pytest.raises((ssl.SSLError, ConnectionError, OSError, xmlrpc.client.ProtocolError)):
        call(server.url, ctx, "Echo", {})
    assert endpoint.calls == []
    assert call(server.url, callers.cm(), "Echo", {})["code"] == 0


def test_allowed_urns_is_asked_per_call_and_a_failing_lookup_refuses(emulator_pki, callers):
    allowed: list[str] = []

    def lookup() -> list[str]:
        if allowed == ["raise"]:
            raise OSError("GetVersion failed")
        return allowed
    with serving(emulator_pki, Recorder(), allowed_urns=lookup) as server:
        assert call(server.url, callers.cm(), "Echo", {})["code"] == GeniCode.FORBIDDEN
        allowed.append(CM_URN)
        assert call(server.url, callers.cm(), "Echo", {})["code"] == 0
        allowed[:] = ["raise"]
        assert call(server.url, callers.cm(), "Echo", {})["code"] == GeniCode.FORBIDDEN


def test_the_emulators_own_callback_client_is_accepted(emulator, tmp_path):
    """The real caller: the emulator's CallbackClient, with its CM certificate."""
    class Early(ProtoGeniClientServerEndpoint):
        RPC_METHODS = ("NotifyDeletePending",)

        def NotifyDeletePending(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
            return response(GeniCode.SUCCESS,
                            [dict(n, max_wait_time=0) for n in params["nodelist"]])
    with serving(emulator.dir, Early()) as server:
        row = EndpointRow("urn:publicid:IDN+emulab.test+slice+x", server.url, "LIFO", 5,
                          "urn:publicid:IDN+emulab.test+user+alice")
        client = CallbackClient(emulator.server.ctx)
        nodes = [{"node_id": "pc1", "client_id": "n1", "max_wait_time": 5}]
        assert client.notify_delete_pending(row, nodes) == {"pc1"}
        assert client.failures == 0


def test_unknown_methods_and_unreadable_bodies_are_faults(served, callers):
    server, endpoint = served
    for method in ("NotServed", "system.listMethods", "_reply", "__init__", "dispatch"):
        status, body = post(server.port, callers.cm(), xmlrpc.client.dumps(({},), method).encode())
        with pytest.raises(xmlrpc.client.Fault) as fault:
            xmlrpc.client.loads(body)
        assert fault.value.faultCode == FAULT_NO_SUCH_METHOD
    assert endpoint.calls == []
    status, body = post(server.port, callers.cm(), b"<methodCall><oops")
    assert status == 200
    with pytest.raises(xmlrpc.client.Fault) as fault:
        xmlrpc.client.loads(body)
    assert fault.value.faultCode == FAULT_PARSE


@pytest.mark.parametrize("args, expect", [
    ((), 0),                                   # no params: an empty struct
    (({}, {}), GeniCode.BADARGS),              # two params
    (("nodelist",), GeniCode.BADARGS),         # not a struct
    (([1, 2],), GeniCode.BADARGS),
])
def test_params_that_are_not_one_struct_are_badargs(served, callers, args, expect):
    server, _ = served
    answer = call(server.url, callers.cm(), "Echo", *args)
    assert answer["code"] == expect
    if expect:
        assert answer["output"].startswith("Echo: ") and "\n" not in answer["output"]


def test_a_failing_method_is_a_servererror_and_the_server_keeps_serving(served, callers,
                                                                         caplog):
    server, endpoint = served
    boom = call(server.url, callers.cm(), "Boom", {})
    assert boom["code"] == GeniCode.SERVERERROR
    assert "secret-token-123" not in boom["output"]  # the caller gets no internals
    assert "Boom from " + CM_URN in caplog.text   # the log has the context
    picky = call(server.url, callers.cm(), "Picky", {})
    assert picky == {"code": GeniCode.BADARGS, "value": 0,
                     "output": "Picky: nodelist[0].node_id: expected a string"}
    assert call(server.url, callers.cm(), "Unsendable", {})["code"] == GeniCode.SERVERERROR
    assert call(server.url, callers.cm(), "Echo", {"still": "here"})["value"] == {"still": "here"}


def test_a_body_over_the_limit_is_refused_before_it_is_read(emulator_pki, callers):
    endpoint = Recorder()
    with serving(emulator_pki, endpoint, max_body=4096) as server:
        big = xmlrpc.client.dumps(({"pad": "x" * 5000},), "Echo").encode()
        status, _ = post(server.port, callers.cm(), big)
        assert status == 413
        status, _ = post(server.port, callers.cm(), b"", {"Content-Length": "-5"})
        assert status == 411
        assert endpoint.calls == []
        assert call(server.url, callers.cm(), "Echo", {"small": 1})["value"] == {"small": 1}


def _small(**changes: Any) -> Limits:
    return dataclasses.replace(endpoint_limits(workers=2), **changes)


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_idle_connections_never_keep_the_cm_out(emulator_pki, callers):
    """Broke: 4 workers, each held by a silent connection until its handshake timeout, and
    every connection beyond them refused, the CM's too. Now a silent connection holds no
    worker, and a full table evicts its oldest silent connection for a newcomer. (The hogs'
    handshake deadline is long: on a loaded machine they outlived the default 5 s, were cut
    off by it, and the table never held 4.)"""
    limits = _small(max_connections=4, handshake_deadline=300.0)
    with serving(emulator_pki, Recorder(), limits=limits) as server:
        hogs: list[socket.socket] = []

        def full() -> bool:
            """Top the table up with silent peers until it holds 4 (a hog the server
            dropped meanwhile, as a loaded machine's did, is replaced)."""
            for hog in [h for h in hogs if _closed_by_peer(h)]:
                hogs.remove(hog)
                hog.close()
            hogs.extend(socket.create_connection(("127.0.0.1", server.port))
                        for _ in range(4 - len(hogs)))
            return server.open_connections() == 4
        try:
            for _ in range(3):   # the table full of silent peers each time
                wait_for(full, what="4 hogs held")
                assert call(server.url, callers.cm(), "Echo", {})["code"] == 0
                oldest = hogs.pop(0)
                oldest.settimeout(10)
                assert oldest.recv(1) == b""   # the oldest went
                oldest.close()
            # one eviction per call at least (a hog that topped the table up while the call's
            # connection was still counted, on a loaded machine, makes one more)
            assert server.stats()["idle connections evicted (all slots taken)"] >= 3
        finally:
            for hog in hogs:
                hog.close()


def test_a_peer_trickling_its_request_is_cut_off(emulator_pki, callers):
    """Slowloris: a same-CA peer sends a header byte at a time; its whole request is due
    within the request deadline, whatever it sends meanwhile, and the CM is served."""
    with serving(emulator_pki, Recorder(), limits=_small(request_deadline=1.0)) as server:
        raw = socket.create_connection(("127.0.0.1", server.port))
        slow = callers.user().wrap_socket(raw, server_hostname="127.0.0.1")
        slow.sendall(b"POST / HTTP/1.1\r\n")

        def cut_off() -> bool:
            try:
                slow.sendall(b"X")
                slow.settimeout(0.2)
                return slow.recv(1) == b""
            except (TimeoutError, socket.timeout):
                return False
            except (OSError, ssl.SSLError):
                return True
        try:
            assert _cm_gets_in(server, callers)
            wait_for(cut_off, timeout=60, what="the trickling connection closed")
            assert server.stats()["requests over their deadline"] == 1
        finally:
            slow.close()


def _cm_gets_in(server: EndpointServer, callers: Callers) -> bool:
    try:
        return call(server.url, callers.cm(), "Echo", {})["code"] == 0
    except (OSError, ssl.SSLError, xmlrpc.client.ProtocolError):
        return False


def test_bad_certificate_files_are_one_clear_error(emulator_pki, tmp_path):
    with pytest.raises(EndpointError, match="cannot load the endpoint's certificate"):
        EndpointServer(Recorder(), certfile=tmp_path / "missing.pem",
                       ca_file=emulator_pki / "ca.pem", allowed_urns={CM_URN})
    with pytest.raises(EndpointError, match="cannot load the endpoint's certificate"):
        EndpointServer(Recorder(), certfile=emulator_pki / "user.pem", password="wrong",
                       ca_file=emulator_pki / "ca.pem", allowed_urns={CM_URN})
    with pytest.raises(EndpointError, match="cannot load the CA certificate"):
        EndpointServer(Recorder(), certfile=emulator_pki / "cm.pem",
                       keyfile=emulator_pki / "cm-key.pem", ca_file=tmp_path / "nope.pem",
                       allowed_urns={CM_URN})


def test_a_port_in_use_is_one_clear_error(served, emulator_pki):
    server, _ = served
    other = EndpointServer(Recorder(), certfile=emulator_pki / "cm.pem",
                           keyfile=emulator_pki / "cm-key.pem", ca_file=emulator_pki / "ca.pem",
                           allowed_urns={CM_URN}, port=server.port)
    with pytest.raises(EndpointError, match=f"cannot listen on 127.0.0.1:{server.port}"):
        other.start()
