"""The cluster CA and the nodes' install tarballs: keys 0600, never on a command line."""
from __future__ import annotations

import io
import stat
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots import (ClusterCA, ClusterCAError, ElasticCluster,
                               PilotElasticSliceHelper)
from elasticslice.pilots.enrol import EnrolmentService
from elasticslice.pilots.publish import TarballPublisher
from elasticslice.rspec.tarball import tarball_problem


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_ca_is_made_once_and_its_files_are_private(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    again = ClusterCA.open(tmp_path / "pki")
    assert again.cert_pem == ca.cert_pem  # reopened after a restart, not remade
    assert mode(tmp_path / "pki") == 0o700
    assert mode(tmp_path / "pki" / "ca.key") == 0o600 and mode(ca.ca_file) == 0o600
    cert_path, key_path = ca.issue("scheduler")
    assert mode(cert_path) == 0o600 and mode(key_path) == 0o600
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    root = x509.load_pem_x509_certificate(ca.cert_pem)
    cert.verify_directly_issued_by(root)
    assert cert.subject.rfc4514_string() == "OU=control,CN=scheduler"  # its role: the OU
    assert "PRIVATE KEY" not in repr(ca)


def test_a_member_certificate_near_its_end_is_issued_again_when_asked_for(tmp_path: Path
                                                                         ) -> None:
    """A member's certificate is reused after a restart while it has more than a day to
    live; one with less (a run resumed a week later: members' certificates last 7 days) is
    issued again, with a new key, so the scheduler and the enrolment service never serve
    an expired one."""
    import datetime as dt

    from elasticslice.rpc import pki
    ca = ClusterCA.open(tmp_path / "pki")
    cert_path, key_path = ca.issue("scheduler")
    first = cert_path.read_bytes(), key_path.read_bytes()
    assert ca.issue("scheduler") == (cert_path, key_path)
    assert (cert_path.read_bytes(), key_path.read_bytes()) == first   # reused
    # the same member, its certificate issued 7 days ago: one hour left
    old, _ = pki.issue_certificate(ca.cert_pem, ca._key_pem, "scheduler", role="control",
                                   lifetime=dt.timedelta(hours=1),
                                   public_key_pem=x509.load_pem_x509_certificate(first[0])
                                   .public_key().public_bytes(
                                       serialization.Encoding.PEM,
                                       serialization.PublicFormat.SubjectPublicKeyInfo))
    cert_path.write_bytes(old)
    assert ca.issue("scheduler") == (cert_path, key_path)
    renewed = x509.load_pem_x509_certificate(cert_path.read_bytes())
    left = renewed.not_valid_after_utc - dt.datetime.now(dt.timezone.utc)
    assert left.total_seconds() > 24 * 3600                        # a day at least
    assert key_path.read_bytes() != first[1] and mode(key_path) == 0o600
    renewed.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))


def test_the_cluster_keys_are_p256_and_a_ca_made_with_rsa_before_still_issues(
        tmp_path: Path) -> None:
    """New cluster CAs and their members use ECDSA P-256 (cheap to make per node and in
    every handshake); a CA directory made before, with an RSA key, is used as it is."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from elasticslice.rpc import pki
    new = ClusterCA.open(tmp_path / "new")
    _, key_path = new.issue("scheduler")
    assert isinstance(x509.load_pem_x509_certificate(new.cert_pem).public_key(),
                      ec.EllipticCurvePublicKey)
    assert b"BEGIN EC PRIVATE KEY" in key_path.read_bytes()

    old = tmp_path / "old"
    old.mkdir(mode=0o700)
    cert, key = pki.make_ca("elasticslice cluster CA")  # what ClusterCA.open made before
    pki.write_private_file(old / "ca.key", key)
    pki.write_private_file(old / "ca.pem", cert)
    ca = ClusterCA.open(old)
    assert ca.cert_pem == cert  # kept, not remade
    cert_path, _ = ca.issue("scheduler")
    x509.load_pem_x509_certificate(cert_path.read_bytes()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(cert))
    pem = ca.certify("node-1", ec.generate_private_key(ec.SECP256R1()).public_key()
                     .public_bytes(pki.serialization.Encoding.PEM,
                                   pki.serialization.PublicFormat.SubjectPublicKeyInfo))
    x509.load_pem_x509_certificate(pem).verify_directly_issued_by(
        x509.load_pem_x509_certificate(cert))


def test_a_member_name_that_is_not_a_file_name_is_refused(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    with pytest.raises(ClusterCAError, match="not a usable name"):
        ca.issue("..")


def read_tarball(url: str) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    """The members of a tarball as the CM fetches it: name -> (info, bytes)."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        data = resp.read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isfile() else b"")
                for m in tar.getmembers()}


