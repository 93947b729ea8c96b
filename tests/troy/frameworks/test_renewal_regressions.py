"""A node's renewed certificate goes into its worker's TLS listener, without failing the
connections that arrive meanwhile, and into the connections the worker makes.

Broke in a fresh-clone suite run (tests/hostile/test_enrolment.py: the test's own probe of
a node's listener got "sslv3 alert handshake failure"): ``load_cert_chain`` sets the
certificate, then lets other threads run while it reads the key; a connection the listener
accepted in between got the new certificate with the old key, and its handshake failed
(about one in ten while renewing in a loop). Every renewal of a node did that to whoever
connected at that moment: the scheduler, other workers fetching data. And the worker's own
new connections (to another worker for data, to its scheduler again) still presented its
first certificate, refused once that one expired (``cert_lifetime``, an hour by default)."""
from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from tests.troy.frameworks.nodes import member
from troy.frameworks.dask.enrol import reload_worker_tls

pytestmark = pytest.mark.slow


async def _scheduler_and_worker(control, node):  # noqa: ANN001, ANN202
    """A Dask scheduler (``control``'s TLS) and one worker (``node``'s), on 127.0.0.1, their
    HTTP servers too."""
    from distributed import Scheduler, Worker
    s = await Scheduler(host="127.0.0.1", port=0, dashboard=False,
                        dashboard_address="127.0.0.1:0", security=control.security())
    w = await Worker(s.address, host="127.0.0.1", nthreads=1, dashboard=False,
                     dashboard_address="127.0.0.1:0", security=node.security())
    return s, w


async def _handshakes_while_renewing(tmp_path: Path, cluster_ca) -> tuple[int, list[str]]:  # noqa: ANN001
    node = member(tmp_path / "node", cluster_ca, "node-1")
    pairs = [(Path(m.cert_file).read_bytes(), Path(m.key_file).read_bytes())
             for m in (member(tmp_path / "renewed", cluster_ca, "node-1"), node)]
    control = member(tmp_path / "control", cluster_ca, "control")
    s, w = await _scheduler_and_worker(control, node)
    host, port = w.address.removeprefix("tls://").rsplit(":", 1)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.load_verify_locations(control.ca_file)
    client.load_cert_chain(control.cert_file, control.key_file)
    stop, failed, done = threading.Event(), [], [0]

    def connect() -> None:   # as the scheduler or another worker would, over and over
        while not stop.is_set():
            try:
                with socket.create_connection((host, int(port)), timeout=30) as raw, \
                        client.wrap_socket(raw):
                    done[0] += 1
            except ssl.SSLError as err:   # a refused handshake (OSError: the machine's load)
                failed.append(repr(err))
            except OSError:
                pass

    def renew() -> None:     # as the node's Renewer does, in a thread of its own
        try:
            for i in range(80):
                cert, key = pairs[i % 2]
                Path(node.key_file).write_bytes(key)
                Path(node.cert_file).write_bytes(cert)
                reload_worker_tls(node.cert_file, node.key_file)
                time.sleep(0.005)
        finally:
            stop.set()

    threads = [threading.Thread(target=connect) for _ in range(2)]
    threads.append(threading.Thread(target=renew))
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):   # the worker's loop (this one) serves them
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await w.close()
        await s.close()
    return done[0], failed


def test_connections_during_renewals_all_complete_their_handshake(tmp_path, cluster_ca):  # noqa: ANN001
    done, failed = asyncio.run(_handshakes_while_renewing(tmp_path, cluster_ca))
    assert done > 20           # the listener was busy while it renewed
    assert failed == []


async def _connects_out_after_its_first_certificate_expired(tmp_path: Path,
                                                            cluster_ca) -> str:  # noqa: ANN001
    import datetime as dt

    from distributed.comm import connect

    from elasticslice.rpc.pki import issue_certificate
    from troy.frameworks.dask.tls import DaskTLS
    lifetime = 4.0
    cert, key = issue_certificate(*cluster_ca, "node-1", ips=["127.0.0.1"], role="worker",
                                  key_type="ec", lifetime=dt.timedelta(seconds=lifetime))
    home = tmp_path / "node"
    home.mkdir()
    (home / "ca.pem").write_bytes(cluster_ca[0])
    (home / "node.pem").write_bytes(cert)
    (home / "node.key").write_bytes(key)
    node = DaskTLS(str(home / "ca.pem"), str(home / "node.pem"), str(home / "node.key"))
    renewed = member(tmp_path / "renewed", cluster_ca, "node-1")
    control = member(tmp_path / "control", cluster_ca, "control")
    s, w = await _scheduler_and_worker(control, node)
    try:
        started = time.time()
        (home / "node.key").write_bytes(Path(renewed.key_file).read_bytes())
        (home / "node.pem").write_bytes(Path(renewed.cert_file).read_bytes())
        await asyncio.get_running_loop().run_in_executor(
            None, reload_worker_tls, node.cert_file, node.key_file)   # the Renewer's thread
        await asyncio.sleep(max(0.0, started + lifetime + 1.0 - time.time()))
        # a new connection of the worker's own, as to fetch data from another worker or
        # to rejoin its scheduler: with the first certificate it is refused, expired
        comm = await connect(s.address, **w.connection_args)
        await comm.close()
        return "connected"
    finally:
        await w.close()
        await s.close()


def test_a_worker_connects_out_with_its_renewed_certificate(tmp_path, cluster_ca):  # noqa: ANN001
    assert asyncio.run(_connects_out_after_its_first_certificate_expired(
        tmp_path, cluster_ca)) == "connected"
