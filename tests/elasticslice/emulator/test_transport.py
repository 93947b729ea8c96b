"""The emulator's TLS and XML-RPC transport: client certificates, paths, faults, keep-alive."""
from __future__ import annotations

import http.client
import ssl
import xmlrpc.client

import pytest

from elasticslice.rpc import pki
from tests.elasticslice.emulator.helpers import ok, proxy, user_context


def test_calls_over_tls_with_the_user_certificate(emulator):
    assert ok(proxy(emulator, "sa").GetVersion({})) == pytest.approx(1.01)
    version = ok(proxy(emulator, "cm").GetVersion({}))
    assert version["api"] == 2 and "3" in version["input_rspec"]


@pytest.mark.parametrize("path", ["cm", "cm/2.0", "cm/2.0/",
                                  "../../project/myproj/protogeni/xmlrpc/cm"])
def test_cm_paths_all_mean_api_2(emulator, path):
    url = f"{emulator.url}/{path}".replace("/protogeni/xmlrpc/../../", "/")
    server = xmlrpc.client.ServerProxy(url, context=user_context(emulator.dir))
    assert ok(server.GetVersion({}))["api"] == 2


def test_no_client_certificate_is_refused_in_the_handshake(emulator):
    ctx = ssl.create_default_context(cafile=str(emulator.dir / "ca.pem"))
    server = xmlrpc.client.ServerProxy(f"{emulator.url}/sa", context=ctx)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        server.GetVersion({})


def test_certificate_from_another_ca_is_refused(emulator, tmp_path):
    ca, ca_key = pki.make_ca("someone else")
    cert, key = pki.issue_certificate(ca, ca_key, "mallory",
                                      urn="urn:publicid:IDN+emulab.test+user+mallory")
    (tmp_path / "m.pem").write_bytes(cert + key)
    ctx = ssl.create_default_context(cafile=str(emulator.dir / "ca.pem"))
    ctx.load_cert_chain(str(tmp_path / "m.pem"))
    server = xmlrpc.client.ServerProxy(f"{emulator.url}/sa", context=ctx)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        server.GetVersion({})


def test_certificate_without_urn_gets_fault_32500(emulator, tmp_path):
    d = emulator.dir
    cert, key = pki.issue_certificate((d / "ca.pem").read_bytes(), (d / "ca-key.pem").read_bytes(),
                                      "nobody")
    (tmp_path / "n.pem").write_bytes(cert + key)
    ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
    ctx.load_cert_chain(str(tmp_path / "n.pem"))
    with pytest.raises(xmlrpc.client.Fault) as info:
        xmlrpc.client.ServerProxy(f"{emulator.url}/sa", context=ctx).GetVersion({})
    assert info.value.faultCode == -32500


def test_unknown_method_and_module_are_faults(emulator):
    with pytest.raises(xmlrpc.client.Fault) as info:
        proxy(emulator, "sa").NoSuchThing({})
    assert info.value.faultCode == -32497
    with pytest.raises(xmlrpc.client.Fault) as info:
        proxy(emulator, "nomodule").GetVersion({})
    assert info.value.faultCode == -32500


def test_user_certificate_cannot_use_the_admin_path(emulator):
    with pytest.raises(xmlrpc.client.Fault) as info:
        proxy(emulator, "admin").Status({})
    assert info.value.faultCode == -32500


def test_many_calls_share_one_keep_alive_connection(emulator):
    conn = http.client.HTTPSConnection("127.0.0.1", emulator.server.port,
                                       context=user_context(emulator.dir))
    body = xmlrpc.client.dumps(({},), "GetVersion").encode()
    socks = set()
    for _ in range(3):
        conn.request("POST", "/protogeni/xmlrpc/cm", body, {"Content-Type": "text/xml"})
        resp = conn.getresponse()
        (value,), _ = xmlrpc.client.loads(resp.read())
        assert value["code"] == 0
        socks.add(id(conn.sock))
    conn.close()
    assert len(socks) == 1
