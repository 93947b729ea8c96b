"""CurveZMQ keys for Parsl's interchange: each CloudLab node's own, authorised after it enrols.

Parsl's ``HighThroughputExecutor(encrypted=True)`` (its default) makes a folder of CurveZMQ
keys on this machine (``<run dir>/.../certificates``: the interchange's ``server`` pair and
the executor's ``client`` pair); the interchange accepts a connection only from a client
whose public key is a ``*.key`` file of that folder (``configure_curve(domain="*",
location=cert_dir)`` in ``parsl/curvezmq.py``). No secret of it leaves this machine:

1. a node enrols (its worker certificate: :mod:`elasticslice.pilots.enrol`), then makes its
   own key pair (``python -m elasticslice.parsl.keys node ...``: :func:`request_key`); its
   secret stays on the node (0600, in a 0700 folder);
2. it sends only its public key, over mutual TLS with its worker certificate, to the
   enrolment service's ``POST /key``; the control side (:class:`AuthorisedKeys`) writes it
   as ``cloudlab-<client_id>.key`` into the executor's folder and answers with the
   interchange's public key;
3. the node's worker pool runs with ``--cert_dir`` its own folder: its pair, and the
   interchange's public key (in ``server.key_secret`` too, whose secret-key line is zeros:
   Parsl's client reads the server's key from that file and uses only its public key).

When the node is given back, its key file goes (:meth:`AuthorisedKeys.withdraw`).

Parsl's interchange reads the folder once, when it starts; a node's key comes later. So the
executor's interchange runs through :func:`interchange_main` (``interchange_launch_cmd=
provider.interchange_launch_cmd``): Parsl's own interchange whose authenticator reads the
folder again whenever it changed, before it answers a handshake. A manager with any other
key (one a stranger made itself) fails the CurveZMQ handshake: it never reaches the
interchange's code, nor sends it a frame to unpickle.
"""
from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import os
import re
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "cloudlab-"  # a node's key file: never Parsl's own server.key or client.key
_Z85 = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NO_SECRET = "0" * 40  # the secret-key line of the node's copy of the server's key
TIMEOUT = 30.0


class KeyRefused(ValueError):
    """A key, or a request for one, that cannot be used (one line)."""


def check_key(public_key: Any) -> str:
    """``public_key`` when it is a CurveZMQ public key in Z85 (40 characters, 32 bytes)."""
    if not isinstance(public_key, str) or not _Z85.fullmatch(public_key):
        raise KeyRefused("expected a CurveZMQ public key (Z85, 40 characters)")
    return public_key


