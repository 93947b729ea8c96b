"""Custom images, as CloudLab users make them from a node with their software installed:
``emulator image add NAME DIR`` lays DIR over the stock image for the nodes booted from it,
and no other node sees its files."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator import isolate
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
