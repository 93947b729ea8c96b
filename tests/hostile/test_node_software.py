"""The node's software, as an attacker on the path between a node and the control node would
swap it: a real node of the box builds its agent's environment with the lines the cluster
gives it (the wheelhouse root it serves, the cluster CA), but reaches the control node
through the attacker, who serves a wheelhouse of its own making: a wheel swapped (its line of
``wheels.txt`` rewritten to match) or ``wheels.txt`` swapped (an extra wheel listed). The
attacker holds what a compromised node holds: a worker certificate of the cluster CA. The
node's start fails with one line naming what failed verification, which its start script
also posts to the control node (as any failure of its start), and nothing of the
attacker's is installed; reached directly, the same lines build the environment."""
from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import io
import shutil
import socket
import ssl
import tarfile
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from elasticslice.emulator import isolate
from elasticslice.pilots.bootstrap import env_script
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.helper import script_head
from elasticslice.pilots.publish import TarballPublisher
from elasticslice.pilots.wheelhouse import this_platform, this_python
from elasticslice.pilots.wheelroot import serve_for_image
from elasticslice.rspec import NodeSpec, build_request
from tests.elasticslice.emulator.helpers import Session
from tests.elasticslice.emulator.node_helpers import add_node, exited, runlog
from tests.helpers import wait_for

pytestmark = pytest.mark.skipif(
    isolate.choose({}).isolation is not isolate.Isolation.NAMESPACES,
    reason=f"Linux namespaces unavailable here: {isolate.choose({}).reason}")

INSTALL = "/local/pilot"
EVIL = 'print("the attacker\'s code ran")\n'
#: what the node runs once its environment is built: whether the attacker's module is there
PROBE = ('"$py" -c "import importlib.util as u; print(\'probe\', '
         'u.find_spec(\'evil_was_here\') is not None)"\n')


# ------------------------------------------------------------------ the attacker ----------
def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}\n"


def evil_wheel() -> tuple[str, bytes]:
    """A wheel of the attacker's: ``evil_was_here``, a module that runs its code."""
    name, files = "evil_was_here-1.0-py3-none-any.whl", {
        "evil_was_here.py": EVIL.encode(),
        "evil_was_here-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: evil-was-here\n"
                                                 b"Version: 1.0\n",
        "evil_was_here-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                              b"Tag: py3-none-any\n"}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        record = ""
        for path, data in files.items():
            out.writestr(path, data)
            record += record_line(path, data)
        out.writestr("evil_was_here-1.0.dist-info/RECORD",
                     record + "evil_was_here-1.0.dist-info/RECORD,,\n")
    return name, buf.getvalue()


def swapped_wheel(house: Path, into: Path) -> None:
    """The wheelhouse with one wheel swapped: the same name, the attacker's module added,
    its line of ``wheels.txt`` rewritten to the new digest and size."""
    lines = (house / "wheels.txt").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.split()[-1].startswith("tblib-"))
    name = lines[at].split()[-1]
    buf = io.BytesIO((house / name).read_bytes())
    with zipfile.ZipFile(buf, "a") as wheel:
        wheel.writestr("evil_was_here.py", EVIL)
    data = buf.getvalue()
    (into / name).write_bytes(data)
    lines[at] = f"{hashlib.sha256(data).hexdigest()} {len(data)} {name}\n"
    (into / "wheels.txt").write_text("".join(lines))


def swapped_list(house: Path, into: Path) -> None:
    """The wheelhouse's own wheels, and a ``wheels.txt`` that lists the attacker's too."""
    name, data = evil_wheel()
    (into / name).write_bytes(data)
    text = (house / "wheels.txt").read_text()
    (into / "wheels.txt").write_text(
        text + f"{hashlib.sha256(data).hexdigest()} {len(data)} {name}\n")