def key_file(public_key: str, secret_key: str | None = None) -> bytes:
    """A key file in the format of ``zmq.auth`` (public only, or with the secret)."""
    secret = f'    secret-key = "{secret_key}"\n' if secret_key is not None else ""
    kind = "Secret" if secret_key is not None else "Public"
    return (f"#   ZeroMQ CURVE {kind} Certificate (elasticslice)\n"
            f"metadata\ncurve\n    public-key = \"{public_key}\"\n{secret}").encode()


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` atomically (created ``mode``): a reader sees the old or the new."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _public(path: Path) -> str:
    """The public key in a ``zmq.auth`` key file."""
    for line in path.read_text().splitlines():
        name, _, value = line.strip().partition("=")
        if name.strip() == "public-key":
            return check_key(value.strip().strip("'\""))
    raise KeyRefused(f"{path}: no public key in it")


# ---------------------------------------------------------------------- the control side
class AuthorisedKeys:
    """The nodes' public keys in the executor's key folder ``cert_dir`` (Parsl's: it holds
    ``server.key``; the interchange allows the ``*.key`` files in it). One key per node:
    a new one replaces the node's last."""

    def __init__(self, cert_dir: Path) -> None:
        self.cert_dir = Path(cert_dir)
        self._lock = threading.Lock()

    def server_key(self) -> str:
        """The interchange's public key."""
        return _public(self.cert_dir / "server.key")

    def path(self, client_id: str) -> Path:
        if not _NAME.fullmatch(client_id):
            raise KeyRefused(f"not a node name: {client_id[:64]!r}")
        return self.cert_dir / f"{PREFIX}{client_id}.key"

    def authorise(self, client_id: str, public_key: Any) -> dict[str, str]:
        """Allow ``client_id``'s ``public_key`` at the interchange; the answer for the node:
        ``{"server_key": <the interchange's public key>}``."""
        key = check_key(public_key)
        with self._lock:
            _write(self.path(client_id), key_file(key), 0o644)
        log.info("node %s: its CurveZMQ key is allowed at the interchange", client_id)
        return {"server_key": self.server_key()}

    def withdraw(self, client_id: str) -> bool:
        """The node left: its key is no longer allowed (new connections); whether it had one."""
        try:
            path = self.path(client_id)
        except KeyRefused:
            return False
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        log.info("node %s: its CurveZMQ key is withdrawn", client_id)
        return True

    def allowed(self) -> list[str]:
        """The nodes whose keys are allowed."""
        return sorted(p.name[len(PREFIX):-4] for p in self.cert_dir.glob(f"{PREFIX}*.key"))


class FolderKeys:
    """A ``zmq.auth`` credentials provider: the public keys of the ``*.key`` files of
    ``folder``, read again whenever its files changed (a name or an inode: keys are
    replaced by rename), which costs one listing per handshake."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = os.fspath(folder)
        self._seen: tuple[tuple[str, int], ...] | None = None
        self._keys: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys()

    def keys(self) -> set[bytes]:
        try:
            with os.scandir(self.folder) as entries:
                seen = tuple(sorted((e.name, e.inode()) for e in entries
                                    if e.name.endswith(".key")))
        except OSError:
            return set()
        if seen != self._seen:
            import zmq.auth
            keys = set()
            for name, _ in seen:
                try:
                    keys.add(zmq.auth.load_certificate(os.path.join(self.folder, name))[0])
                except (OSError, ValueError):
                    continue  # gone meanwhile, or not a key: not allowed
            self._keys, self._seen = keys, seen
        return self._keys


class ClearInterchange(Exception):
    """An unencrypted interchange would listen beyond loopback: one line."""


def check_interchange(config: dict[str, Any]) -> None:
    """Refuse (:class:`ClearInterchange`) an interchange configuration that would serve in
    the clear where others reach it: no key folder and an address that is not loopback
    (None: Parsl binds every interface)."""
    if config.get("cert_dir") is not None:
        return
    address = config.get("interchange_address")
    if address is None or not is_loopback(str(address)):
        where = address if address is not None else "every interface"
        raise ClearInterchange(
            f"refusing to serve Parsl's interchange unencrypted on {where}: anyone who "
            f"reaches it could take the tasks and send it pickles; keep Parsl's default "
            f"encrypted=True (unencrypted is for loopback only)")


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP, or ``localhost``) is this machine's loopback only."""
    host = address.strip("[]")
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def interchange_main() -> None:
    """Parsl's interchange (its ``__main__``), its CurveZMQ authenticator reading the key
    folder again whenever it changed (:class:`FolderKeys`) instead of once; an unencrypted
    one beyond loopback is refused before it binds (:func:`check_interchange`)."""
    import io
    import pickle  # the executor's own configuration, from the pipe it started us with
    import runpy

    from parsl import curvezmq
    from zmq.auth.thread import ThreadAuthenticator

    data = sys.stdin.buffer.read()
    check_interchange(pickle.loads(data))  # noqa: S301 - our parent's, over our stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(data))  # Parsl's __main__ reads it there

    def start_auth_thread(self: Any) -> ThreadAuthenticator:
        auth = ThreadAuthenticator(self._ctx)
        auth.start()
        auth.configure_curve_callback(domain="*", credentials_provider=FolderKeys(
            self.cert_dir))
        return auth

    curvezmq.ServerContext._start_auth_thread = start_auth_thread  # type: ignore[method-assign]
    runpy.run_module("parsl.executors.high_throughput.interchange", run_name="__main__",
                     alter_sys=True)


# ---------------------------------------------------------------------- the node's side
class KeyRequestError(Exception):
    """The node could not get its key authorised: one line."""


def post_key(url: str, client_id: str, public_key: str, ctx: ssl.SSLContext,
             wait: float = TIMEOUT * 10) -> str:
    """``POST url/key``; the interchange's public key from the answer. "Not yet" (503: the
    provider's manager is starting again) is tried again for up to ``wait`` seconds."""
    from troy.frameworks.dask import EnrolError, post_to_control
    deadline, pause = time.monotonic() + wait, 0.5
    while True:
        try:
            status, text = post_to_control(url, "/key", {"client_id": client_id,
                                                         "public_key": public_key}, ctx,
                                           1 << 16)
        except (OSError, http.client.HTTPException) as err:
            if isinstance(err, ConnectionRefusedError) and \
                    time.monotonic() + pause <= deadline:   # the service starting again
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
                continue
            raise KeyRequestError(f"cannot reach the enrolment service {url}: "
                                  f"{getattr(err, 'reason', None) or err}") from None
        except EnrolError as err:  # not https, or not the control's certificate
            raise KeyRequestError(str(err)) from None
        if status != 503 or time.monotonic() + pause > deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, 5.0)
    if status != 200:
        raise KeyRequestError(f"the node's key was refused ({status}): {text}")
    try:
        return check_key(json.loads(text)["server_key"])
    except (ValueError, KeyError, TypeError):
        raise KeyRequestError("the enrolment service answered without the interchange's "
                              "key") from None


def request_key(url: str, ca_file: str, cert_file: str, cert_key: str, client_id: str,
                out_dir: Path) -> Path:
    """Make this node's CurveZMQ pair in ``out_dir`` (0700; the secret 0600), have its
    public key authorised, and write the interchange's public key there: the folder the
    worker pool's ``--cert_dir`` names; that folder."""
    import zmq

    from troy.frameworks.dask import tls_context
    public, secret = (k.decode() for k in zmq.curve_keypair())
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(out_dir, 0o700)  # Parsl's client refuses a folder others can read
    _write(out_dir / "client.key_secret", key_file(public, secret), 0o600)
    _write(out_dir / "client.key", key_file(public), 0o600)
    server = post_key(url, client_id, public, tls_context(ca_file, cert_file, cert_key))
    _write(out_dir / "server.key", key_file(server), 0o600)
    _write(out_dir / "server.key_secret", key_file(server, NO_SECRET), 0o600)
    return out_dir


USAGE = ("usage: python -m elasticslice.parsl.keys node URL CA_FILE CERT_FILE KEY_FILE "
         "CLIENT_ID OUT_DIR | interchange")


def main(argv: list[str]) -> int:
    if argv[:1] == ["interchange"]:
        try:
            interchange_main()
        except ClearInterchange as err:
            print(f"elasticslice: {err}", file=sys.stderr)
            return 1
        return 0
    if len(argv) != 7 or argv[0] != "node":
        print(USAGE, file=sys.stderr)
        return 2
    url, ca_file, cert_file, cert_key, client_id, out_dir = argv[1:]
    try:
        request_key(url, ca_file, cert_file, cert_key, client_id, Path(out_dir))
    except (KeyRequestError, KeyRefused) as err:
        print(f"{client_id}: {err}", file=sys.stderr)
        return 1
    except (OSError, ssl.SSLError) as err:
        print(f"{client_id}: cannot get the node's key authorised: "
              f"{getattr(err, 'strerror', None) or err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
