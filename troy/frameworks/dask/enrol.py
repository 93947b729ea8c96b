"""A node's side of enrolment (standard library and ``cryptography`` only: it runs on the
node with the agent's Python).

    python -m troy.frameworks.dask.enrol URL TOKEN_FILE CA_FILE CLIENT_ID OUT_DIR

makes the node's key here, sends a certificate request (CN = CLIENT_ID) with the token in
TOKEN_FILE to ``URL/enrol`` over TLS that trusts only CA_FILE (the cluster CA pinned: the
server must show a certificate of that CA with OU ``control``), writes ``OUT_DIR/node.key``
(0600) and ``OUT_DIR/node.pem``, deletes TOKEN_FILE (a token is good for one presentation)
and exits 0; on failure one line on stderr, exit 1.

    python -m troy.frameworks.dask.enrol --advertise CLIENT_ID < manifest.xml

    python -m troy.frameworks.dask.enrol --valid CERT_FILE

exits 0 when the certificate in CERT_FILE is valid for at least :data:`VALID_MARGIN` more
seconds (a rebooted node starts its agent with it, which renews it), else 1 with one line
saying when it expired: a node down longer than its certificate's life cannot renew it.

prints the address this node's agent should advertise: its own host or interface address in
the sliver's manifest (``geni-get manifest``) when that address is configured on this node;
nothing when none is (the agent then uses the address it reaches the scheduler from).

:func:`renew` gets a new certificate for a new key over mutual TLS with the current one;
:class:`Renewer` (started by the node agent when ``TROY_NODE_RENEW_URL`` is set) does it
before the certificate expires, replacing the files atomically.
"""
from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import os
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RENEW_URL_ENV = "TROY_NODE_RENEW_URL"
TIMEOUT = 30.0            # seconds for one request
RETRY_FOR = 120.0         # seconds a node retries an enrolment it could not send
RENEW_AT = 2 / 3          # renew once this share of the certificate's life has passed
RENEW_RETRY = (5.0, 60.0)  # first and longest pause between two failed renewals


class EnrolError(Exception):
    """Enrolment failed: one line."""


