"""A tiny scripted HTTPS XML-RPC server for transport tests (real TLS, client certs required).

Each call pops the next action from ``script`` (default: answer SUCCESS with the params):
``"busy"`` (code 14), ``"http503"``, ``"fault503"``, ``"fault-32500"``, ``("code", n)``,
``("slow", seconds)``, ``"close"`` (answer, then close the connection).
"""
from __future__ import annotations

import http.server
import socketserver
import ssl
import threading
import xmlrpc.client
from collections import deque
from pathlib import Path
from typing import Any

from elasticslice.rpc import pki


class Pki:
    """CA, server certificate for 127.0.0.1, and a user PEM with an encrypted key."""

    PASSWORD = "correct horse"
    USER_URN = "urn:publicid:IDN+emulab.test+user+alice"

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        ca_cert, ca_key = pki.make_ca("Test CA")
        self.ca = root / "ca.pem"
        self.ca.write_bytes(ca_cert)
        cert, key = pki.issue_certificate(ca_cert, ca_key, "localhost", hostnames=["localhost"],
                                          ips=["127.0.0.1"])
        self.server_cert = root / "server.pem"
        self.server_cert.write_bytes(cert)
        self.server_key = root / "server.key"
        pki.write_private_file(self.server_key, key)
        ucert, ukey = pki.issue_certificate(
            ca_cert, ca_key, "alice", urn=self.USER_URN,
            aia_url="https://127.0.0.1:1/protogeni/xmlrpc/sa")
        self.user = pki.write_user_pem(root / "user.pem", ucert, ukey, self.PASSWORD)
        self.password_file = root / "password"
        self.password_file.write_text(self.PASSWORD + "\n")
        other_cert, _ = pki.make_ca("Other CA")
        self.other_ca = root / "other-ca.pem"
        self.other_ca.write_bytes(other_cert)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ScriptedServer

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        params, method = xmlrpc.client.loads(body, use_builtin_types=True)
        srv = self.server
        with srv.lock:
            srv.calls.append((method, params))
            action = srv.script.popleft() if srv.script else "ok"
        close = False
        if isinstance(action, tuple) and action[0] == "slow":
            srv.stopping.wait(action[1])
            action = "ok"
        if action == "close":
            close, action = True, "ok"
        if action == "http503":
            self._send(503, b"overloaded", close)
            return
        if action == "fault503":
            payload = xmlrpc.client.dumps(xmlrpc.client.Fault(503, "overloaded"),
                                          methodresponse=True)
        elif action == "fault-32500":
            payload = xmlrpc.client.dumps(xmlrpc.client.Fault(-32500, "no URN in certificate"),
                                          methodresponse=True)
        else:
            code = 14 if action == "busy" else (action[1] if isinstance(action, tuple) else 0)
            value: Any = {"method": method, "params": list(params), "peer": self._urn()}
            answer = {"code": code, "value": value if code == 0 else 0,
                      "output": "" if code == 0 else f"scripted code {code}"}
            payload = xmlrpc.client.dumps((answer,), methodresponse=True, allow_none=False)
        self._send(200, payload.encode(), close)

    def _urn(self) -> str:
        for kind, value in self.connection.getpeercert().get("subjectAltName", ()):
            if kind == "URI":
                return value
        return ""

    def _send(self, status: int, data: bytes, close: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class ScriptedServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self, p: Pki) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(p.server_cert), str(p.server_key))
        ctx.load_verify_locations(cafile=str(p.ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
        self.socket = ctx.wrap_socket(self.socket, server_side=True)
        self.script: deque[Any] = deque()
        self.calls: list[tuple[str, tuple]] = []
        self.connections = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def get_request(self):  # noqa: ANN201
        conn, addr = super().get_request()
        with self.lock:
            self.connections += 1
        return conn, addr

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        pass  # failed handshakes (no client cert) are expected in tests

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}/protogeni/xmlrpc/cm"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()
