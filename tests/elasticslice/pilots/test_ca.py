"""The cluster CA and the nodes' install tarballs: keys 0600, never on a command line."""
from __future__ import annotations

import stat
import tarfile
from pathlib import Path

import pytest
from cryptography import x509

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots import (ClusterCA, ClusterCAError, ElasticCluster,
                               PilotElasticSliceHelper)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_ca_is_made_once_and_its_files_are_private(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    again = ClusterCA.open(tmp_path / "pki")
    assert again.cert_pem == ca.cert_pem  # reopened after a restart, not remade
    assert mode(tmp_path / "pki") == 0o700
    assert mode(tmp_path / "pki" / "ca.key") == 0o600 and mode(ca.ca_file) == 0o600
    cert_path, key_path = ca.issue("node-1")
    assert mode(cert_path) == 0o600 and mode(key_path) == 0o600
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    root = x509.load_pem_x509_certificate(ca.cert_pem)
    cert.verify_directly_issued_by(root)
    assert cert.subject.rfc4514_string() == "CN=node-1"
    assert "PRIVATE KEY" not in repr(ca)


def test_a_member_name_that_is_not_a_file_name_is_refused(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    with pytest.raises(ClusterCAError, match="not a usable name"):
        ca.issue("..")


def test_node_tarball_carries_the_key_and_the_command_line_does_not(tmp_path: Path) -> None:
    ca = ClusterCA.open(tmp_path / "pki")
    helper = PilotElasticSliceHelper(ca, "tls://127.0.0.1:4321", tmp_path / "tarballs",
                                     python="/opt/venv/bin/python")
    args = helper.get_add_args(1)
    (cid, node), = args.items()
    startup = str(node)
    assert "PRIVATE KEY" not in startup and "node.key" not in startup
    assert node["startup"][0] == "sh /local/pilot/start.sh"
    (url, path), = node["tarballs"]
    assert url.startswith("file://") and path == "/local/pilot"
    tarball = Path(url[len("file://"):])
    assert mode(tarball) == 0o600 and mode(tarball.parent) == 0o700
    with tarfile.open(tarball) as tar:
        members = {m.name: m for m in tar.getmembers()}
        script = tar.extractfile("start.sh").read().decode()
        key = tar.extractfile("node.key").read()
    assert set(members) == {"ca.pem", "node.pem", "node.key", "start.sh"}
    assert all(members[n].mode == 0o600 for n in ("ca.pem", "node.pem", "node.key"))
    assert b"PRIVATE KEY" in key and "PRIVATE KEY" not in script
    assert (f"exec /opt/venv/bin/python -m troy.frameworks.dask node tls://127.0.0.1:4321 "
            f'"$cores" {cid}') in script
    helper.handle_deleted_node({"client_id": cid})
    assert not tarball.exists()  # the key goes with the node


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
