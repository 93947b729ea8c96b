"""Tokens and certificates bound to their node, tried as a thief would.

Every node of a slice can read the manifest, hence the tarball's URL, hence a booting node's
token. The enrolment service takes a token only from its node's own address (the manifest's):
from anywhere else it is refused, counted, and stays its node's. A certificate of a node
that left (given back, or one a thief got) is refused from then on, not at its expiry: by
the enrolment service (no renewal) and by the scheduler (its worker is dropped, and it cannot
join again)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from cryptography import x509

from troy.frameworks.dask import DaskFramework
from troy.frameworks.dask import enrol as node_enrol
from troy.frameworks.dask.denylist import DenyList
from troy.states import State
from tests.elasticslice.pilots.test_enrol import Cluster, refused
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import member, node_agent, stop


def test_a_token_from_another_nodes_address_is_refused_and_stays_its_nodes(
        tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        token = cluster.token_file("node-1")
        stolen = tmp_path / "stolen"
        stolen.write_text(token.read_text())
        cluster.addresses["node-1"] = "127.0.0.2"   # the manifest's: not where we are
        refused(cluster.enrol(stolen, "node-1", out="thief"),
                "this enrolment token is taken only from its node's own address, not from "
                "127.0.0.1")
        assert not (tmp_path / "thief" / "node.pem").exists()
        assert cluster.svc.foreign == 1 and cluster.svc.replays == 0
        # the node itself, from its own address, enrols with the very same token
        cluster.addresses["node-1"] = "127.0.0.1"
        assert cluster.enrol(token, "node-1").returncode == 0
        assert (tmp_path / "out" / "node.pem").exists()
    finally:
        cluster.svc.stop()


def test_a_node_whose_manifest_is_not_read_yet_is_asked_to_try_again(tmp_path: Path) -> None:
    """Its token is not spent: the node retries until its address is known."""
    cluster = Cluster(tmp_path)
    try:
        cluster.addresses["node-1"] = None
        token = cluster.token_file("node-1")
        with pytest.raises(node_enrol.EnrolError, match="not known yet: try again"):
            node_enrol.enrol(cluster.svc.url, token, cluster.ca.ca_file, "node-1",
                             tmp_path / "out", retry_for=0.5)
        assert token.exists()
        cluster.addresses["node-1"] = "127.0.0.1"
        node_enrol.enrol(cluster.svc.url, token, cluster.ca.ca_file, "node-1", tmp_path / "out")
        assert (tmp_path / "out" / "node.pem").exists()
    finally:
        cluster.svc.stop()


def test_a_spent_token_replayed_is_counted_and_costs_nothing(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        token = cluster.token_file("node-1")
        secret = token.read_text()
        assert cluster.enrol(token, "node-1").returncode == 0
        copy = tmp_path / "copy"
        for n in range(3):   # again and again (the command drops a refused token's file)
            copy.write_text(secret)
            refused(cluster.enrol(copy, "node-1", out=f"thief{n}"),
                    "enrolment token already used")
        assert cluster.svc.replays == 3
        assert "node-1" in cluster.held   # nothing asked to give it back
        out = tmp_path / "out"            # and the node's own certificate still renews
        node_enrol.renew(cluster.svc.url, str(cluster.ca.ca_file), str(out / "node.pem"),
                         str(out / "node.key"))
        assert cluster.svc.renewed == 1
    finally:
        cluster.svc.stop()


def test_a_certificate_of_a_node_that_left_is_refused_even_under_its_name_again(
        tmp_path: Path) -> None:
    """A thief kept node-1's certificate; node-1 is given back, and a new node-1 comes
    later (client_ids are reused): the old certificate renews nothing."""
    cluster = Cluster(tmp_path)
    try:
        assert cluster.enrol(cluster.token_file("node-1"), "node-1", out="thief").returncode == 0
        kept = tmp_path / "thief"
        cluster.svc.forget("node-1")                      # given back
        cluster.token_file("node-1", name="token-new")    # a new node-1 is being added
        with pytest.raises(node_enrol.EnrolError, match="this certificate was revoked"):
            node_enrol.renew(cluster.svc.url, str(cluster.ca.ca_file),
                             str(kept / "node.pem"), str(kept / "node.key"))
        serial = x509.load_pem_x509_certificate((kept / "node.pem").read_bytes()).serial_number
        assert cluster.deny.denied(serial)
        # the new node-1 enrols and renews as any node does
        assert cluster.enrol(tmp_path / "token-new", "node-1", out="new").returncode == 0
        node_enrol.renew(cluster.svc.url, str(cluster.ca.ca_file),
                         str(tmp_path / "new" / "node.pem"), str(tmp_path / "new" / "node.key"))
    finally:
        cluster.svc.stop()


@pytest.mark.slow
def test_the_scheduler_drops_and_refuses_a_denied_certificate(tmp_path: Path,
                                                               cluster_ca) -> None:  # noqa: ANN001
    deny = DenyList(tmp_path / "denied.json")
    tls = member(tmp_path / "control", cluster_ca, "control")
    fw = DaskFramework("deny", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                       tls={"ca_file": tls.ca_file, "cert_file": tls.cert_file,
                            "key_file": tls.key_file, "deny_file": str(deny.path)})
    fw.start()
    thief_tls = member(tmp_path / "node-1", cluster_ca, "node-1")
    agent = node_agent(fw.scheduler_address, 2, thief_tls, tmp_path / "node-1.log", "node-1")
    try:
        wait_for(lambda: (p := fw.find_pilot("node-1")) is not None
                 and p.state is State.RUNNING, 120, what="node-1 a pilot")
        cert = x509.load_pem_x509_certificate(Path(thief_tls.cert_file).read_bytes())
        deny.deny({cert.serial_number: cert.not_valid_after_utc.timestamp()})
        guard = fw.on_scheduler(lambda s: s._troy_guard)
        wait_for(lambda: not fw.on_scheduler(lambda s: list(s.workers)), 60,
                 what="the denied certificate's worker dropped")
        # it tries again (Dask's worker reconnects): refused at each connection
        wait_for(lambda: guard.denied >= 2, 60, what="its reconnection refused")
        assert not fw.on_scheduler(lambda s: list(s.workers))
        # the framework hears of its worker leaving on its own thread (late, under load)
        wait_for(lambda: fw.find_pilot("node-1").state is not State.RUNNING, 60,
                 what="node-1's pilot no longer running")
        assert not fw.on_scheduler(lambda s: list(s.workers))
    finally:
        stop(agent)
        fw.close()
    assert time.time() < cert.not_valid_after_utc.timestamp()   # refused before its expiry
