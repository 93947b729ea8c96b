"""The ``dask`` framework's scheduler in a process of its own (``scheduler_process=True``):
SIGKILLed, it comes back on the same address and no unit is lost; it serves a certificate
renewed on disk to new connections; a port it cannot take is said in one line."""
from __future__ import annotations

import os
import signal
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from elasticslice.rpc.pki import issue_certificate
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.errors import NoSuccess
from troy.frameworks.dask import DaskFramework
from troy.frameworks.dask.schedproc import CertWatch, close_replaced_client
from troy.frameworks.dask.tls import DaskTLS
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import member, nodes, running_pilot


def serial_of(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def served_serial(address: str, tls: DaskTLS) -> int:
    """The serial of the certificate a new TLS connection to ``address`` is served."""
    host, port = address[len("tls://"):].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=tls.ca_file)
    ctx.check_hostname = False
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with ctx.wrap_socket(raw) as conn:
            return x509.load_der_x509_certificate(conn.getpeercert(binary_form=True)) \
                .serial_number


def renew(tls: DaskTLS, ca: tuple[bytes, bytes], name: str, key_first: bool = False) -> int:
    """A new certificate and key of ``name`` from ``ca`` written over ``tls``'s files as an
    issuer does (each with ``os.replace``); returns its serial."""
    cert, key = issue_certificate(*ca, name, hostnames=["localhost"], ips=["127.0.0.1"],
                                  role="control", key_type="ec")
    files = [(tls.cert_file, cert), (tls.key_file, key)]
    for path, data in reversed(files) if key_first else files:
        Path(f"{path}.new").write_bytes(data)
        os.replace(f"{path}.new", path)
    return serial_of(cert)


@pytest.fixture
def proc_framework(tmp_path, cluster_ca):  # noqa: ANN001, ANN201
    fw = DaskFramework("proc", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                       scheduler_process=True,
                       tls=member(tmp_path / "control", cluster_ca, "control"))
    fw.start()
    yield fw
    fw.close()


@pytest.mark.slow
def test_a_sigkilled_scheduler_process_comes_back_on_its_port_and_no_unit_is_lost(
        proc_framework, tmp_path, cluster_ca) -> None:
    fw = proc_framework
    address, first_pid = fw.scheduler_address, fw.scheduler_pid
    assert first_pid is not None and first_pid != os.getpid()
    ours = running_pilot(fw, 1)
    with nodes(fw, cluster_ca, tmp_path / "nodes", ["node-s"], cores=1):
        node_pilot = fw.find_pilot("node-s")
        units = [fw.submit_unit(CUD(executable="/bin/sh", arguments=["-c", "sleep 2"]))
                 for _ in range(6)]
        wait_for(lambda: sum(u.state is State.RUNNING for u in units) == 2, 60,
                 what="a unit running on each pilot")
        running = [u for u in units if u.state is State.RUNNING]

        os.kill(first_pid, signal.SIGKILL)

        assert [u.wait(180) for u in units] == [State.DONE] * 6
        assert fw.scheduler_address == address      # the same port: the agents rejoined it
        assert fw.scheduler_pid not in (None, first_pid)
        assert all(u.attempts >= 1 for u in running)   # killed with the scheduler: ran again
        stats = fw.unit_stats()
        assert stats.lost == 0 and stats.requeued >= len(running)
        # our pilot has a new worker; the node's agent rejoined and is a pilot again
        assert ours.state is State.RUNNING and ours.native_id is not None
        again = fw.find_pilot("node-s")
        assert node_pilot.state is State.FAILED
        assert again is not node_pilot and again.state is State.RUNNING
        # and the framework goes on
        after = fw.submit_unit(CUD(executable="/bin/true"))
        assert after.wait(60) is State.DONE


@pytest.mark.slow
def test_the_scheduler_process_serves_its_renewed_certificate_to_new_connections(
        proc_framework, cluster_ca) -> None:
    fw = proc_framework
    first = served_serial(fw.scheduler_address, fw.tls)
    assert first == serial_of(Path(fw.tls.cert_file).read_bytes())
    new = renew(fw.tls, cluster_ca, "control")
    assert new != first
    wait_for(lambda: served_serial(fw.scheduler_address, fw.tls) == new, 60,
             what="the scheduler to serve its new certificate")
    # members still join and run units with it
    running_pilot(fw, 1)
    u = fw.submit_unit(CUD(executable="/bin/true"))
    assert u.wait(60) is State.DONE


