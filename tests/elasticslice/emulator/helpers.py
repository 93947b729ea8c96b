"""A plain XML-RPC client over TLS for the emulator tests (stdlib only, like classic clients)."""
from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import os
import socketserver
import ssl
import threading
import time
import xmlrpc.client
from pathlib import Path
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elasticslice.rpc import pki

if TYPE_CHECKING:
    from elasticslice.emulator import EmulatorServer

REQUEST = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="n1" exclusive="true">
    <sliver_type name="raw-pc"/>
    <hardware_type name="m510"/>
    <interface client_id="n1:if0"/>
  </node>
  <node client_id="n2" exclusive="true">
    <sliver_type name="raw-pc"/>
    <interface client_id="n2:if0"/>
  </node>
  <link client_id="lan0">
    <interface_ref client_id="n1:if0"/>
    <interface_ref client_id="n2:if0"/>
  </link>
</rspec>
"""


def user_context(d: Path, cert: str = "user.pem", password: str | None = None,
                 ca: str = "ca.pem") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(d / ca))
    if cert:
        pw = password if password is not None else (d / "password").read_text().strip()
        ctx.load_cert_chain(str(d / cert), password=pw if cert == "user.pem" else None)
    return ctx


def proxy(emu: Any, module: str, ctx: ssl.SSLContext | None = None) -> xmlrpc.client.ServerProxy:
    return xmlrpc.client.ServerProxy(f"{emu.url}/{module}", context=ctx or user_context(emu.dir))


class Session:
    """A user's view: SA and CM proxies, the user credential, and slices it registered.

    ``ctx``: another user's TLS context (see :func:`other_user`); default the emulator's user.
    """

    def __init__(self, emu: Any, ctx: ssl.SSLContext | None = None) -> None:
        self.emu = emu
        self.sa = proxy(emu, "sa", ctx)
        self.cm = proxy(emu, "cm", ctx)
        self.dyn = proxy(emu, "dynslice", ctx)
        self.user_cred = ok(self.sa.GetCredential({}))

    def register(self, name: str = "myslice") -> tuple[str, str]:
        cred = ok(self.sa.Register({"credential": self.user_cred, "type": "Slice", "hrn": name}))
        return f"urn:publicid:IDN+emulab.test+slice+{name}", cred

    def create(self, name: str = "myslice", rspec: str = REQUEST) -> tuple[str, str, list]:
        urn, cred = self.register(name)
        value = ok(self.cm.CreateSliver({"slice_urn": urn, "rspec": rspec,
                                         "credentials": [cred]}))
        return urn, cred, value

    def status(self, urn: str, cred: str) -> dict[str, Any]:
        return ok(self.cm.SliverStatus({"slice_urn": urn, "credentials": [cred]}))


def other_user(emu: Any, uid: str) -> tuple[Session, Any]:
    """A second user of the emulator's CA (``emulator add-user``): their session and files."""
    from elasticslice.emulator.setup import issue_user
    files = issue_user(emu.dir, uid)
    ctx = ssl.create_default_context(cafile=str(emu.dir / "ca.pem"))
    ctx.load_cert_chain(str(files.pem), password=files.password.read_text().strip())
    return Session(emu, ctx), files


def ok(result: dict[str, Any]) -> Any:
    assert result["code"] == 0, result
    return result["value"]


def sign_with(d: Path, owner_pem: str, owner_urn: str, target_urn: str,
              expires: dt.datetime, signer: str = "sa", target_gid: str | None = None) -> str:
    """A credential signed by one of the emulator's authorities, for crafted cases
    (``target_gid`` defaults to the owner's certificate, right for a user credential)."""
    from elasticslice.rpc.credential import Credential, sign_credential
    cred = Credential(owner_gid=owner_pem, owner_urn=owner_urn,
                      target_gid=target_gid or owner_pem, target_urn=target_urn, expires=expires)
    return sign_credential(cred, (d / f"{signer}.pem").read_bytes(),
                           (d / f"{signer}-key.pem").read_bytes())


