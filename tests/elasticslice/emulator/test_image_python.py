"""An image has its own python3 and architecture (docs/emulator.md, rule R16), as CloudLab's
do: UBUNTU22-64-STD's python3 is 3.10, UBUNTU24-64-STD's 3.12, without pip or ensurepip,
and ARM64 images run on m400s. Before, every box node's python3 was this machine's
/usr/bin/python3 whatever the image, and pip came with it.

The startup commands work in /tmp, so they pass whether startup runs as root or as the
experiment's user."""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator import isolate
from elasticslice.emulator.imagepython import HOST_ARCH
from elasticslice.emulator.images import host_python
from elasticslice.pilots.wheelhouse import repack, wheel_name
from tests.elasticslice.emulator.helpers import Session
from tests.elasticslice.emulator.node_helpers import add_node, exited

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    isolate.choose({}).isolation is not isolate.Isolation.NAMESPACES,
    reason=f"Linux namespaces unavailable here: {isolate.choose({}).reason}")]

PYTHON_CHECKS = """cd /tmp && {
python3 -c 'import sys; print(sys.version_info[:2])'
readlink /usr/bin/python3
python3 -m venv --without-pip /tmp/v && /tmp/v/bin/python -c \
'import sys; print(sys.version_info[:2], sys.prefix == "/tmp/v", sys.base_prefix)'
python3 -c 'import importlib.util as u; print(u.find_spec("pip"), u.find_spec("ensurepip"))'
for c in pip pip3 pip3.10 pip3.11 pip3.12; do command -v $c; done
python3 -m venv /tmp/w >/dev/null 2>&1 && echo venv made pip || echo venv without ensurepip
python3 -c 'import sysconfig; print(sysconfig.get_platform())'
} > /tmp/out 2>&1; true"""

STOCK_CHECKS = """cd /tmp && {
python3 -c 'import sys; print(sys.version_info[:2])'
readlink -f /usr/bin/python3 | xargs basename
python3 -c 'import sysconfig; print(sysconfig.get_platform())'
} > /tmp/out 2>&1; true"""


def _python(version: str) -> Path:
    found = host_python(version)
    if found is None:
        pytest.skip(f"no Python {version} on this machine (pyenv's, /usr/bin/python{version}, "
                    "uv's)")
    return found


def _add(emulator, name: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["emulator", "image", "add", "--dir", str(emulator.dir),
                                      name, *args])
    assert result.exit_code == 0, result.output
    return result.output.split()[-1]


def _host(version_of: str) -> str:
    return subprocess.run([version_of, "-c", "import sys; print(tuple(sys.version_info[:2]))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_node_of_a_python310_image_has_that_python3_and_no_pip(emulator):
    python = _python("3.10")
    urn = _add(emulator, "UBUNTU22-LIKE", "--python", str(python))
    s = Session(emulator)
    slice_urn, cred, _ = s.create()
    mine = add_node(s, slice_urn, cred, "py310", PYTHON_CHECKS, diskimage=urn)
    stock = add_node(s, slice_urn, cred, "stock", STOCK_CHECKS)
    for cid in ("py310", "stock"):
        assert exited(s, slice_urn, cred, cid)["execute_status"] == 0
    assert (mine / "root" / "tmp" / "out").read_text().splitlines() == [
        "(3, 10)", "python3.10", "(3, 10) True /usr", "None None", "venv without ensurepip",
        f"linux-{HOST_ARCH}"]
    # the stock image's node is as before: this machine's /usr/bin/python3
    assert (stock / "root" / "tmp" / "out").read_text().splitlines() == [
        _host("/usr/bin/python3"), Path("/usr/bin/python3").resolve().name,
        f"linux-{HOST_ARCH}"]


def test_an_image_may_name_this_machines_own_python3_without_its_pip(emulator):
    urn = _add(emulator, "SYSTEM-PY", "--python", "/usr/bin/python3")
    s = Session(emulator)
    slice_urn, cred, _ = s.create()
    node = add_node(s, slice_urn, cred, "sys", PYTHON_CHECKS, diskimage=urn)
    assert exited(s, slice_urn, cred, "sys")["execute_status"] == 0
    out = (node / "root" / "tmp" / "out").read_text().splitlines()
    version = _host("/usr/bin/python3")
    assert out[0] == version and out[2] == f"{version} True /usr"
    assert out[3:] == ["None None", "venv without ensurepip", f"linux-{HOST_ARCH}"]


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _tiny_x86_wheel(folder: Path) -> Path:
    """A wheel that installs on x86_64 Linux only."""
    tag = "py3-none-manylinux_2_17_x86_64"
    files = {"tiny/__init__.py": b"X = 1\n",
             "tiny-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
             "tiny-1.0.dist-info/WHEEL": (f"Wheel-Version: 1.0\nGenerator: test\n"
                                          f"Root-Is-Purelib: false\nTag: {tag}\n").encode()}
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in files.items()]
    files["tiny-1.0.dist-info/RECORD"] = ("\n".join([*record, "tiny-1.0.dist-info/RECORD,,"])
                                          + "\n").encode()
    wheel = folder / f"tiny-1.0-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def test_an_aarch64_image_reports_it_and_pip_refuses_an_x86_only_wheel(emulator, tmp_path):
    python = _python("3.12")
    folder = tmp_path / "wheels-image" / "opt" / "wheels"
    folder.mkdir(parents=True)
    tiny = _tiny_x86_wheel(folder)
    pip = folder / wheel_name(md.distribution("pip"))
    repack(md.distribution("pip"), pip)  # pip run from its wheel, as the pilots' index mode
    images = {"arm": _add(emulator, "ARM", str(folder.parent.parent), "--python", str(python),
                          "--arch", "aarch64"),
              "armstock": _add(emulator, "ARM-STOCK-PY", str(folder.parent.parent),
                               "--arch", "aarch64"),
              "x86": _add(emulator, "X86", str(folder.parent.parent), "--python", str(python),
                          "--arch", "x86_64")}
    script = ("cd /tmp && { python3 -c 'import sysconfig; print(sysconfig.get_platform())'; "
              "python3 -m venv --without-pip /tmp/v && /tmp/v/bin/python -c "
              "'import sysconfig; print(sysconfig.get_platform())'; uname -m; "
              f"/tmp/v/bin/python /opt/wheels/{pip.name}/pip install --no-index --no-cache-dir "
              f"--disable-pip-version-check /opt/wheels/{tiny.name}; echo pip exit $?; "
              "} > /tmp/out 2>&1; true")
    s = Session(emulator)
    slice_urn, cred, _ = s.create()
    nodes = {cid: add_node(s, slice_urn, cred, cid, script, diskimage=urn)
             for cid, urn in images.items()}
    outs = {}
    for cid, node in nodes.items():
        assert exited(s, slice_urn, cred, cid, timeout=120)["execute_status"] == 0
        outs[cid] = (node / "root" / "tmp" / "out").read_text()
    for cid in ("arm", "armstock"):
        lines = outs[cid].splitlines()
        assert lines[:3] == ["linux-aarch64", "linux-aarch64", HOST_ARCH], outs[cid]  # a label
        assert "is not a supported wheel on this platform" in outs[cid], outs[cid]
        assert lines[-1] == "pip exit 1", outs[cid]
    lines = outs["x86"].splitlines()  # the same wheel, on an x86_64 image: installed
    assert lines[:2] == ["linux-x86_64"] * 2 and lines[-1] == "pip exit 0", outs["x86"]
