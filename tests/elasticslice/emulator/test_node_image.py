"""A node is a machine booted from an image: it sees the image (the host's /usr, /etc...,
read-only), a writable tree of its own, and nothing else of the host. Before, a node saw the
whole host but the emulator folder: a manager's state folder in /tmp or in the home folder
(its cluster CA key, every node's key, troy.db), the checkout, the virtualenv (whose python a
node ran), other nodes' files in the shared /tmp."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from elasticslice.emulator import isolate
from elasticslice.rspec import NodeSpec, build_request
from tests.helpers import REPO, wait_for
from tests.elasticslice.emulator.helpers import Session
from tests.elasticslice.emulator.node_helpers import add_node, as_root, exited

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    isolate.choose({}).isolation is not isolate.Isolation.NAMESPACES,
    reason=f"Linux namespaces unavailable here: {isolate.choose({}).reason}")]


def _slice(s: Session) -> tuple[str, str]:
    urn, cred, _ = s.create(rspec=build_request([NodeSpec("base")]))
    return urn, cred


def _state_dir(parent: Path) -> Path:
    """A manager's state folder as ElasticCluster keeps it (pki/ca.key, troy.db...)."""
    state = parent / "cluster"
    (state / "pki" / "members").mkdir(parents=True)
    for name in ("pki/ca.key", "pki/members/node-1.key", "troy.db", "state/state.db"):
        (state / name).parent.mkdir(parents=True, exist_ok=True)
        (state / name).write_text("secret\n")
    return state


def _tries(paths: list[Path | str]) -> str:
    """A command trying to read each path (a file, or a folder's listing) as root of the node
    (the user has sudo): what it read goes to /found, then "done"."""
    tries = [f"(cat '{p}' || ls -A '{p}') >/dev/null 2>&1 && echo 'READ {p}' >> /found"
             for p in paths]
    return as_root("; ".join([*tries, "echo done >> /found"]))


def test_a_node_reads_nothing_of_the_host_but_its_image(emulator, tmp_path):
    home = Path(tempfile.mkdtemp(prefix="es-node-test-", dir=Path.home()))
    try:
        in_tmp, in_home = _state_dir(tmp_path), _state_dir(home)  # tmp_path: in $TMPDIR
        d = emulator.dir.resolve()
        me = os.getpid()  # the emulator runs in this process
        paths: list[Path | str] = [
            d, d / "ca-key.pem", d / "state.db",                           # the emulator
            in_tmp / "pki" / "ca.key", in_tmp / "troy.db", in_tmp,         # state in /tmp
            in_home / "pki" / "ca.key", in_home / "troy.db", in_home,      # and in the home
            Path(sys.prefix) / "pyvenv.cfg", sys.executable,               # the virtualenv
            REPO / "setup.cfg", REPO / "elasticslice" / "__init__.py",     # the checkout
            f"/proc/{me}/root{d}/ca-key.pem", f"/proc/{me}/environ",
            "/home", "/srv", "/opt", "/root/.bashrc", "/work", "/tmp/pytest-of-root"]
        s = Session(emulator)
        urn, cred = _slice(s)
        node = add_node(s, urn, cred, "spy", _tries(paths))
        assert exited(s, urn, cred, "spy")["execute_status"] == 0
        assert (node / "root" / "found").read_text().splitlines() == ["done"]
        assert (in_home / "troy.db").is_file() and Path(sys.executable).exists()  # they exist
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_node_reads_nothing_of_another_node(emulator):
    s = Session(emulator)
    urn, cred = _slice(s)
    mine = "/tmp/mine /var/tmp/mine /root/mine /local/mine /mine"
    first = add_node(s, urn, cred, "a", as_root(f"mkdir -p /local; for f in {mine}; do "
                                                "echo a > $f; done; sleep 300"))
    written = first / "root" / "local" / "mine"
    wait_for(written.exists, timeout=30, what="node a's files")
    # a's files by the same paths on b, and by a's folder on the host
    theirs: list[Path | str] = [*mine.split(), first / "root" / "mine",
                                first / "root" / "tmp" / "mine", first]
    second = add_node(s, urn, cred, "b", _tries(theirs))
    assert exited(s, urn, cred, "b")["execute_status"] == 0
    assert (second / "root" / "found").read_text().splitlines() == ["done"]


def test_python3_on_a_node_is_the_images_own(emulator):
    image_python = subprocess.run(["/usr/bin/python3", "--version"], capture_output=True,
                                  text=True, check=True).stdout.split()[1]
    s = Session(emulator)
    urn, cred = _slice(s)
    script = ("python3 -c 'import sys; print(sys.executable, sys.version.split()[0])' > "
              f"/tmp/py; test -e '{sys.executable}' && echo 'VENV PYTHON' >> /tmp/py; "
              "python3 -c 'import troy' 2>/dev/null && echo 'PROJECT ON STOCK IMAGE' >> "
              "/tmp/py; true")
    node = add_node(s, urn, cred, "py", script)
    assert exited(s, urn, cred, "py")["execute_status"] == 0
    assert (node / "root" / "tmp" / "py").read_text().split("\n") == \
        [f"/usr/bin/python3 {image_python}", ""]


def test_the_image_is_read_only_and_the_rest_is_the_nodes_own(emulator):
    s = Session(emulator)
    urn, cred = _slice(s)
    script = ("touch /usr/x /etc/x 2>/dev/null && echo WROTE-IMAGE > /seen; "
              "for d in /tmp /var/tmp /root /local /; do touch $d/w || echo CANNOT-$d >> /seen; "
              "done; ls -A / > /listing; hostname > /name; test -c /dev/null || echo NODEV >> "
              "/seen; geni-get client_id > /who; true")
    node = add_node(s, urn, cred, "w1", as_root(script))  # root of the node (the user has sudo)
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    root = node / "root"
    assert not (root / "seen").exists(), (root / "seen").read_text()
    listing = set((root / "listing").read_text().split())
    allowed = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc",
               "tmp", "var", "root", "local", "run", "users", "w", "seen", "listing", "name",
               "who"}
    assert listing <= allowed and {"usr", "etc", "tmp", "root", "proc"} <= listing, listing
    assert (root / "name").read_text().startswith("w1.")
    assert (root / "who").read_text() == "w1\n"
