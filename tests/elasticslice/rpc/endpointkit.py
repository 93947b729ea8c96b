"""Callers of a client endpoint for the tests: the CM (the emulator's cm.pem) and attackers.

``Callers(d, tmp)`` over an emulator directory ``d`` makes TLS client contexts for: the CM,
the user (same CA), a second user issued from the emulator CA key, a certificate with no
URN, a stranger CA's certificate (with the CM's URN, and with a user URN), a "CM" certificate
the user signs with their own key, and no certificate at all.
"""
from __future__ import annotations

import http.client
import ipaddress
import ssl
import urllib.parse
import xmlrpc.client
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from elasticslice.rpc import pki
from elasticslice.rpc.endpoint import EndpointServer, ProtoGeniClientServerEndpoint

CM_URN = "urn:publicid:IDN+emulab.test+authority+cm"


def _context(d: Path, cert: Path | None = None, key: Path | None = None,
             password: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key else None, password=password)
    return ctx


class Callers:
    def __init__(self, d: Path, tmp: Path) -> None:
        self.d = d
        self.tmp = tmp

    def _issue(self, name: str, ca_cert: bytes, ca_key: bytes, urn: str | None,
               ca_password: str | None = None) -> Path:
        cert, key = pki.issue_certificate(ca_cert, ca_key, name, urn=urn,
                                          ca_key_password=ca_password)
        path = self.tmp / f"{name}.pem"
        pki.write_private_file(path, cert + key)
        return path

    def cm(self, url: str | None = None) -> ssl.SSLContext:
        """The CM's certificate. For an endpoint at ``url`` on the box's control address,
        checked against the CA but not for that address, as the box's CM does
        (``elasticslice/emulator/callbacks.py``: the user's certificate names 127.0.0.1)."""
        ctx = _context(self.d, self.d / "cm.pem", self.d / "cm-key.pem")
        host = urllib.parse.urlsplit(url).hostname if url else None
        if host and ipaddress.ip_address(host) in ipaddress.ip_network("100.64.0.0/10"):
            ctx.check_hostname = False
        return ctx

    def user(self) -> ssl.SSLContext:
        password = (self.d / "password").read_text().strip()
        return _context(self.d, self.d / "user.pem", password=password)

    def second_user(self) -> ssl.SSLContext:
        path = self._issue("mallory", (self.d / "ca.pem").read_bytes(),
                           (self.d / "ca-key.pem").read_bytes(),
                           "urn:publicid:IDN+emulab.test+user+mallory")
        return _context(self.d, path)

    def no_urn(self) -> ssl.SSLContext:
        path = self._issue("nourn", (self.d / "ca.pem").read_bytes(),
                           (self.d / "ca-key.pem").read_bytes(), None)
        return _context(self.d, path)

    def stranger(self, urn: str = CM_URN) -> ssl.SSLContext:
        ca, ca_key = pki.make_ca("stranger CA")
        return _context(self.d, self._issue("stranger", ca, ca_key, urn))

    def user_signed_cm(self) -> ssl.SSLContext:
        """The user's own key and certificate posing as a CA for a certificate with the CM's URN."""
        text = (self.d / "user.pem").read_text()
        end = text.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")
        password = (self.d / "password").read_text().strip()
        path = self._issue("fakecm", text[:end].encode(), text[end:].encode(), CM_URN,
                           ca_password=password)
        return _context(self.d, path)

    def anonymous(self) -> ssl.SSLContext:
        return _context(self.d)


def call(url: str, ctx: ssl.SSLContext, method: str, *args: Any) -> Any:
    proxy = xmlrpc.client.ServerProxy(url, context=ctx)
    try:
        return getattr(proxy, method)(*args)
    finally:
        proxy("close")()


def post(port: int, ctx: ssl.SSLContext, body: bytes,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A raw POST (for bodies no XML-RPC client would send)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
    try:
        conn.request("POST", "/", body=body, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


@contextmanager
def serving(d: Path, endpoint: ProtoGeniClientServerEndpoint, **options: Any
            ) -> Iterator[EndpointServer]:
    """``endpoint`` served on 127.0.0.1 with the user's certificate (localhost SANs), callers
    from the emulator CA, and only the CM allowed (unless ``allowed_urns`` says otherwise)."""
    options.setdefault("allowed_urns", {CM_URN})
    server = EndpointServer(endpoint, certfile=d / "user.pem",
                            password=(d / "password").read_text().strip(),
                            ca_file=d / "ca.pem", **options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
