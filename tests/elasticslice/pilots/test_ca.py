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


def test_node_tarball_carries_no_key_only_the_ca_a_token_and_the_script(
        tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    publisher = TarballPublisher().start()
    enrolment = EnrolmentService(ca, is_held=lambda cid: True).start()
    try:
        helper = PilotElasticSliceHelper(ca, "tls://127.0.0.1:4321", tmp_path / "tarballs",
                                         publisher=publisher, enrolment=enrolment,
                                         node_python="/opt/venv/bin/python")
        args = helper.get_add_args(1)
        (cid, node), = args.items()
        startup = str(node)
        assert "PRIVATE KEY" not in startup and "token" not in startup
        assert node["startup"] == "sh /local/pilot/start.sh"  # one string (AddNodes)
        url, = node["tarballs"]  # a bare URL: CloudLab installs it at /
        assert tarball_problem(url) is None and url.startswith(publisher.base_url)
        assert "?" not in url
        kept = tmp_path / "tarballs" / f"{cid}.tar.gz"
        assert mode(kept) == 0o600 and mode(kept.parent) == 0o700
        with urllib.request.urlopen(url, timeout=30) as resp:  # as the CM fetches it
            data = resp.read()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = {m.name: m for m in tar.getmembers()}
            script = tar.extractfile("local/pilot/start.sh").read().decode()
            contents = b"".join(tar.extractfile(m).read() for m in tar.getmembers()
                                if m.isfile())
            token = tar.extractfile("local/pilot/token").read().decode()
        assert set(members) == {"local", "local/pilot", *(f"local/pilot/{n}" for n in (
            "ca.pem", "token", "start.sh"))}
        assert b"PRIVATE KEY" not in contents  # no key of anyone
        assert contents.count(b"BEGIN CERTIFICATE") == 1  # the CA's only, no node's
        assert members["local/pilot/token"].mode == 0o600
        assert token not in script and token not in startup
        assert enrolment.tokens() == 1
        assert 'name=$(geni-get client_id)' in script and "ELASTICSLICE_CLIENT_ID" not in script
        assert "ELASTICSLICE_NODE_IP" not in script  # a real node has no such variable
        assert "py=/opt/venv/bin/python\n" in script
        assert (f'"$py" -m troy.frameworks.dask.enrol {enrolment.url} "$here/token" '
                f'"$here/ca.pem" "$name" "$here"') in script
        assert ('exec "$py" -m troy.frameworks.dask node tls://127.0.0.1:4321 '
                '"$cores" "$name" ${host:+"$host"}') in script
        assert f"export TROY_NODE_RENEW_URL={enrolment.url}" in script
        assert not list((tmp_path / "pki").rglob(f"{cid}*"))  # nothing of the node's kept
        helper.handle_deleted_node({"client_id": cid})
        assert not kept.exists()  # the token goes with the node, and its URL with it
        assert enrolment.tokens() == 0
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
        with tarfile.open(helper.tarball("node-1")) as tar:
            wrapper = tar.extractfile("local/pilot/python").read().decode()
            script = tar.extractfile("local/pilot/start.sh").read().decode()
        assert wrapper == '#!/bin/sh\nexec env X=1 python3 "$@"\n'
        assert 'py="$here/python"' in script
        helper.forget_all()
        assert not list((tmp_path / "tarballs").iterdir()) and enrolment.tokens() == 0
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