def test_the_slice_shares_one_tarball_with_no_key_and_each_pending_token(
        tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    publisher = TarballPublisher().start()
    enrolment = EnrolmentService(ca, is_held=lambda cid: True).start()
    try:
        helper = PilotElasticSliceHelper(ca, "tls://127.0.0.1:4321", tmp_path / "tarballs",
                                         publisher=publisher, enrolment=enrolment,
                                         node_python="/opt/venv/bin/python",
                                         report_url="http://127.0.0.1:1/t/report")
        args = helper.get_add_args(2)
        assert sorted(args) == ["node-1", "node-2"]
        urls = {cid: node["tarballs"] for cid, node in args.items()}
        assert urls["node-1"] == urls["node-2"]  # one URL: one fetch per sliver change
        url, = urls["node-1"]  # a bare URL: CloudLab installs it at /
        assert tarball_problem(url) is None and url.startswith(publisher.base_url)
        for node in args.values():  # one string, as CloudLab's AddNodes reads it
            assert node["startup"] == "sh /local/pilot/start.sh"
            assert "PRIVATE KEY" not in str(node) and "token" not in str(node)
        kept = tmp_path / "tarballs" / "slice.tar.gz"
        assert mode(kept) == 0o600 and mode(kept.parent) == 0o700
        members = read_tarball(url)
        assert set(members) == {"local", "local/pilot", "local/pilot/ca.pem",
                                "local/pilot/start.sh", "local/pilot/nodes",
                                *(f"local/pilot/nodes/node-{i}{f}" for i in (1, 2)
                                  for f in ("", "/token"))}
        contents = b"".join(data for _, data in members.values())
        assert b"PRIVATE KEY" not in contents  # no key of anyone
        assert contents.count(b"BEGIN CERTIFICATE") == 1  # the CA's only, no node's
        info, token = members["local/pilot/nodes/node-1/token"]
        assert info.mode == 0o600 and info.uname == "root" and info.uid == 0
        assert members["local/pilot/nodes"][0].mode == 0o700
        script = members["local/pilot/start.sh"][1].decode()
        assert members["local/pilot/start.sh"][0].mode == 0o755  # run by the node's user
        assert token.decode() not in script and enrolment.tokens() == 2
        assert 'name=$(geni-get client_id)' in script and "ELASTICSLICE_CLIENT_ID" not in script
        assert "ELASTICSLICE_NODE_IP" not in script  # a real node has no such variable
        assert "py=/opt/venv/bin/python\n" in script
        assert 'asroot cat "$here/nodes/$name/token" > "$here/token"' in script
        assert (f'"$py" -m troy.frameworks.dask.enrol {enrolment.url} "$here/token" '
                f'"$here/ca.pem" "$name" "$here"') in script
        assert ('exec "$py" -m troy.frameworks.dask node tls://127.0.0.1:4321 '
                '"$cores" "$name" ${host:+"$host"}') in script
        assert f"export TROY_NODE_RENEW_URL={enrolment.url}" in script
        assert not list((tmp_path / "pki").rglob("node-*"))  # nothing of the node's kept
        helper.enrolled("node-1")  # its token spent: gone from the tarball
        assert "local/pilot/nodes/node-1/token" not in read_tarball(url)
        helper.handle_deleted_node({"client_id": "node-2"})
        assert set(read_tarball(url)) == {"local", "local/pilot", "local/pilot/ca.pem",
                                          "local/pilot/start.sh"}
        assert enrolment.tokens() == 1  # node-1's, spent with its enrolment in real life
        helper.close(remove=True)
        assert not kept.exists()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url, timeout=30)
    finally:
        enrolment.stop()
        publisher.stop()


def test_a_node_python_of_several_words_runs_through_a_wrapper(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    publisher = TarballPublisher().start()
    enrolment = EnrolmentService(ca).start()
    try:
        helper = PilotElasticSliceHelper(ca, "tls://127.0.0.1:4321", tmp_path / "tarballs",
                                         publisher=publisher, enrolment=enrolment,
                                         node_python="env X=1 python3")
        members = read_tarball(helper.tarball_url())
        wrapper = members["local/pilot/python"][1].decode()
        assert wrapper == '#!/bin/sh\nexec env X=1 python3 "$@"\n'
        assert members["local/pilot/python"][0].mode == 0o755
        assert 'py="$here/python"' in members["local/pilot/start.sh"][1].decode()
        helper.get_add_args(1)
        helper.forget_all()
        assert enrolment.tokens() == 0
        assert "local/pilot/nodes" not in read_tarball(helper.tarball_url())
    finally:
        enrolment.stop()
        publisher.stop()


def test_the_helper_refuses_a_scheduler_in_the_clear(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    with pytest.raises(ValueError, match="must be tls://"):
        PilotElasticSliceHelper(ca, "tcp://127.0.0.1:1", tmp_path / "t")


def test_a_cluster_that_cannot_start_says_why_and_closes_cleanly(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cluster = ElasticCluster(None, tmp_path / "file" / "cluster")
    with pytest.raises(ElasticSliceError, match="cannot use it as the cluster's state"):
        cluster.start()
    cluster.close()
    cluster.close()  # idempotent
