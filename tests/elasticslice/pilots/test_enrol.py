"""Enrolment without shipped keys: the node's side (``python -m troy.frameworks.dask.enrol``,
a real process) against the control node's :class:`EnrolmentService` (real HTTPS with the
cluster CA): a token is good once, for its node, before its deadline, for a node we hold;
the key is made on the node and never leaves it; renewals need the current certificate."""
from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from elasticslice.pilots import ClusterCA, ClusterCAError
from elasticslice.pilots.enrol import EnrolmentService
from troy.frameworks.dask.denylist import DenyList
from troy.frameworks.dask import enrol as node_enrol


class Cluster:
    """A CA, an enrolment service holding ``held``, each node at the address ``addresses``
    gives it (127.0.0.1 unless said: where this test's commands connect from), and the
    deny list of the certificates of nodes that left."""

    def __init__(self, tmp: Path, lifetime: float = 3600.0, keep: Path | None = None) -> None:
        self.tmp = tmp
        self.ca = ClusterCA.open(tmp / "pki")
        self.held: set[str] = {"node-1", "node-2"}
        self.addresses: dict[str, str | None] = {}
        self.deny = DenyList(tmp / "denied.json")
        self.svc = EnrolmentService(self.ca, is_held=lambda cid: cid in self.held,
                                    address_of=lambda cid: self.addresses.get(cid,
                                                                              "127.0.0.1"),
                                    cert_lifetime=lifetime, keep=keep, deny=self.deny)
        self.svc.start()

    def token_file(self, client_id: str, deadline: float | None = None,
                   name: str | None = None) -> Path:
        token = self.svc.token_for(client_id, deadline=deadline or time.time() + 600)
        path = self.tmp / (name or f"token-{client_id}")
        path.write_text(token)
        return path

    def enrol(self, token: Path, client_id: str, out: str = "out"
              ) -> subprocess.CompletedProcess[str]:
        """The node's command, as start.sh runs it."""
        return subprocess.run(
            [sys.executable, "-m", "troy.frameworks.dask.enrol", self.svc.url, str(token),
             str(self.ca.ca_file), client_id, str(self.tmp / out)],
            capture_output=True, text=True, timeout=120)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    yield made
    made.svc.stop()


def refused(result: subprocess.CompletedProcess[str], why: str) -> None:
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0], result.stderr  # one line, no traceback
    assert "Traceback" not in result.stderr


