"""Enrolment end to end, as an attacker who read the experiment's archive would try it: the
emulator's CM fetches every node's tarball over HTTP and keeps a copy (as CloudLab archives
it with the experiment); real nodes boot, enrol and join as pilots. The copies hold no key,
their tokens are spent once the nodes enrolled, a token presented from anywhere but its
node's own address is refused and costs the node nothing; the nodes renew their short-lived certificates (their Dask listeners
too); no key of any node is on the control node after a node goes and after ``close()``."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import socket
import ssl
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from cryptography import x509

from elasticslice.pilots import ElasticCluster
from tests.elasticslice.managers.helpers import FAST_INTERVALS, FAST_POLICY, client_for, \
    cm_nodes
from tests.helpers import untar, wait_for

CONTROL_KEYS = {"ca.key", "scheduler.key", "enrolment.key", "wheelhouse.key"}  # the control node's own


def stored_tarball(emulator, url: str) -> bytes:
    """The CM's kept copy of the tarball at ``url`` (``D/tarfiles/<sliver>/<md5>.tar.gz``)."""
    name = hashlib.md5(url.encode()).hexdigest() + ".tar.gz"
    found = list(Path(emulator.dir, "tarfiles").rglob(name))
    assert found, f"the CM kept no copy of {name}"
    return found[0].read_bytes()


def private_files(root: Path) -> list[str]:
    """Files under ``root`` holding a private key (names relative to ``root``)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and b"PRIVATE KEY" in p.read_bytes())


def served_expiry(address: str, tls) -> float:
    """When the certificate a Dask listener at ``tls://HOST:PORT`` serves now expires."""
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(tls.ca_file)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    with socket.create_connection((host, int(port)), timeout=30) as raw, \
            ctx.wrap_socket(raw) as sock:
        der = sock.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp()


def test_an_archived_tarball_is_useless_and_its_replay_costs_the_node_nothing(
        emulator, tmp_path: Path) -> None:
    server = client_for(emulator, tmp_path / "cache")
    cluster = ElasticCluster(server, tmp_path / "cluster", minthreshold=2, maxthreshold=3,
                             idle_timeout=None, intervals=FAST_INTERVALS, margin=1.0,
                             cert_lifetime=8.0, policy=dataclasses.replace(FAST_POLICY))
    archive: dict[str, bytes] = {}   # every version of the slice's tarball, as archived
    try:
        cluster.start()
        url = cluster.helper.tarball_url()
        write = cluster.helper.slice_tarball.write

        def archived() -> Path:   # what an attacker who read the experiment's archive has
            path = write()
            for cid in cluster.helper.slice_tarball.nodes():
                archive.setdefault(cid, path.read_bytes())
            return path
        cluster.helper.slice_tarball.write = archived  # type: ignore[method-assign]
        wait_for(lambda: len(cluster.pilots()) == 2, timeout=180, what="2 pilots")
        assert "node-2" in archive, sorted(archive)
        # the CM keeps one copy of the one URL, fetched again at each change: the CA's
        # certificate, the script and the tokens of nodes that were being added (spent now),
        # never a key
        with tarfile.open(fileobj=io.BytesIO(stored_tarball(emulator, url))) as tar:
            blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
            names = {m.name for m in tar.getmembers() if m.isfile()}
        assert b"PRIVATE KEY" not in blob  # nothing to steal in the archive
        assert names <= {"local/pilot/ca.pem", "local/pilot/start.sh",
                         *(f"local/pilot/nodes/node-{i}/token" for i in range(1, 9))}, names
        assert "node-1" not in cluster.helper.slice_tarball.nodes()  # spent: dropped
        assert private_files(cluster.state_dir) == ["pki/ca.key", "pki/members/enrolment.key",
                                                    "pki/members/scheduler.key",
                                                    "pki/members/wheelhouse.key"]

        # The nodes renew their certificates (8 s), their listeners serve the new ones.
        pilot = next(p for p in cluster.pilots() if p.worker_name == "node-1")
        tls = cluster.ca.dask_tls("scheduler")
        first = served_expiry(pilot.native_id, tls)
        wait_for(lambda: served_expiry(pilot.native_id, tls) > first, timeout=60,
                 what="node-1's listener serving a renewed certificate")
        assert cluster.enrolment.renewed >= 1

        # The archived copy with node-2's token, presented by whoever read it, from another
        # address than node-2's (the manifest's): refused, counted, and node-2 keeps its
        # place (a replay once cost the node: the cluster gave it back, again and again).
        with tarfile.open(fileobj=io.BytesIO(archive["node-2"])) as tar:
            untar(tar, tmp_path / "thief")
        stolen = tmp_path / "thief" / "local" / "pilot"
        result = subprocess.run(
            [sys.executable, "-m", "troy.frameworks.dask.enrol", cluster.enrolment.url,
             str(stolen / "nodes" / "node-2" / "token"), str(stolen / "ca.pem"), "node-2",
             str(stolen)],
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result
        assert "taken only from its node's own address" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not (stolen / "node.key").exists()
        assert cluster.enrolment.foreign == 1
        node2 = next(p for p in cluster.pilots() if p.worker_name == "node-2")
        cluster.manager.wake("update_sliver_status", "add_nodes")
        time.sleep(3)   # a few manager cycles: nothing is given back for it
        assert "node-2" in cm_nodes(emulator, tmp_path)
        assert node2 in cluster.pilots() and len(cluster.pilots()) == 2
        assert "node-2" not in cluster.helper.slice_tarball.nodes()  # no token of it
        keys = private_files(cluster.state_dir)
        assert {k.rsplit("/", 1)[-1] for k in keys} <= CONTROL_KEYS, keys
    finally:
        cluster.close()
        server.close()
    # After close(): no tarball, no token, no URL, no node key anywhere on the control node.
    assert not list((tmp_path / "cluster" / "tarballs").iterdir())
    with pytest.raises(Exception):
        import urllib.request
        urllib.request.urlopen(url, timeout=30)
    keys = private_files(tmp_path / "cluster")
    assert {k.rsplit("/", 1)[-1] for k in keys} <= CONTROL_KEYS, keys


@pytest.mark.slow
def test_a_hostile_node_posing_as_the_enrolment_service_gets_no_token(tmp_path: Path) -> None:
    """A node of the cluster holds a certificate of the cluster CA (OU ``worker``) and a
    key of its own; where it can make a booting node connect to it (a redirected address,
    a spoofed one on the LAN), it answers TLS with them. The booting node checks the
    server's role before it sends anything: no byte of its token reaches the impostor, and
    the token stays good for the real service."""
    import threading

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from elasticslice.pilots import ClusterCA
    ca = ClusterCA.open(tmp_path / "pki")
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "thief.pem").write_bytes(ca.certify("node-9", public))
    (tmp_path / "thief.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "thief.pem", tmp_path / "thief.key")
    heard = bytearray()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)

    def impostor() -> None:
        try:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(10)
                while chunk := tls.recv(65536):
                    heard.extend(chunk)
        except OSError:
            pass

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    token = "t0ken-" + "x" * 40
    (tmp_path / "token").write_text(token)
    done = subprocess.run(
        [sys.executable, "-m", "troy.frameworks.dask.enrol",
         f"https://127.0.0.1:{listener.getsockname()[1]}", str(tmp_path / "token"),
         str(ca.ca_file), "node-1", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120)
    thread.join(30)
    listener.close()
    assert done.returncode == 1, done
    assert "not the cluster's enrolment service" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert heard == b""                               # not the token, not the request
    assert (tmp_path / "token").read_text() == token   # still good for the real service
