"""The ``dask`` framework with mutual TLS: only holders of a certificate from the cluster CA
can join, as a worker or as a client; units run as before."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elasticslice.rpc.pki import make_ca
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.errors import BadParameter
from troy.frameworks.dask import DaskFramework
from tests.helpers import holds_for, process_alive, wait_for
from tests.troy.frameworks.nodes import member, node_agent, running_pilot, stop


def fw_has_no_workers(fw: DaskFramework) -> bool:
    return fw.workers_info() == {}


@pytest.fixture
def tls_framework(tmp_path, cluster_ca):  # noqa: ANN001, ANN201
    fw = DaskFramework("tls", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                       tls=member(tmp_path / "control", cluster_ca, "control"))
    fw.start()
    yield fw
    fw.close()


@pytest.mark.slow
def test_units_run_over_tls_and_nothing_listens_in_the_clear(tls_framework) -> None:
    fw = tls_framework
    assert fw.scheduler_address.startswith("tls://127.0.0.1:")
    p = running_pilot(fw, 2)
    assert p.native_id.startswith("tls://127.0.0.1:")
    u = fw.submit_unit(CUD(executable="/bin/sh", arguments=["-c", "exit 0"]))
    v = fw.submit_unit(CUD(function=pow, args=(2, 10)))
    assert u.wait(60) is State.DONE and u.result.exit_code == 0
    assert v.wait(60) is State.DONE and v.result.value == 1024


@pytest.mark.slow
def test_node_agent_with_a_cluster_certificate_becomes_a_pilot(tls_framework, tmp_path,
                                                               cluster_ca) -> None:
    fw = tls_framework
    agent = node_agent(fw.scheduler_address, 3, member(tmp_path / "n1", cluster_ca, "node-x"),
                       tmp_path / "agent.log")
    try:
        wait_for(lambda: any(p.size == 3 and p.state is State.RUNNING
                             for p in fw.list_pilots()), 60, what="the node's pilot")
        u = fw.submit_unit(CUD(executable="/bin/true", cores=3))  # only the node fits it
        assert u.wait(60) is State.DONE
        assert fw.get_pilot(u.pilot).size == 3
    finally:
        assert stop(agent) == 0


@pytest.mark.slow
def test_a_worker_with_a_stranger_certificate_is_refused(tls_framework, tmp_path,
                                                         cluster_ca) -> None:
    fw = tls_framework
    log = tmp_path / "intruder.log"
    agent = node_agent(fw.scheduler_address, 4,
                       member(tmp_path / "stranger", make_ca("stranger CA", key_type="ec"), "intruder"), log)
    try:
        wait_for(lambda: b"Waiting to connect" in log.read_bytes(), 60,
                 what="the intruder trying to connect")
        def never_in() -> None:
            assert fw.workers_info() == {} and agent.poll() is None
            assert all(p.size != 4 for p in fw.list_pilots())
        holds_for(never_in, 5.0)  # about 5 s of retries
    finally:
        stop(agent)
    # the same agent with a cluster certificate joins (so the test above can fail)
    friend = node_agent(fw.scheduler_address, 4, member(tmp_path / "f", cluster_ca, "friend"),
                        tmp_path / "friend.log")
    try:
        wait_for(lambda: len(fw.workers_info()) == 1, 60, what="the member to join")
    finally:
        stop(friend)


@pytest.mark.slow
def test_a_worker_without_a_certificate_says_so_in_one_line(tls_framework, tmp_path) -> None:
    agent = node_agent(tls_framework.scheduler_address, 4, None, tmp_path / "none.log")
    assert agent.wait(60) != 0
    err = (tmp_path / "none.log").read_text()
    assert err.startswith("troy node agent: cannot join tls://") and "Traceback" not in err
    assert fw_has_no_workers(tls_framework)


@pytest.mark.slow
def test_a_client_with_a_stranger_certificate_is_refused(tls_framework, tmp_path) -> None:
    from distributed import Client
    stranger = member(tmp_path / "stranger", make_ca("stranger CA", key_type="ec"), "spy").security()
    with pytest.raises((OSError, TimeoutError)):
        Client(tls_framework.scheduler_address, timeout="3s", set_as_default=False,
               security=stranger)


@pytest.mark.slow
def test_a_connection_without_a_client_certificate_is_refused(tls_framework) -> None:
    """At the TLS layer: the scheduler requires a certificate before any Dask message."""
    import socket
    import ssl
    host, port = tls_framework.scheduler_address[len("tls://"):].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=tls_framework.tls.ca_file)
    ctx.check_hostname = False
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(b"x" * 16)
                tls.recv(1)   # TLS 1.3: the refusal arrives with the first read
    # and plain TCP gets no Dask answer either
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"\x00" * 64)
        raw.settimeout(10)
        try:
            data = raw.recv(64)
        except (ConnectionError, socket.timeout):
            data = b""
        assert data == b"" or data[:1] == b"\x15"   # closed, or a TLS alert


def test_tls_files_are_checked(tmp_path) -> None:
    with pytest.raises(BadParameter, match="tls ca_file: .*nosuch.pem: not a readable file"):
        DaskFramework("x", tls={"ca_file": str(tmp_path / "nosuch.pem"),
                                "cert_file": __file__, "key_file": __file__})
    with pytest.raises(BadParameter, match="expected ca_file, cert_file and key_file"):
        DaskFramework("x", tls={"ca_file": __file__})


@pytest.mark.slow
def test_node_agent_usage_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "troy.frameworks.dask", "node", "x", "zero"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and done.stderr.startswith("usage: python -m troy")
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_units_killed_by_their_nodes_shutdown_are_requeued_not_failed(
        tls_framework, tmp_path, cluster_ca) -> None:
    """A node going down sends SIGTERM to every process of it at once (the emulator's power
    cycle, a reboot): its units died of that, not of their own doing, so they run again
    on another pilot instead of ending FAILED with "killed by signal 15"."""
    import os
    import signal
    fw = tls_framework
    first = node_agent(fw.scheduler_address, 2, member(tmp_path / "a", cluster_ca, "node-a"),
                       tmp_path / "a.log", "node-a", own_group=True)
    second = None
    try:
        wait_for(lambda: (p := fw.find_pilot("node-a")) is not None
                 and p.state is State.RUNNING, 120, what="node-a's pilot")
        units = [fw.submit_unit(CUD(executable="/bin/sleep", arguments=["2"]))
                 for _ in range(2)]
        wait_for(lambda: all(u.state is State.RUNNING for u in units), 60,
                 what="the units running on node-a")
        # the node goes down: SIGTERM to every process of it, the units' first (as the
        # node's init may deliver it), the agent's right after
        children = {int(c) for t in Path(f"/proc/{first.pid}/task").iterdir()
                    for c in (t / "children").read_text().split()}
        assert children, "the units' processes"
        for pid in children:
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not any(process_alive(pid) for pid in children), 30,
                 what="the units to end")
        os.killpg(first.pid, signal.SIGTERM)
        second = node_agent(fw.scheduler_address, 2,
                            member(tmp_path / "b", cluster_ca, "node-b"), tmp_path / "b.log",
                            "node-b")
        assert [u.wait(120) for u in units] == [State.DONE, State.DONE], \
            [u.result for u in units]
        assert {fw.get_pilot(u.pilot).worker_name for u in units} == {"node-b"}
        assert fw.unit_stats().lost == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                stop(proc)