def handshake_serial(server: ssl.SSLContext, ca_file: str) -> int:
    """The serial a new handshake with ``server`` is served (in memory, no socket)."""
    client = ssl.create_default_context(cafile=ca_file)
    client.check_hostname = False
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out)
    done = False
    for _ in range(10):
        for end in (cli, srv):
            try:
                end.do_handshake()
                done = done or end is cli
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done:
            break
    return x509.load_der_x509_certificate(cli.getpeercert(binary_form=True)).serial_number


def test_a_half_replaced_certificate_pair_is_not_loaded_the_whole_pair_is(
        tmp_path, cluster_ca) -> None:
    tls = member(tmp_path / "m", cluster_ca, "control")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    watch = CertWatch(tls.cert_file, tls.key_file, lambda: [ctx])
    first = handshake_serial(ctx, tls.ca_file)
    assert not watch.check()                      # nothing changed

    cert, key = issue_certificate(*cluster_ca, "control", ips=["127.0.0.1"], key_type="ec")
    Path(f"{tls.cert_file}.new").write_bytes(cert)
    os.replace(f"{tls.cert_file}.new", tls.cert_file)   # the key not yet
    assert not watch.check() and not watch.check()
    assert handshake_serial(ctx, tls.ca_file) == first  # the old pair serves meanwhile

    Path(f"{tls.key_file}.new").write_bytes(key)
    os.replace(f"{tls.key_file}.new", tls.key_file)
    assert watch.check()
    assert handshake_serial(ctx, tls.ca_file) == serial_of(cert) != first
    assert not watch.check()


@pytest.mark.slow
def test_a_scheduler_process_whose_port_is_taken_says_so_in_one_line(tmp_path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        fw = DaskFramework("taken", sandbox=str(tmp_path / "sb"), scheduler_process=True,
                           port=port, connect_timeout=5)
        with pytest.raises(NoSuccess) as err:
            fw.start()
    finally:
        taken.close()
    assert f"troy scheduler: cannot listen on 127.0.0.1:{port}: " in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_scheduler_killed_again_while_it_comes_back_loses_no_unit(tmp_path) -> None:
    """Killed again as soon as it is back (its framework may still be reconnecting): one
    recovery after the other, and every unit still ends DONE."""
    fw = DaskFramework("twice", sandbox=str(tmp_path / "sb"), scheduler_process=True)
    fw.start()
    try:
        address = fw.scheduler_address
        running_pilot(fw, 2)
        units = [fw.submit_unit(CUD(executable="/bin/sh", arguments=["-c", "sleep 1"]))
                 for _ in range(6)]
        wait_for(lambda: any(u.state is State.RUNNING for u in units), 60, what="a unit")
        killed = [fw.scheduler_pid]
        os.kill(killed[0], signal.SIGKILL)
        wait_for(lambda: fw.scheduler_pid not in killed, 60, what="a new scheduler")
        killed.append(fw.scheduler_pid)
        os.kill(killed[1], signal.SIGKILL)   # while its framework reconnects to it
        units += [fw.submit_unit(CUD(function=pow, args=(2, 5))) for _ in range(3)]
        assert [u.wait(180) for u in units] == [State.DONE] * 9
        assert fw.unit_stats().lost == 0
        assert fw.scheduler_address == address and fw.scheduler_pid not in killed
    finally:
        fw.close()


def test_a_replaced_client_whose_close_fails_prints_no_traceback(caplog, monkeypatch) -> None:
    """test_split, under load: the old client, replaced after the scheduler came back, was
    closed on a thread of its own while Dask still reconnected it; its close raised and the
    thread printed a traceback into the run's output."""
    class Reconnecting:
        def close(self, timeout: float) -> None:
            raise ValueError("IOStream is not idle; cannot convert to SSL")

    escaped: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    caplog.set_level("INFO", logger="troy.frameworks.dask.schedproc")
    thread = threading.Thread(target=close_replaced_client, args=(Reconnecting(),))
    thread.start()
    thread.join(10)
    assert escaped == []
    assert "closing a replaced Dask client: ValueError: IOStream is not idle" in caplog.text
