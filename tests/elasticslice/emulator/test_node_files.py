"""A node's files on the host and the machine its init builds (no node is started here), the
images' names, and the --latency profile's figures."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from elasticslice.emulator import nodefs
from elasticslice.emulator.images import Image, image_name
from elasticslice.emulator.pace import CLOUDLAB_BOOT, CLOUDLAB_CALLS, Latency
from elasticslice.errors import ConfigError
from tests.elasticslice.emulator.helpers import make_tarball


def test_image_names_of_every_urn_form() -> None:
    assert image_name("urn:publicid:IDN+emulab.test+image+elasticslice//MYIMAGE") == "MYIMAGE"
    assert image_name("urn:publicid:IDN+emulab.net+image+emulab-ops:UBUNTU22-64-STD") == \
        "UBUNTU22-64-STD"
    assert image_name("urn:publicid:IDN+x+image+proj//NAME:3") == "NAME"
    assert image_name(None) is None and image_name("urn:publicid:IDN+x+node+pc1") is None


def test_tarball_files_under_the_image_join_the_nodes_layer(tmp_path: Path) -> None:
    node = nodefs.NodeDir(tmp_path / "nodes" / "pc1")
    nodefs.prepare(node, None)
    tarball = make_tarball(tmp_path / "t.tgz", {"local/app/run": "x", "usr/local/bin/tool": "y",
                                                "etc/app.conf": "z"})
    nodefs.install(tarball, "http://h/t.tgz", "/", node)
    nodefs.settle(node)
    assert (node.root / "local" / "app" / "run").read_text() == "x"
    assert (node.layer / "usr" / "local" / "bin" / "tool").read_text() == "y"
    assert (node.layer / "etc" / "app.conf").read_text() == "z"
    assert not (node.root / "usr").exists() and not (node.root / "etc").exists()
    with pytest.raises(nodefs.InstallError, match="leaves the node's disk"):
        nodefs.install(tarball, "http://h/t.tgz", "/../..", node)


def _hostile(path: Path, member: str) -> Path:
    """A tarball of one good file and one member that tries to leave the install path."""
    import io
    import tarfile
    with tarfile.open(path, "w:gz") as tar:
        good = tarfile.TarInfo("local/app/ok")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"ok"))
        bad = tarfile.TarInfo(member)
        if member.startswith("link"):        # link-abs, link-up: a symlink out of the node
            bad.type = tarfile.SYMTYPE
            bad.linkname = "/etc/passwd" if member == "link-abs" else "../../../outside"
        elif member == "fifo":
            bad.type = tarfile.FIFOTYPE
        else:
            bad.size = 3
        tar.addfile(bad, io.BytesIO(b"bad") if bad.isreg() else None)
    return path


@pytest.mark.parametrize("pep706", [True, False], ids=["tarfile-filter", "no-filter"])
@pytest.mark.parametrize("member", ["../../../outside", "link-abs", "link-up", "fifo"])
def test_a_tarball_member_that_would_leave_the_install_path_fails_the_install(
        tmp_path: Path, monkeypatch, member: str, pep706: bool) -> None:
    """Whether this Python has tarfile's "data" filter (PEP 706) or not (Debian 12's 3.11.2,
    CPython before 3.10.12 and 3.11.4: the same checks of the box's own), a member that
    would land or link outside the install path, or a special file, fails the install with
    one line naming it, and writes nothing outside."""
    import tarfile
    if not pep706:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    node = nodefs.NodeDir(tmp_path / "nodes" / "pc1")
    nodefs.prepare(node, None)
    tarball = _hostile(tmp_path / "t.tgz", member)
    with pytest.raises(nodefs.InstallError, match="cannot unpack http://h/t.tgz: .*"
                       + ("special" if member == "fifo" else "(outside|absolute)")) as err:
        nodefs.install(tarball, "http://h/t.tgz", "/local", node)
    assert "\n" not in str(err.value)
    assert not list(tmp_path.glob("**/outside")) and not (node.root / "local" / member).exists()


def test_the_machine_stacks_the_nodes_layer_the_box_and_the_image_over_the_host(
        tmp_path: Path) -> None:
    node = nodefs.NodeDir(tmp_path / "nodes" / "pc1")
    nodefs.prepare(node, None)
    (node.layer / "usr").mkdir(parents=True)
    (tmp_path / "box" / "usr" / "bin").mkdir(parents=True)
    image = Image("MINE", tmp_path / "image")
    (image.root / "usr" / "local").mkdir(parents=True)
    (image.root / "opt" / "app").mkdir(parents=True)
    spec = nodefs.machine_spec(node, image, tmp_path / "box", "n1.s.p.d", ["/x/emu"])
    layers = dict(spec["image"])
    assert layers["usr"] == [str(node.layer / "usr"), str(tmp_path / "box" / "usr"),
                             str(image.root / "usr"), "/usr"]
    assert layers["etc"] == ["/etc"]  # the host's alone: a read-only bind
    assert ["opt", str(image.root / "opt")] in spec["binds"]
    assert [nodefs.GENI_MOUNT, str(node.geni)] in spec["binds"]
    links = {n: os.readlink(f"/{n}") for n in ("bin", "lib") if os.path.islink(f"/{n}")}
    assert all(spec["links"][n] == t for n, t in links.items())
    assert spec["root"] == str(node.root) and spec["hide"] == ["/x/emu"]
    assert nodefs.hostname("a" * 70, "node-1") == "node-1"


def test_latency_profiles() -> None:
    none, paced = Latency("none"), Latency("cloudlab", time_scale=0.01, seed=3)
    assert none.call_seconds("CreateSliver") == 0 and none.boot_seconds() is None
    for method, (low, high) in CLOUDLAB_CALLS.items():
        assert low * 0.01 <= paced.call_seconds(method) <= high * 0.01
    assert paced.call_seconds("SliverStatus") == 0  # only the four figures change
    assert CLOUDLAB_BOOT[0] * 0.01 <= paced.boot_seconds() <= CLOUDLAB_BOOT[1] * 0.01
    assert Latency("cloudlab", seed=3).call_seconds("AddNodes") == \
        Latency("cloudlab", seed=3).call_seconds("AddNodes")  # --seed repeats the draws
    with pytest.raises(ConfigError, match="unknown latency profile"):
        Latency("fast")
    with pytest.raises(ConfigError, match="time scale"):
        Latency("cloudlab", time_scale=0)
