"""Parsl's interchange, as a stranger who reaches the control node's address would try it.

The interchange listens where the nodes reach the control node (on CloudLab, its public
address). Encrypted (Parsl's default), it allows only the CurveZMQ keys of the nodes that
enrolled: a manager with a key it made itself fails the handshake, so it gets no task and
the interchange never unpickles what it sends (a registration with another Parsl version
would shut it down; a pickle would run code in it). A node's key is authorised only with its
own worker certificate (``POST /key``); ``encrypted=False`` is refused beyond loopback.
"""
from __future__ import annotations

import http.client
import json
import pickle
import shlex
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.elasticslice.parslbox import managers_of, parsl_on_box
from tests.helpers import wait_for


class Touch:
    """Unpickled, it creates ``path`` (stands for any code a pickle runs)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def own_keys(folder: Path, server_public: str) -> Path:
    """A stranger's key folder as Parsl's client reads it: a pair it made itself and the
    interchange's public key (public: assume the stranger has it)."""
    import zmq

    from elasticslice.parsl.keys import NO_SECRET, key_file
    public, secret = (k.decode() for k in zmq.curve_keypair())
    folder.mkdir(mode=0o700)
    (folder / "client.key_secret").write_bytes(key_file(public, secret))
    (folder / "client.key").write_bytes(key_file(public))
    (folder / "server.key").write_bytes(key_file(server_public))
    (folder / "server.key_secret").write_bytes(key_file(server_public, NO_SECRET))
    return folder