def user_cert_pem(d: Path) -> str:
    text = (d / "user.pem").read_text()
    return text[: text.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")] + "\n"


class CallbackEndpoint:
    """A real HTTPS XML-RPC client endpoint on ``host`` (its certificate from the emulator
    CA: the user's with ``user_cert``, else one for ``host`` naming ``urn``) that records
    the calls the emulator makes and answers NotifyDeletePending early or not. With
    ``values_delay`` it answers SetResourceValues that many seconds late (a slow client).
    ``on_pending(params)``, when set, runs before NotifyDeletePending is answered (a client
    that acts during the callback). With ``last_notice_delay`` a NotifyDeletePending whose
    nodes all have 0 s left is recorded that many seconds late (it is slow to arrive)."""

    def __init__(self, d: Path, tmp: Path, early: bool = True, user_cert: bool = False,
                 host: str = "127.0.0.1", urn: str | None = None) -> None:
        self.early = early
        self.values_delay = 0.0
        self.last_notice_delay = 0.0
        self.on_pending: Callable[[dict[str, Any]], None] | None = None
        self.calls: list[tuple[str, dict[str, Any], str | None]] = []
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        if user_cert:  # the user's own certificate serves the endpoint
            ctx.load_cert_chain(str(d / "user.pem"), password=(d / "password").read_text().strip())
        else:
            ca = (d / "ca.pem").read_bytes()
            cert, key = pki.issue_certificate(ca, (d / "ca-key.pem").read_bytes(), "endpoint",
                                              ips=[host], urn=urn)
            (tmp / "ep.pem").write_bytes(cert + key)
            ctx.load_cert_chain(str(tmp / "ep.pem"))
        ctx.load_verify_locations(str(d / "ca.pem"))
        ctx.verify_mode = ssl.CERT_REQUIRED
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                (params,), method = xmlrpc.client.loads(body)
                peer = self.connection.getpeercert() or {}
                urn = next((v for k, v in peer.get("subjectAltName", ()) if k == "URI"), None)
                if method == "SetResourceValues" and outer.values_delay:
                    time.sleep(outer.values_delay)
                if method == "NotifyDeletePending" and outer.last_notice_delay and all(
                        item.get("max_wait_time") == 0 for item in params["nodelist"]):
                    time.sleep(outer.last_notice_delay)
                outer.calls.append((method, params, urn))
                if method == "NotifyDeletePending" and outer.on_pending is not None:
                    outer.on_pending(params)
                value: Any = 0
                if method == "NotifyDeletePending" and outer.early:
                    value = [dict(item, max_wait_time=0) for item in params["nodelist"]]
                reply = xmlrpc.client.dumps(({"code": 0, "value": value, "output": ""},),
                                            methodresponse=True).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except OSError:  # the emulator gave up waiting (a slow client)
                    self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

            def get_request(self):  # type: ignore[no-untyped-def]
                sock, addr = super().get_request()
                return ctx.wrap_socket(sock, server_side=True), addr

        self.server = Server((host, 0), Handler)
        self.url = f"https://{host}:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def methods(self) -> list[str]:
        return [m for m, _, _ in self.calls]

    def values(self) -> list[dict[str, float]]:
        """Each SetResourceValues received, as {client_id: value}."""
        return [{n["client_id"]: n["value"] for n in p["nodelist"]}
                for m, p, _ in self.calls if m == "SetResourceValues"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def stubborn_startup(marker: str) -> str:
    """A startup command that ignores SIGTERM (so a teardown must wait and SIGKILL it) and
    keeps ``marker`` in its command line (see :func:`processes_with`)."""
    return f'trap "" TERM; : {marker}; while :; do sleep 1; done'


def processes_with(marker: str) -> list[int]:
    """Live processes of this machine whose command line contains ``marker`` (found from
    /proc, so wherever and in whatever PID namespace a node runs them), but the children
    of one: a child between its fork and its exec (a unit an agent is starting) still
    shows its parent's command line."""
    found: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        # a node's init (and the unshare around it) carries the startup command in its spec:
        # it is not one of the command's processes
        if marker in cmdline and fields[0] != "Z" and "nodeinit.py" not in cmdline:
            found[int(entry.name)] = int(fields[1])
    return [pid for pid, parent in found.items() if parent not in found]


# The emulator as the tests run it: fast boots and countdowns (see tests/conftest.py).
FAST = {"boot_delay": 0.2, "notify_interval": 0.2, "max_wait": 5}


@dataclass
class RunningEmulator:
    """An emulator started by the ``emulator`` fixtures: its directory and server."""
    dir: Path
    server: EmulatorServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def config_path(self) -> Path:
        return self.dir / "elasticslice.conf"

    @property
    def password(self) -> str:
        return (self.dir / "password").read_text().strip()

    @property
    def control_address(self) -> str:
        """Where the box's nodes reach this machine: its control address when nodes are on
        networks of their own (docs/emulator.md, "The node's network"), else 127.0.0.1."""
        assert self.server.ctx is not None and self.server.ctx.boot is not None
        return self.server.ctx.boot.control_address()


def dynamic_slice(emu: Any, ep: CallbackEndpoint, policy: str = "LIFO",
                  wait: int = 0) -> tuple[Session, str, str]:
    """A slice of ``emu`` whose callbacks go to ``ep``: (session, slice URN, credential)."""
    s = Session(emu)
    urn, cred, _ = s.create()
    ok(s.dyn.SetSliceClientEndpoint({"slice_urn": urn, "url": ep.url, "credentials": [cred],
                                     "policy": policy, "defwaittime": wait}))
    return s, urn, cred


def make_tarball(path: Path, files: dict[str, str], mode: int = 0o755) -> Path:
    """A .tar.gz at ``path`` holding ``files`` (name -> text)."""
    import io
    import tarfile
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return path


class FileServer:
    """Plain HTTP on 127.0.0.1 (port 0) serving a folder, as a web server the CM fetches
    tarballs from; ``fetches`` counts the GETs of each path, ``most_at_once`` the most GETs
    in flight together (each held ``hold`` seconds before it is answered, and counted until
    then)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fetches: dict[str, int] = {}
        self.hold = 0.0
        self.most_at_once = 0
        self._at_once = 0
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(server.root), **kwargs)

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                with server._lock:
                    server.fetches[path] = server.fetches.get(path, 0) + 1
                    server._at_once += 1
                    server.most_at_once = max(server.most_at_once, server._at_once)
                try:
                    if server.hold:
                        time.sleep(server.hold)
                finally:
                    # out of the count before the answer goes: a client that has it whole
                    # may ask again before this thread runs on (a busy machine counted two
                    # fetches made one after the other as together)
                    with server._lock:
                        server._at_once -= 1
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


_SCRIPTS: FileServer | None = None
_SCRIPTS_LOCK = threading.Lock()


def _scripts() -> FileServer:
    """One web server per test process for :func:`startup_args`' tarballs (127.0.0.1: the
    CM fetches from this machine), living as long as the process: the CM fetches every URL
    of a sliver again at each change."""
    global _SCRIPTS
    with _SCRIPTS_LOCK:
        if _SCRIPTS is None:
            import atexit
            import shutil
            import tempfile
            root = Path(tempfile.mkdtemp(prefix="box-startup-"))
            atexit.register(shutil.rmtree, root, True)
            _SCRIPTS = FileServer(root)
        return _SCRIPTS


def as_script(command: str) -> tuple[str, str | None]:
    """``(startup, tarball URL or None)``: ``command`` itself when CloudLab's CM takes it as
    a node's startup command in AddNodes (printable ASCII, at most 255 characters, no
    ``'``, ``<`` or ``&``), else what a CloudLab user does: the command in a script of a
    tarball (``/local/box-startup/<sha>.sh``, served over HTTP), started by ``sh <script>``."""
    import hashlib

    from elasticslice.rspec.addnodes import XML_BREAKERS
    from elasticslice.rspec.rules import startup_problem
    if startup_problem(command) is None and not any(c in command for c in XML_BREAKERS):
        return command, None
    name = hashlib.sha256(command.encode()).hexdigest()[:16]
    server = _scripts()
    tarball = server.root / f"{name}.tgz"
    if not tarball.exists():
        make_tarball(tarball.with_suffix(".part"), {f"local/box-startup/{name}.sh":
                                                    command + "\n"})
        tarball.with_suffix(".part").replace(tarball)
    return f"sh /local/box-startup/{name}.sh", f"{server.url}/{tarball.name}"


def startup_args(command: str, tarballs: tuple[str, ...] = ()) -> dict[str, Any]:
    """AddNodes arguments running ``command`` at boot (:func:`as_script`), after
    ``tarballs``."""
    startup, url = as_script(command)
    urls = [*tarballs, *([url] if url else [])]
    return {"startup": startup, **({"tarballs": urls} if urls else {})}


def script_node(client_id: str, command: str, **spec: Any) -> Any:
    """A request :class:`~elasticslice.rspec.NodeSpec` running ``command`` at boot (a
    script when CloudLab's startup rule would refuse it: :func:`as_script`)."""
    from elasticslice.rspec import NodeSpec
    startup, url = as_script(command)
    installs = list(spec.pop("installs", [])) + ([(url, "/")] if url else [])
    return NodeSpec(client_id, installs=installs, executes=[("sh", startup)], **spec)


def free_node(emu: Any, like: str = "pc01") -> str:
    """``like`` when it is free, else a free machine of its type: the mapper draws a new
    sliver's nodes at random (seeded only with ``seed``), so ``like`` may be one of them."""
    from elasticslice.emulator.store import Holder
    store = emu.server.ctx.store
    row = store.get_node(like)
    if row is not None and row.holder is Holder.FREE:
        return like
    return next(n.node_id for n in store.nodes(holder=Holder.FREE,
                                               hardware_type=row.hardware_type))


@contextlib.contextmanager
def cluster_box(directory: Path, clusters: tuple[str, ...] = ("utah", "wisc"),
                **settings: Any) -> Iterator[RunningEmulator]:
    """A box of several clusters (one SA, a CM each: ``emulator init --cm``) made in
    ``directory`` and served (``FAST``, then ``settings``) while the block runs."""
    from elasticslice.emulator import EmulatorServer, init_emulator
    d = init_emulator(directory, 0, clusters=clusters)
    server = EmulatorServer(d, port=0, **{**FAST, **settings}).start()
    try:
        yield RunningEmulator(d, server)
    finally:
        server.stop()


def try_connect(host: str, port: int) -> str:
    """"connected", or why not (the error's text): a TCP connection to ``host:port``."""
    import socket
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "connected"
    except OSError as err:
        return os.strerror(err.errno) if err.errno else str(err)