def test_a_node_enrols_with_its_token_and_its_key_never_leaves_it(cluster: Cluster,
                                                                   caplog) -> None:
    caplog.set_level(logging.DEBUG)
    token = cluster.token_file("node-1")
    secret = token.read_text()
    result = cluster.enrol(token, "node-1")
    assert result.returncode == 0, result.stderr
    out = cluster.tmp / "out"
    assert not token.exists()  # spent: deleted on the node
    assert stat.S_IMODE((out / "node.key").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((out / "node.pem").read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(cluster.ca.cert_pem))
    assert cert.subject.rfc4514_string() == "OU=worker,CN=node-1"
    life = cert.not_valid_after_utc.timestamp() - time.time()
    assert 3500 < life <= 3600  # short-lived: cert_lifetime
    # the control node kept no key of the node: only its control members'
    keys = sorted(p.name for p in cluster.ca.directory.rglob("*.key"))
    assert keys == ["ca.key", "enrolment.key"], keys
    assert not (cluster.ca.directory / "members" / "node-1.pem").exists()
    assert secret not in caplog.text


def test_a_used_token_is_refused_and_counted(cluster: Cluster, caplog) -> None:
    token = cluster.token_file("node-1")
    copy = cluster.tmp / "copy"  # the CM's archived copy of the tarball has it too
    secret = token.read_text()
    copy.write_text(secret)
    assert cluster.enrol(token, "node-1").returncode == 0
    caplog.set_level(logging.WARNING)
    again = cluster.enrol(copy, "node-1", out="thief")
    refused(again, "enrolment token already used")
    assert not (cluster.tmp / "thief" / "node.pem").exists()
    assert cluster.svc.replays == 1
    assert secret not in caplog.text  # logged without the token


def test_an_expired_token_is_refused(cluster: Cluster) -> None:
    token = cluster.token_file("node-1", deadline=time.time() - 1)
    refused(cluster.enrol(token, "node-1"), "expired")
    assert not token.exists()  # a token is good for one presentation


def test_another_nodes_token_is_refused(cluster: Cluster) -> None:
    token = cluster.token_file("node-1")
    refused(cluster.enrol(token, "node-2"), "not node-2's")
    assert not (cluster.tmp / "out" / "node.pem").exists()


def test_a_node_we_do_not_hold_is_refused(cluster: Cluster) -> None:
    token = cluster.token_file("node-9")
    refused(cluster.enrol(token, "node-9"), "node-9 is not a node of this cluster")


def test_a_forgotten_node_and_a_stopped_service_issue_nothing(cluster: Cluster) -> None:
    token = cluster.token_file("node-1")
    cluster.svc.forget("node-1")  # the node went
    refused(cluster.enrol(token, "node-1"), "unknown enrolment token")
    cluster.token_file("node-2")
    assert cluster.svc.tokens() == 1
    cluster.svc.stop()
    assert cluster.svc.tokens() == 0


def test_a_request_for_another_client_id_than_the_tokens_is_refused(cluster: Cluster) -> None:
    """The token is node-1's and so is the claimed client_id, but the key is certified for
    whatever the request says: a request naming node-2 is refused."""
    key, csr = node_enrol.new_key_and_csr("node-2")
    token = cluster.svc.token_for("node-1", deadline=time.time() + 60)
    ctx = node_enrol.tls_context(str(cluster.ca.ca_file))
    with pytest.raises(node_enrol.EnrolError, match="request is for 'node-2', not 'node-1'"):
        node_enrol._post(cluster.svc.url, "/enrol", {"token": token, "client_id": "node-1",
                                                     "csr": csr.decode()}, ctx)


def test_a_token_of_a_killed_process_enrols_with_the_next_one_and_only_once(
        tmp_path: Path, caplog) -> None:
    """The cluster's process is SIGKILLed while a node boots with its token: the next
    process on the same state dir (the same kept file) enrols it, once; what the file keeps
    is no token; a forgotten node's token, a used one and an expired one stay refused."""
    keep = tmp_path / "enrol-tokens.json"
    first = Cluster(tmp_path, keep=keep)
    booting = first.token_file("node-1")
    used = first.token_file("node-2")
    copy = tmp_path / "copy"
    copy.write_text(used.read_text())
    assert first.enrol(used, "node-2", out="n2").returncode == 0
    gone = first.token_file("node-3")
    first.held.add("node-3")
    first.svc.forget("node-3")
    secrets_ = [booting.read_text(), copy.read_text(), gone.read_text()]
    assert stat.S_IMODE(keep.stat().st_mode) == 0o600
    assert not any(secret in keep.read_text() for secret in secrets_)
    first.svc.stop()  # its memory is gone, as a killed process'; the file stays
    caplog.set_level(logging.WARNING)
    second = Cluster(tmp_path, keep=keep)
    second.held.add("node-3")
    try:
        assert second.enrol(booting, "node-1").returncode == 0, "the booting node"
        refused(second.enrol(copy, "node-2", out="thief"), "enrolment token already used")
        assert second.svc.replays == 1
        refused(second.enrol(gone, "node-3", out="n3"), "unknown enrolment token")
        again = tmp_path / "again"
        again.write_text(secrets_[0])
        refused(second.enrol(again, "node-1", out="n1b"), "enrolment token already used")
    finally:
        second.svc.stop()
    assert not any(secret in caplog.text for secret in secrets_)
    keep.write_text("{not json")  # damaged: one warning, no token kept, the service serves
    third = Cluster(tmp_path, keep=keep)
    try:
        assert third.svc.tokens() == 0 and "not read" in caplog.text
    finally:
        third.svc.stop()


def test_the_node_pins_the_cluster_ca(cluster: Cluster, tmp_path: Path) -> None:
    other = ClusterCA.open(tmp_path / "other")  # an impostor's CA
    token = cluster.token_file("node-1")
    result = subprocess.run(
        [sys.executable, "-m", "troy.frameworks.dask.enrol", cluster.svc.url, str(token),
         str(other.ca_file), "node-1", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120)
    refused(result, "the server's certificate is not of the cluster CA")
    assert token.exists()  # never sent: still good for the real service


def test_a_held_node_renews_with_its_certificate_and_a_forgotten_one_cannot(
        cluster: Cluster) -> None:
    assert cluster.enrol(cluster.token_file("node-1"), "node-1").returncode == 0
    out = cluster.tmp / "out"
    cert, key = str(out / "node.pem"), str(out / "node.key")
    old_key = Path(key).read_bytes()
    node_enrol.renew(cluster.svc.url, str(cluster.ca.ca_file), cert, key)
    assert Path(key).read_bytes() != old_key  # a new key, made here
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert x509.load_pem_x509_certificate(Path(cert).read_bytes()).subject \
        .rfc4514_string() == "OU=worker,CN=node-1"
    assert cluster.svc.renewed == 1
    cluster.svc.forget("node-1")   # its certificate is denied from now on
    with pytest.raises(node_enrol.EnrolError, match="this certificate was revoked"):
        node_enrol.renew(cluster.svc.url, str(cluster.ca.ca_file), cert, key)


def test_renewal_needs_a_worker_certificate(cluster: Cluster) -> None:
    cert, key = cluster.ca.issue("scheduler")  # a control member's: not renewed here
    with pytest.raises(node_enrol.EnrolError, match="only a node's worker certificate"):
        node_enrol.renew(cluster.svc.url, str(cluster.ca.ca_file), str(cert), str(key))
    ctx = node_enrol.tls_context(str(cluster.ca.ca_file))  # no certificate at all
    _, csr = node_enrol.new_key_and_csr("node-1")
    with pytest.raises(node_enrol.EnrolError, match="needs the node's current certificate"):
        node_enrol._post(cluster.svc.url, "/renew", {"csr": csr.decode()}, ctx)


def test_the_renewer_replaces_the_files_before_the_certificate_expires(tmp_path: Path) -> None:
    # a life long enough that a renewal due at 2/3 of it ends before it expires, even on a
    # loaded machine (3 s did not: the certificate expired and the renewer gave up)
    cluster = Cluster(tmp_path, lifetime=10.0)
    try:
        assert cluster.enrol(cluster.token_file("node-1"), "node-1").returncode == 0
        out = tmp_path / "out"
        first = (out / "node.pem").read_bytes()
        renewer = node_enrol.Renewer.from_environ({
            node_enrol.RENEW_URL_ENV: cluster.svc.url,
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(cluster.ca.ca_file),
            "DASK_DISTRIBUTED__COMM__TLS__WORKER__CERT": str(out / "node.pem"),
            "DASK_DISTRIBUTED__COMM__TLS__WORKER__KEY": str(out / "node.key")}).start()
        from tests.helpers import wait_for
        wait_for(lambda: renewer.renewals >= 2, timeout=60, what="two renewals")
        renewer.stop()
        assert (out / "node.pem").read_bytes() != first
        cert = x509.load_pem_x509_certificate((out / "node.pem").read_bytes())
        assert cert.not_valid_after_utc.timestamp() > time.time()
    finally:
        cluster.svc.stop()


def test_the_renewer_needs_the_tls_files() -> None:
    assert node_enrol.Renewer.from_environ({}) is None
    with pytest.raises(ValueError, match="Dask's TLS files are not"):
        node_enrol.Renewer.from_environ({node_enrol.RENEW_URL_ENV: "https://h:1"})


def test_bad_usage_of_the_node_command_says_how() -> None:
    result = subprocess.run([sys.executable, "-m", "troy.frameworks.dask.enrol", "x"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.startswith("usage:")


def test_the_ca_issues_keys_to_control_members_only(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    with pytest.raises(ClusterCAError, match="nodes make their own and enrol"):
        ca.issue("node-1", role="worker")
    assert not (tmp_path / "pki" / "members" / "node-1.key").exists()


MANIFEST = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="manifest">
 <node client_id="node-1"><host name="node-1.s.p.d" ipv4="{host}"/>
  <interface client_id="node-1:if0"><ip address="10.10.1.1" netmask="255.255.255.0"/></interface>
 </node>
 <node client_id="node-2"><host name="node-2.s.p.d" ipv4="127.0.0.1"/></node>
</rspec>"""


def test_an_agent_advertises_its_manifest_address_when_it_is_configured_here() -> None:
    def advertise(manifest: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "troy.frameworks.dask.enrol", "--advertise", "node-1"],
            input=manifest, capture_output=True, text=True, timeout=60, check=True).stdout
    # 127.0.0.1 is configured on every machine: node-1's host address is advertised
    assert advertise(MANIFEST.format(host="127.0.0.1")) == "127.0.0.1\n"
    # addresses not on this machine (the box's nodes share the host's network): nothing,
    # and the agent uses the address it reaches the scheduler from
    assert advertise(MANIFEST.format(host="192.0.2.7")) == ""
    assert node_enrol.manifest_addresses(MANIFEST.format(host="192.0.2.7"), "node-1") == \
        ["192.0.2.7", "10.10.1.1"]
    assert advertise("not xml") == ""