# ---------------------------------------------------------------------- keys and requests
def new_key_and_csr(client_id: str) -> tuple[bytes, bytes]:
    """A new private key (PEM, unencrypted) and a certificate request for it, CN client_id."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, client_id)]))
           .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def tls_context(ca_file: str, cert_file: str | None = None,
                key_file: str | None = None) -> ssl.SSLContext:
    """TLS that trusts only the cluster CA (no host name check: the CA is pinned)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=ca_file)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def post_to_control(url: str, path: str, body: dict[str, str], ctx: ssl.SSLContext,
                    limit: int = 1 << 20) -> tuple[int, str]:
    """POST ``body`` (JSON) to ``url`` + ``path`` at the control node's enrolment service:
    (HTTP status, the answer's text, or its first line when not 200). The server's role is
    checked before anything is sent: a node's own certificate (OU worker, of the same CA: a
    hostile node's) would otherwise be handed what the body carries (:class:`EnrolError`)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise EnrolError(f"enrolment URL {url!r}: expected https://HOST:PORT")
    conn = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=TIMEOUT,
                                       context=ctx)
    try:
        conn.connect()
        sock = conn.sock
        peer = sock.getpeercert() if isinstance(sock, ssl.SSLSocket) else None
        units = {k: v for rdn in (peer or {}).get("subject", ()) for k, v in rdn}
        if units.get("organizationalUnitName") != "control":
            raise EnrolError(f"{parts.hostname}:{parts.port}: not the cluster's enrolment "
                             f"service (its certificate is not a control member's)")
        data = json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read(limit).decode(errors="replace")
    finally:
        conn.close()
    if resp.status != 200:
        text = text.strip().splitlines()[0] if text.strip() else resp.reason
    return resp.status, text


def _post(url: str, path: str, body: dict[str, str], ctx: ssl.SSLContext) -> str:
    """POST ``body`` to ``url`` + ``path``; the certificate (PEM) it answers with."""
    status, text = post_to_control(url, path, body, ctx)
    if status != 200:
        line = text
        if status == 503:   # e.g. the manager has not read the node's manifest yet
            raise _NotYet(f"enrolment refused ({status}): {line}")
        raise _Refusal(f"enrolment refused ({status}): {line}")
    try:
        cert = json.loads(text)["certificate"]
    except (ValueError, KeyError, TypeError):
        raise EnrolError("the enrolment service answered without a certificate") from None
    if "BEGIN CERTIFICATE" not in str(cert):
        raise EnrolError("the enrolment service answered without a certificate")
    return str(cert)


class _Refusal(EnrolError):
    """The service answered no: no use trying again."""


class _NotYet(EnrolError):
    """The service answered "not yet" (503): the token is unspent, try again."""


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` atomically with ``data`` (created ``mode``, never wider)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _install(out_dir: Path, key_pem: bytes, cert_pem: str) -> None:
    """The node's key and certificate in place (key first: a reader between the two sees
    the old certificate for at most an instant; Dask reads both per new connection)."""
    _write(out_dir / "node.key", key_pem, 0o600)
    _write(out_dir / "node.pem", cert_pem.encode(), 0o644)


# ---------------------------------------------------------------------- enrolment
def enrol(url: str, token_file: Path, ca_file: Path, client_id: str, out_dir: Path,
          retry_for: float = RETRY_FOR) -> Path:
    """Enrol this node (see the module docstring); the certificate's path."""
    try:
        token = token_file.read_text().strip()
    except OSError as err:
        raise EnrolError(f"cannot read the enrolment token {token_file}: "
                         f"{err.strerror or err}") from None
    if not ca_file.is_file():
        raise EnrolError(f"no cluster CA certificate at {ca_file}")
    key_pem, csr = new_key_and_csr(client_id)
    ctx = tls_context(os.fspath(ca_file))
    deadline = time.monotonic() + retry_for
    pause = 1.0
    while True:
        try:
            cert = _post(url, "/enrol", {"token": token, "client_id": client_id,
                                         "csr": csr.decode()}, ctx)
            break
        except _Refusal:
            token_file.unlink(missing_ok=True)  # spent whatever the answer
            raise
        except _NotYet:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 10.0)
            continue
        except EnrolError:
            raise
        except ssl.SSLCertVerificationError as err:  # not our cluster's service: no retry
            raise EnrolError(f"{url}: the server's certificate is not of the cluster CA "
                             f"({err.verify_message or err})") from None
        except (OSError, http.client.HTTPException) as err:  # not reachable yet: again
            if time.monotonic() + pause > deadline:
                raise EnrolError(f"cannot reach the enrolment service {url}: "
                                 f"{getattr(err, 'reason', None) or err}") from None
            time.sleep(pause)
            pause = min(pause * 2, 10.0)
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _install(out_dir, key_pem, cert)
    token_file.unlink(missing_ok=True)
    return out_dir / "node.pem"


def renew(url: str, ca_file: str, cert_file: str, key_file: str) -> float:
    """A new key and certificate for this node in place of ``cert_file``/``key_file``,
    authenticated by the current ones; the new certificate's expiry (epoch seconds)."""
    client_id = cert_info(cert_file)[0]
    key_pem, csr = new_key_and_csr(client_id)
    cert = _post(url, "/renew", {"csr": csr.decode()}, tls_context(ca_file, cert_file, key_file))
    out = Path(cert_file)
    if Path(key_file).parent != out.parent or Path(key_file).name != "node.key" \
            or out.name != "node.pem":
        _write(Path(key_file), key_pem, 0o600)
        _write(out, cert.encode(), 0o644)
    else:
        _install(out.parent, key_pem, cert)
    return cert_info(cert_file)[2]