@pytest.mark.slow
def test_a_manager_with_a_key_it_made_itself_gets_nothing_and_the_work_completes(
        emulator_factory: Any, tmp_path: Path) -> None:
    """The strangers try the interchange while two tasks run and two wait; then (the
    scenario of tests/elasticslice/test_parsl_provider.py's test_the_tasks_of_a_node_taken_
    without_notice_are_retried_by_parsl, which booted a box and Parsl of its own) CloudLab
    takes the block's node without notice: Parsl runs its tasks again elsewhere, and the
    work completes on the provider's nodes alone."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    from parsl.jobs.states import JobState
    from elasticslice.parsl.keys import AuthorisedKeys
    from tests.elasticslice.managers.helpers import admin, reclaim_outcome
    emulator = emulator_factory(max_wait=0)  # CloudLab cannot wait: max_wait_time 0
    # a lost node's manager seen in seconds (Parsl's own threshold is 120 s)
    with parsl_on_box(emulator, tmp_path, heartbeat_period=1, heartbeat_threshold=4) as box:
        executor = box.executor
        squares = [box.square(i, box.gate.url) for i in range(4)]
        block = box.running_block()   # 2 tasks run on the block's node; 2 wait for a manager
        assert executor.encrypted and block.nodes[0] in box.provider.keys.allowed()
        server_public = AuthorisedKeys(Path(executor.cert_dir)).server_key()
        url = f"tcp://{executor.address}:{executor.worker_port}"

        # a raw ZeroMQ manager with its own key: a registration of another Parsl version
        # (which shuts an interchange down) and a pickle that makes a file when loaded
        marker = tmp_path / "unpickled-in-the-interchange"
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        public, secret = zmq.curve_keypair()
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.curve_serverkey = server_public.encode()
        sock.linger = 0
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                          | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sock.connect(url)
        sock.send(pickle.dumps({"type": "registration", "parsl_v": "0.0.0",
                                "python_v": "2.7.0", "block_id": "stranger",
                                "start_time": 0, "max_capacity": 8, "worker_count": 8}))
        sock.send(pickle.dumps(Touch(marker)))
        event = recv_monitor_message(monitor)
        assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH, event

        # Parsl's own worker pool, with a key it made itself, for the 2 waiting tasks
        words = shlex.split(executor.launch_cmd.format(block_id="stranger"))
        words[words.index("--cert_dir") + 1] = str(own_keys(tmp_path / "stranger",
                                                            server_public))
        logdir = next(i for i, w in enumerate(words) if w.startswith("--logdir="))
        words[logdir] = f"--logdir={tmp_path / 'stranger-log'}"
        pool = subprocess.Popen(
            [sys.executable, "-m", "parsl.executors.high_throughput.process_worker_pool",
             *words[1:], "--address_probe_timeout=3"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, err = pool.communicate(timeout=120)
        finally:
            if pool.poll() is None:
                pool.kill()
                pool.wait()
        assert pool.returncode != 0   # no interchange answered its key

        # the interchange is up, gave the strangers nothing, and the work completes
        assert executor.interchange_proc.poll() is None
        assert "stranger" not in executor.connected_blocks()
        assert managers_of(executor, "stranger") == []

        # the block's node taken without notice: the block ends as taken
        victim = block.nodes[0]
        node_id = box.node_id(victim)
        admin(emulator).call("Revoke", nodes=[node_id])
        wait_for(lambda: reclaim_outcome(emulator, node_id), timeout=120,
                 what="the reclamation to end")
        assert reclaim_outcome(emulator, node_id) == "forced"
        wait_for(lambda: box.provider.status([block.job_id])[0].state is JobState.TIMEOUT,
                 timeout=60, what="the block ended as taken")
        box.gate.open()
        # the interchange lost the node's manager; Parsl ran its tasks again elsewhere
        results = [f.result(timeout=240) for f in squares]
        assert [r[0] for r in results] == [i * i for i in range(4)]
        assert all(r[1] != victim for r in results), results
        assert {r[1] for r in results} <= {cid for b in box.provider.book.blocks.values()
                                            for cid in b.nodes}
        stats = box.provider.stats()
        assert (stats["revocations"], stats["early_releases"], stats["forced_releases"]) == \
            (1, 0, 1), stats
        assert not marker.exists()
        assert sock.poll(0) == 0   # not a frame came back
        monitor.close()
        sock.close()
        context.term()


# ---------------------------------------------------------------------- POST /key
def worker_certificate(ca: Any, client_id: str, folder: Path, role: str = "worker"
                       ) -> tuple[Path, Path]:
    """A certificate of ``ca`` for ``client_id`` (``role``) and its key, as files, made
    here (not by an enrolment service: it keeps no serial of it)."""
    from cryptography import x509

    from troy.frameworks.dask.enrol import new_key_and_csr
    key_pem, csr = new_key_and_csr(client_id)
    cert = ca.certify(client_id, x509.load_pem_x509_csr(csr).public_key().public_bytes(
        *_spki()), role=role, lifetime=600)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{client_id}.key").write_bytes(key_pem)
    (folder / f"{client_id}.pem").write_bytes(cert)
    return folder / f"{client_id}.pem", folder / f"{client_id}.key"


def enrolled(service: Any, client_id: str, folder: Path) -> tuple[Path, Path]:
    """``client_id`` enrolled at ``service`` as a node does: its certificate and key."""
    import time

    from troy.frameworks.dask.enrol import enrol
    folder.mkdir(parents=True)
    (folder / "token").write_text(service.token_for(client_id, time.time() + 600))
    enrol(service.url, folder / "token", service.ca.ca_file, client_id, folder)
    return folder / "node.pem", folder / "node.key"


def _spki() -> tuple[Any, Any]:
    from cryptography.hazmat.primitives import serialization
    return serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo


def post_key(url: str, ca_file: Path, body: dict[str, str],
             cert: tuple[Path, Path] | None = None) -> tuple[int, str]:
    """``POST /key`` as anyone may send it: (status, the answer's text)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(*map(str, cert))
    host, port = url.removeprefix("https://").rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), timeout=30, context=ctx)
    try:
        conn.request("POST", "/key", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_a_key_is_authorised_only_with_the_nodes_own_worker_certificate(
        tmp_path: Path) -> None:
    import zmq
    from parsl import curvezmq

    from elasticslice.parsl.keys import AuthorisedKeys, request_key
    from elasticslice.pilots.ca import ClusterCA
    from elasticslice.pilots.enrol import EnrolmentService
    from troy.frameworks.dask.denylist import DenyList
    ca = ClusterCA.open(tmp_path / "pki")
    keys = AuthorisedKeys(Path(curvezmq.create_certificates(tmp_path / "run")))
    held = {"parsl-1", "parsl-2"}
    service = EnrolmentService(ca, is_held=held.__contains__, on_key=keys.authorise,
                               deny=DenyList(tmp_path / "denied.json")).start()
    try:
        # the nodes enrol as they do (the service keeps their certificates' serials)
        node1 = enrolled(service, "parsl-1", tmp_path / "node1")
        node2 = enrolled(service, "parsl-2", tmp_path / "node2")
        key = zmq.curve_keypair()[0].decode()
        other = worker_certificate(ClusterCA.open(tmp_path / "other-pki"), "parsl-1",
                                   tmp_path / "other")
        control = worker_certificate(ca, "parsl-1", tmp_path / "control", role="control")
        refused = [
            # no certificate at all
            post_key(service.url, ca.ca_file, {"client_id": "parsl-1", "public_key": key}),
            # parsl-2's certificate, for parsl-1's key
            post_key(service.url, ca.ca_file, {"client_id": "parsl-1", "public_key": key},
                     node2),
            # a certificate of the cluster's CA that is not a worker's
            post_key(service.url, ca.ca_file, {"public_key": key}, control),
            # parsl-1's certificate, with something that is not a CurveZMQ public key
            post_key(service.url, ca.ca_file, {"public_key": "x" * 39 + '"'}, node1),
        ]
        assert [status for status, _ in refused] == [401, 403, 403, 400], refused
        assert all(text.count("\n") == 1 for _, text in refused), refused
        # a certificate of another CA (another cluster's node) does not even get TLS
        with pytest.raises((ssl.SSLError, ConnectionError)):
            post_key(service.url, ca.ca_file, {"public_key": key}, other)
        assert keys.allowed() == []
        # the node's own certificate: its key (made on the node) allowed, the
        # interchange's public key back; its secret never left the node's folder
        folder = request_key(service.url, str(ca.ca_file), *map(str, node1), "parsl-1",
                             tmp_path / "node1" / "curve")
        assert keys.allowed() == ["parsl-1"]
        assert (folder / "client.key_secret").stat().st_mode & 0o077 == 0
        assert keys.server_key() in (folder / "server.key").read_text()
        secret = [line for line in (folder / "client.key_secret").read_text().splitlines()
                  if "secret-key" in line][0].split('"')[1]
        assert not any(secret in p.read_text() for p in keys.cert_dir.iterdir())
        # the node given back: its certificate refused from then on, its key withdrawn
        service.forget("parsl-1")
        keys.withdraw("parsl-1")
        status, text = post_key(service.url, ca.ca_file, {"public_key": key}, node1)
        assert (status, text.count("\n")) == (403, 1) and "revoked" in text, text
        assert keys.allowed() == []
    finally:
        service.stop()


# ---------------------------------------------------------------------- encrypted=False
def test_an_unencrypted_interchange_beyond_loopback_is_refused_with_one_line(
        tmp_path: Path) -> None:
    from parsl.executors.high_throughput.executor import DEFAULT_LAUNCH_CMD

    from elasticslice.parsl import CloudLabProvider, ProviderError
    command = DEFAULT_LAUNCH_CMD.format(
        debug="", max_workers_per_node="", addresses="198.51.100.7", prefetch_capacity=0,
        cores_per_worker=1, mem_per_worker=None, poll_period=10, worker_port=54000,
        cert_dir=None, logdir="/tmp/x", logconf=None, heartbeat_period=30,
        address_probe_timeout_string="", heartbeat_threshold=120, drain_period=None,
        cpu_affinity="none", enable_mpi_mode="", mpi_launcher="mpiexec",
        accelerators="").format(block_id=0)
    provider = CloudLabProvider(server=object(), state_dir=tmp_path / "state",
                                listen="198.51.100.7")
    with pytest.raises(ProviderError) as err:
        provider.submit(command, 1, "parsl.cloudlab.block-0")
    line = str(err.value)
    assert "\n" not in line and "encrypted=False" in line and "198.51.100.7" in line
    assert provider.link is None and not (tmp_path / "state").exists()
    # the interchange the provider has Parsl start refuses it too, before it binds anything
    config = {"cert_dir": None, "interchange_address": None, "client_address": "127.0.0.1",
              "client_ports": (1, 2, 3)}
    for address in (None, "198.51.100.7"):
        done = subprocess.run(provider.interchange_launch_cmd,
                              input=pickle.dumps({**config, "interchange_address": address}),
                              capture_output=True, timeout=120)
        err = done.stderr.decode()
        assert done.returncode == 1 and err.count("\n") == 1, err
        assert "unencrypted on" in err and "encrypted=True" in err



def test_a_key_asked_while_the_daemon_s_manager_starts_is_not_yet_and_the_node_waits(
        tmp_path: Path) -> None:
    """A node enrolling while the provider's daemon starts again (its manager waits for the
    provider's blocks) is told "not yet" (503), not refused: its key request tries again and
    its start script goes on. Before, the one request failed and so did the node's block."""
    from parsl import curvezmq

    from elasticslice.parsl.keys import AuthorisedKeys, request_key
    from elasticslice.pilots.ca import ClusterCA
    from elasticslice.pilots.enrol import EnrolmentService, NotYet
    ca = ClusterCA.open(tmp_path / "pki")
    keys = AuthorisedKeys(Path(curvezmq.create_certificates(tmp_path / "run")))
    asked = []

    def on_key(client_id: str, public_key: str) -> dict[str, str]:
        asked.append(client_id)
        if len(asked) < 3:
            raise NotYet("the provider's manager is starting: try again")
        return keys.authorise(client_id, public_key)

    service = EnrolmentService(ca, is_held={"parsl-1"}.__contains__, on_key=on_key).start()
    try:
        node = enrolled(service, "parsl-1", tmp_path / "node")
        key = "x" * 40
        # "not yet" is said to the node's own certificate only: a stranger without one, or
        # a certificate of the CA that is not a worker's, is refused before it is asked
        control = worker_certificate(ca, "parsl-1", tmp_path / "control", role="control")
        refused = [post_key(service.url, ca.ca_file, {"client_id": "parsl-1",
                                                      "public_key": key}),
                   post_key(service.url, ca.ca_file, {"public_key": key}, control)]
        assert [status for status, _ in refused] == [401, 403] and asked == [], refused
        status, text = post_key(service.url, ca.ca_file, {"public_key": key}, node)
        assert (status, text.count("\n")) == (503, 1) and "try again" in text, text
        folder = request_key(service.url, str(ca.ca_file), *map(str, node), "parsl-1",
                             tmp_path / "node" / "curve")
        assert len(asked) == 3 and keys.allowed() == ["parsl-1"]
        assert keys.server_key() in (folder / "server.key").read_text()
    finally:
        service.stop()