def worker_context(ca: ClusterCA, tmp_path: Path) -> ssl.SSLContext:
    """What a compromised node can serve TLS with: its own worker certificate (OU worker)
    of the cluster CA, for its own key."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "node.pem").write_bytes(ca.certify("node-9", public))
    (tmp_path / "node.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "node.pem", tmp_path / "node.key")
    return context


@contextlib.contextmanager
def on_path(host: str, fake: Path, tls: ssl.SSLContext) -> Iterator[str]:
    """The attacker, at ``host``: answers what the node asks the control node's wheelhouse
    (``.../<node tag>/<file>``) from ``fake``, over TLS when the node speaks TLS (with
    ``tls``), else in the clear. Yields its ``host:port``."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            parts = urllib.parse.urlsplit(self.path).path.split("/")
            tag = next((i for i, p in enumerate(parts) if p.startswith("cp3")), None)
            path = fake.joinpath(*parts[tag + 1:]) if tag is not None else None
            asked.append(self.path)
            if path is None or not path.is_file():
                self.send_error(404)
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self) -> tuple[Any, Any]:
            sock, addr = self.socket.accept()
            sock.settimeout(30)
            if sock.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS ClientHello
                sock = tls.wrap_socket(sock, server_side=True)
            return sock, addr

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # the node hung up on it

    server = Server((host, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -------------------------------------------------------------------- the cluster ---------
@pytest.fixture(scope="module")
def control(hostile_emulator, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The control node's side, as the cluster makes it: the cluster CA, the publisher (the
    nodes' tarballs, the inbox where their start scripts say why they failed), the
    wheelhouse root for the box's nodes (built ahead, as a cluster does) and the lines that
    build a node's environment from it."""
    work = tmp_path_factory.mktemp("software")
    here = hostile_emulator.control_address
    ca = ClusterCA.open(work / "pki")
    publisher = TarballPublisher(here).start()
    reports: list[dict] = []
    report_url = publisher.accept_reports("report", lambda data, peer: reports.append(data))
    root, url = serve_for_image(publisher, image_urn=None, cm_local=True, ca=ca)
    house = root.wheelhouse(this_python(), this_platform(), timeout=300)
    www = work / "www"
    www.mkdir()
    try:
        yield {"ca": ca, "publisher": publisher, "reports": reports, "report_url": report_url,
               "url": url, "house": house.directory, "www": www, "work": work,
               "emulator": hostile_emulator}
    finally:
        root.close()
        publisher.stop()


def start_script(control: dict[str, Any], url: str) -> str:
    """The node's start: the pilots' own head (its failure to the control node's inbox),
    the lines that build its environment from ``url``, then the probe."""
    return (script_head("the node's software", INSTALL, control["report_url"])
            + env_script(url, python="python3", ca=control["ca"].cert_pem)
            + PROBE)


def boot(control: dict[str, Any], name: str, script: str) -> tuple[int, str]:
    """A node of the box that runs ``script`` as its start (from a tarball the publisher
    serves, at ``/``): its exit status and its runlog."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, data, mode in ((INSTALL[1:], None, 0o755),
                                 (f"{INSTALL[1:]}/start.sh", script.encode(), 0o755)):
            info = tarfile.TarInfo(path)
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path = control["www"] / f"{name}.tar.gz"
    path.write_bytes(buf.getvalue())
    tarball = control["publisher"].publish(path, f"{name}.tar.gz")
    s = Session(control["emulator"])
    urn, cred, _ = s.create(f"sw-{name}", rspec=build_request([NodeSpec("base")]))
    try:
        node = add_node(s, urn, cred, name, f"sh {INSTALL}/start.sh", tarballs=[tarball])
        detail = exited(s, urn, cred, name, timeout=180)
        return int(detail["execute_status"]), runlog(node)
    finally:  # the box's nodes for the other tests
        args = {"slice_urn": urn, "credentials": [cred]}
        wait_for(lambda: s.cm.DeleteSlice(args)["code"] == 0, timeout=60,
                 what=f"the slice of {name} deleted")


def attacked(control: dict[str, Any], name: str, swap: Any) -> tuple[int, list[str]]:
    """The node booted with the cluster's lines, through an attacker serving ``swap``'s
    wheelhouse: its exit status and what its start said (runstartup's last line aside)."""
    fake = control["work"] / name
    shutil.copytree(control["house"], fake)
    swap(control["house"], fake)
    parts = urllib.parse.urlsplit(control["url"])
    with on_path(parts.hostname, fake, worker_context(control["ca"], fake)) as there:
        status, log = boot(control, name, start_script(
            control, urllib.parse.urlunsplit(parts._replace(netloc=there))))
    return status, log.splitlines()[:-1]


def assert_refused(control: dict[str, Any], name: str, status: int, lines: list[str]) -> None:
    """One line naming what failed verification; nothing of the attacker's ran or is
    installed; the control node was told that line, as of any node whose start failed."""
    assert status == 1, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("pilot environment: wheels.txt from the wheelhouse at "
                               "https://"), lines
    assert "failed verification: its certificate is not the control node's" in lines[0]
    assert not any("probe" in line or "attacker" in line for line in lines)
    wait_for(lambda: any(r.get("client_id") == name for r in control["reports"]),
             timeout=60, what=f"{name}'s report")
    said = [r["line"] for r in control["reports"] if r.get("client_id") == name]
    assert said == [lines[0]]


# ------------------------------------------------------------------------ the tests -------
def test_a_node_builds_its_environment_from_the_control_nodes_wheelhouse(control) -> None:
    status, log = boot(control, "straight", start_script(control, control["url"]))
    lines = log.splitlines()[:-1]
    assert status == 0, log
    assert lines[-2].startswith(f"pilot environment: built in {INSTALL}/env in "), log
    assert lines[-1] == "probe False"


def test_a_swapped_wheel_fails_the_nodes_start_in_one_line(control) -> None:
    status, lines = attacked(control, "wheel", swapped_wheel)
    assert_refused(control, "wheel", status, lines)


def test_a_swapped_wheels_txt_fails_the_nodes_start_in_one_line(control) -> None:
    status, lines = attacked(control, "list", swapped_list)
    assert_refused(control, "list", status, lines)