def cert_info(cert_file: str) -> tuple[str, float, float]:
    """(CN, not before, not after) of a PEM certificate, times in epoch seconds."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return (str(names[0].value) if names else "", _when(cert, "not_valid_before"),
            _when(cert, "not_valid_after"))


def _when(cert: object, name: str) -> float:
    """A validity bound in epoch seconds (``cryptography`` before 42 has only naive UTC)."""
    aware = getattr(cert, f"{name}_utc", None)
    if aware is None:
        aware = getattr(cert, name).replace(tzinfo=dt.timezone.utc)
    return float(aware.timestamp())


RELOAD_TIMEOUT = 30.0  # seconds a reload waits for the worker's event loop


def reload_worker_tls(cert_file: str, key_file: str) -> int:
    """Load the renewed certificate into the TLS contexts of this process' Dask workers: their
    listeners' and the one they connect out with (each reads its files once, when the worker
    starts: a worker went on presenting its first certificate to the peers it connected to,
    refused once that one expired); how many contexts.

    The load runs on the worker's event loop, where its listener accepts connections and its
    connections are made: ``load_cert_chain`` sets the certificate, then lets other threads
    run while it reads the key, and a connection accepted in between got the new certificate
    with the old key (its handshake failed: about one in ten while renewing in a loop,
    measured)."""
    count = 0
    try:
        from distributed import Worker
    except ImportError:
        return 0
    for worker in list(getattr(Worker, "_instances", ())):
        contexts = [ctx for listener in getattr(worker, "listeners", ())
                    if isinstance(ctx := getattr(listener, "server_args", {}).get("ssl_options"),
                                  ssl.SSLContext)]
        out = (getattr(worker, "connection_args", None) or {}).get("ssl_context")
        if isinstance(out, ssl.SSLContext) and all(out is not c for c in contexts):
            contexts.append(out)
        if contexts:
            _on_loop(worker.loop, lambda: [c.load_cert_chain(cert_file, key_file)
                                           for c in contexts])
            count += len(contexts)
    return count


def _on_loop(loop: Any, fn: Any) -> None:
    """``fn()`` on the tornado ``loop`` (here and now when called on it, or when it does not
    run: a closed worker's accepts nothing); its exception raised here, or TimeoutError when
    the loop did not run it within :data:`RELOAD_TIMEOUT`."""
    aloop = getattr(loop, "asyncio_loop", None)
    if aloop is None or aloop is _running_loop() or aloop.is_closed() \
            or not aloop.is_running():
        fn()
        return
    done = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            failed.append(err)
        finally:
            done.set()

    loop.add_callback(run)
    if not done.wait(RELOAD_TIMEOUT):
        raise TimeoutError(f"the worker's event loop did not reload within {RELOAD_TIMEOUT:g} s")
    if failed:
        raise failed[0]


def _running_loop() -> Any:
    import asyncio
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Renewer:
    """Renews the node's certificate before it expires, in a daemon thread: once
    ``RENEW_AT`` of its life has passed, then again for each new one; failures are retried
    (one warning line each) until the certificate expires."""

    def __init__(self, url: str, ca_file: str, cert_file: str, key_file: str) -> None:
        self.url, self.ca_file, self.cert_file, self.key_file = url, ca_file, cert_file, \
            key_file
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="troy-node-renew", daemon=True)
        self.renewals = 0

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> Renewer | None:
        """The renewer the environment asks for (``TROY_NODE_RENEW_URL`` and Dask's TLS
        variables), None when it asks for none."""
        env = os.environ if environ is None else environ
        url = env.get(RENEW_URL_ENV, "").strip()
        if not url:
            return None
        prefix = "DASK_DISTRIBUTED__COMM__TLS__"
        ca, cert, key = (env.get(prefix + k, "") for k in ("CA_FILE", "WORKER__CERT",
                                                            "WORKER__KEY"))
        if not (ca and cert and key):
            raise ValueError(f"{RENEW_URL_ENV} is set but Dask's TLS files are not "
                             f"(DASK_DISTRIBUTED__COMM__TLS__CA_FILE, WORKER__CERT, WORKER__KEY)")
        return cls(url, ca, cert, key)

    def start(self) -> Renewer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        pause = RENEW_RETRY[0]
        while not self._stop.is_set():
            try:
                _, start, end = cert_info(self.cert_file)
                got = os.stat(self.cert_file).st_mtime  # certificates are back-dated
            except (OSError, ValueError) as err:
                log.warning("cannot read the node's certificate %s: %s", self.cert_file, err)
                return
            start = max(start, min(got, end))
            wait = start + (end - start) * RENEW_AT - time.time()
            if self._stop.wait(max(0.0, wait)):
                return
            try:
                renew(self.url, self.ca_file, self.cert_file, self.key_file)
                reload_worker_tls(self.cert_file, self.key_file)
                self.renewals += 1
                pause = RENEW_RETRY[0]
                log.info("renewed the node's certificate")
            except Exception as err:  # noqa: BLE001 - try again until it expires
                if time.time() >= end:
                    log.warning("the node's certificate expired and cannot be renewed: %s",
                                err)
                    return
                log.warning("cannot renew the node's certificate (again in %g s): %s",
                            pause, err)
                if self._stop.wait(pause):
                    return
                pause = min(pause * 2, RENEW_RETRY[1])


# ---------------------------------------------------------------------- addresses
def manifest_addresses(manifest: str, client_id: str) -> list[str]:
    """This node's addresses in a manifest RSpec: its host's ``ipv4``, then its interfaces'
    ``ip@address``, in order."""
    try:
        root = ET.fromstring(manifest)
    except ET.ParseError:
        return []
    out: list[str] = []
    for node in root.iter():
        if node.tag.rsplit("}", 1)[-1] != "node" or node.get("client_id") != client_id:
            continue
        for child in node.iter():
            tag = child.tag.rsplit("}", 1)[-1]
            if tag == "host" and child.get("ipv4"):
                out.append(str(child.get("ipv4")))
        for child in node.iter():
            if child.tag.rsplit("}", 1)[-1] == "ip" and child.get("address"):
                out.append(str(child.get("address")))
    return list(dict.fromkeys(out))


def configured_here(address: str) -> bool:
    """Whether ``address`` is one of this machine's (a socket can be bound to it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
    except (OSError, ValueError):
        return False
    return True


def advertised_address(manifest: str, client_id: str) -> str | None:
    """The first address of this node in the manifest that is configured here (None:
    none is; the agent then uses the address it reaches the scheduler from)."""
    return next((a for a in manifest_addresses(manifest, client_id) if configured_here(a)),
                None)


# ---------------------------------------------------------------------- command line
USAGE = ("usage: python -m troy.frameworks.dask.enrol URL TOKEN_FILE CA_FILE CLIENT_ID OUT_DIR\n"
         "       python -m troy.frameworks.dask.enrol --advertise CLIENT_ID < MANIFEST\n"
         "       python -m troy.frameworks.dask.enrol --valid CERT_FILE")
VALID_MARGIN = 60.0  # seconds a certificate must still be valid for the agent to use it


def still_valid(cert_file: Path, now: float | None = None) -> str | None:
    """None when the certificate is valid for :data:`VALID_MARGIN` more seconds, else why
    not (one line)."""
    try:
        ends = cert_info(str(cert_file))[2]
    except (OSError, ValueError) as err:
        return f"cannot read the node's certificate {cert_file}: {err}"
    left = ends - (time.time() if now is None else now)
    if left >= VALID_MARGIN:
        return None
    when = dt.datetime.fromtimestamp(ends, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    return (f"the node's certificate {'expired' if left <= 0 else 'expires'} at {when}: "
            f"it cannot be renewed (the node was down longer than its lifetime)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--advertise":
        found = advertised_address(sys.stdin.read(), args[1])
        if found:
            print(found)
        return 0
    if len(args) == 2 and args[0] == "--valid":
        why = still_valid(Path(args[1]))
        if why:
            print(why, file=sys.stderr)
        return 1 if why else 0
    if len(args) != 5:
        print(USAGE, file=sys.stderr)
        return 2
    url, token_file, ca_file, client_id, out_dir = args
    try:
        enrol(url, Path(token_file), Path(ca_file), client_id, Path(out_dir))
    except EnrolError as err:
        print(f"enrolment of {client_id} at {url} failed: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - one line, no traceback
        print(f"enrolment of {client_id} at {url} failed: {type(err).__name__}: {err}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
