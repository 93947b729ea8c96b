"""Custom images, as CloudLab users make them from a node with their software installed:
``emulator image add NAME DIR`` lays DIR over the stock image for the nodes booted from it,
and no other node sees its files."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator import isolate
from elasticslice.emulator.imagepython import HOST_ARCH
from tests.elasticslice.emulator.helpers import Session, ok
from tests.elasticslice.emulator.node_helpers import add_node, as_root, exited

pytestmark = pytest.mark.slow
needs_namespaces = pytest.mark.skipif(
    isolate.choose({}).isolation is not isolate.Isolation.NAMESPACES,
    reason=f"Linux namespaces unavailable here: {isolate.choose({}).reason}")


def _image(tmp_path):
    source = tmp_path / "myimage"
    (source / "usr" / "local" / "bin").mkdir(parents=True)
    tool = source / "usr" / "local" / "bin" / "mytool"
    tool.write_text("#!/bin/sh\necho tool of the image\n")
    tool.chmod(0o755)
    (source / "opt" / "app").mkdir(parents=True)
    (source / "opt" / "app" / "data.txt").write_text("image data\n")
    (source / "root").mkdir()
    (source / "root" / ".settings").write_text("mine\n")
    return source


@needs_namespaces
def test_a_custom_images_files_are_seen_only_by_nodes_booted_from_it(emulator, tmp_path):
    result = CliRunner().invoke(cli, ["emulator", "image", "add", "--dir", str(emulator.dir),
                                      "MYIMAGE", str(_image(tmp_path))])
    assert result.exit_code == 0, result.output
    urn = result.output.split()[-1]
    assert urn == "urn:publicid:IDN+emulab.test+image+elasticslice//MYIMAGE"
    look = as_root("mytool > /out 2>&1; cat /opt/app/data.txt >> /out 2>&1; "
                   "cat /root/.settings >> /out 2>&1; echo more >> /root/.settings; "
                   f"ls -A {emulator.dir}/images >> /out 2>&1; true")
    s = Session(emulator)
    urn_slice, cred, _ = s.create()
    mine = add_node(s, urn_slice, cred, "custom", look, diskimage=urn)
    stock = add_node(s, urn_slice, cred, "stock", look)
    for cid in ("custom", "stock"):
        assert exited(s, urn_slice, cred, cid)["execute_status"] == 0
    out = (mine / "root" / "out").read_text().splitlines()
    assert out[:3] == ["tool of the image", "image data", "mine"]
    assert not any("MYIMAGE" in line for line in out)  # the host's copy: not in sight
    seen = (stock / "root" / "out").read_text()
    assert "tool of the image" not in seen and "image data" not in seen and "mine" not in seen
    # a node writes its own copy of the image's writable files, never the image
    assert (emulator.dir / "images" / "MYIMAGE" / "root" / ".settings").read_text() == "mine\n"


def test_custom_images_are_advertised_and_listed(emulator, tmp_path):
    runner = CliRunner()
    assert runner.invoke(cli, ["emulator", "image", "add", "--dir", str(emulator.dir),
                               "MYIMAGE", str(_image(tmp_path))]).exit_code == 0
    listed = runner.invoke(cli, ["emulator", "image", "list", "--dir", str(emulator.dir)])
    assert "MYIMAGE" in listed.output and "ELASTICSLICE-PILOT" in listed.output
    s = Session(emulator)
    ad = ok(s.cm.DiscoverResources({"credentials": [s.user_cred], "rspec_version": "3"}))
    assert "image+elasticslice//MYIMAGE" in ad and "image+emulab-ops//UBUNTU22-64-STD" in ad


def test_a_bad_image_is_one_line_and_exit_1(emulator, tmp_path):
    runner = CliRunner()
    source = _image(tmp_path)
    (source / "proc").mkdir()
    result = runner.invoke(cli, ["emulator", "image", "add", "--dir", str(emulator.dir),
                                 "BAD", str(source)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "/proc" in result.output
    result = runner.invoke(cli, ["emulator", "image", "add", "--dir", str(emulator.dir),
                                 "no spaces", str(tmp_path)])
    assert result.exit_code == 1 and "image name" in result.output


def _emulator_dir(emulator_pki, tmp_path):
    """An emulator directory (no server: ``image add`` and ``list`` work offline)."""
    d = tmp_path / "emu"
    shutil.copytree(emulator_pki, d)
    return d


def test_image_list_shows_each_images_python3_and_arch_the_stock_ones_too(emulator_pki,
                                                                          tmp_path):
    d = _emulator_dir(emulator_pki, tmp_path)
    runner = CliRunner()
    for args in (["MYIMAGE", str(_image(tmp_path))], ["ARM", "--arch", "aarch64"],
                 ["SYSPY", "--python", "/usr/bin/python3"]):
        result = runner.invoke(cli, ["emulator", "image", "add", "--dir", str(d), *args])
        assert result.exit_code == 0, result.output
    stock = subprocess.run(["/usr/bin/python3", "-c", "import sys; print('%d.%d' % "
                            "sys.version_info[:2])"], capture_output=True, text=True,
                           check=True).stdout.strip()
    listed = runner.invoke(cli, ["emulator", "image", "list", "--dir", str(d), "--json"])
    data = json.loads(listed.stdout)
    assert data["stock"] == {"name": "(stock)", "urn": "", "python3": stock,
                             "arch": HOST_ARCH, "interpreter": None}
    seen = {i["name"]: (i["python3"], i["arch"], i["interpreter"]) for i in data["images"]}
    assert seen == {"ARM": (stock, "aarch64", None), "MYIMAGE": (stock, HOST_ARCH, None),
                    "SYSPY": (stock, HOST_ARCH, "/usr/bin/python3"),
                    "ELASTICSLICE-PILOT": (stock, HOST_ARCH, None)}
    registry = json.loads((d / "images.json").read_text())
    assert registry["ARM"]["arch"] == "aarch64"
    assert registry["SYSPY"]["python"]["version"] == stock
    table = runner.invoke(cli, ["emulator", "image", "list", "--dir", str(d)]).stdout
    assert [line.split()[:3] for line in table.splitlines()] == [
        ["NAME", "PYTHON3", "ARCH"], ["(stock)", stock, HOST_ARCH], ["ARM", stock, "aarch64"],
        ["ELASTICSLICE-PILOT", stock, HOST_ARCH], ["MYIMAGE", stock, HOST_ARCH],
        ["SYSPY", stock, HOST_ARCH]]


@pytest.mark.parametrize("args, said", [
    (["--python", "{tmp}/nothing"], "--python {tmp}/nothing: no such file"),
    (["--python", "{tmp}/notes.txt"], "--python {tmp}/notes.txt: not executable"),
    (["--python", "{tmp}/script"], "--python {tmp}/script: not a Python 3 interpreter"),
    (["--python", "3.99"], "--python 3.99: no Python 3.99 on this machine"),
    (["--python", "/usr/bin/python3", "--arch", "sparc"], "--arch sparc: unknown architecture"),
    ([], "image BAD: give its folder (DIR), --python or --arch"),
], ids=["no-file", "not-executable", "not-python", "no-such-version", "arch", "nothing"])
def test_a_bad_python_or_arch_is_one_line_naming_it_and_exit_1(emulator_pki, tmp_path, args,
                                                               said):
    d = _emulator_dir(emulator_pki, tmp_path)
    (tmp_path / "notes.txt").write_text("not a program\n")
    (tmp_path / "script").write_text("#!/bin/sh\necho hello\n")
    (tmp_path / "script").chmod(0o755)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(cli, ["emulator", "image", "add", "--dir", str(d), "BAD", *args])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    said = said.replace("{tmp}", str(tmp_path))
    assert len(lines) == 1 and lines[0].startswith(f"Error: {said}"), result.stderr
    assert "BAD" not in json.loads((d / "images.json").read_text())
    assert not (d / "images" / "BAD").exists()
