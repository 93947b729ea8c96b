"""`elasticslice rspec build|validate|show`: the contract other checks rely on."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.rspec import DEFAULT_MAX_BYTES, parse
from tests.helpers import SHARED

IMAGE = "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD"
V3 = "http://www.geni.net/resources/rspec/3"
MANIFEST_V2 = SHARED / "protogeni" / "rspec-schemas" / "2" / "examples" / "manifest.xml"


def run(*args: str):
    return CliRunner().invoke(cli, ["rspec", *args])


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    valid = tmp_path / "valid.xml"
    valid.write_text(run("build", "--count", "2", "--image", IMAGE).output)
    invalid = tmp_path / "invalid.xml"
    invalid.write_text(f'<rspec xmlns="{V3}" type="request">\n\n<node/>\n</rspec>\n')
    hostile = tmp_path / "hostile.xml"
    hostile.write_text('<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n<r>&x;</r>')
    broken = tmp_path / "broken.xml"
    broken.write_text(f'<rspec xmlns="{V3}" type="request"><node client_id="a">')
    return {"valid": valid, "invalid": invalid, "hostile": hostile, "broken": broken,
            "missing": tmp_path / "missing.xml", "oversize": _oversize(tmp_path)}


def _oversize(tmp_path: Path) -> Path:
    path = tmp_path / "oversize.xml"
    with open(path, "wb") as handle:  # sparse: no 64 MiB written to disk
        handle.truncate(DEFAULT_MAX_BYTES + 4096)
    return path


def test_build_prints_a_request_with_every_option() -> None:
    result = run("build", "--count", "3", "--prefix", "worker-", "--hardware-type", "d430",
                 "--image", IMAGE, "--lan", "lan0", "--multiplex", "--startup", "/local/go.sh",
                 "--shell", "bash", "--tarball", "https://example.org/a.tgz:/local",
                 "--tarball", "https://example.org/b.tgz", "--routable-ip")
    assert result.exit_code == 0, result.output
    rspec = parse(result.output)
    assert [n.client_id for n in rspec.nodes] == ["worker-0", "worker-1", "worker-2"]
    node = rspec.nodes[2]
    assert (node.hardware_type, node.disk_image, node.sliver_type) == ("d430", IMAGE, "raw-pc")
    assert node.executes == [("bash", "/local/go.sh")]
    assert node.installs == [("https://example.org/a.tgz", "/local"),
                             ("https://example.org/b.tgz", "/")]
    assert node.routable_control_ip is True
    (lan,) = rspec.links
    assert lan.client_id == "lan0" and lan.interfaces == [f"worker-{i}:if0" for i in range(3)]
    assert lan.link_multiplexing is True and lan.vlan_tagging is True


@pytest.mark.parametrize("value,install", [
    ("https://example.org/a.tgz:/local", ("https://example.org/a.tgz", "/local")),
    ("https://example.org/a.tgz", ("https://example.org/a.tgz", "/")),
    ("http://example.org:8080/a.tgz", ("http://example.org:8080/a.tgz", "/")),
    ("http://example.org:8080/a.tgz:/opt/x", ("http://example.org:8080/a.tgz", "/opt/x")),
])
def test_build_tarball_url_and_path(value: str, install: tuple[str, str]) -> None:
    assert parse(run("build", "--tarball", value).output).nodes[0].installs == [install]


def test_build_defaults_to_one_plain_node() -> None:
    rspec = parse(run("build").output)
    assert [(n.client_id, n.sliver_type, n.routable_control_ip) for n in rspec.nodes] == \
        [("node-0", "raw-pc", False)]
    assert rspec.links == []


def test_build_refuses_multiplex_without_lan() -> None:
    result = run("build", "--multiplex")
    assert result.exit_code == 2 and "--multiplex needs --lan" in result.output


def test_validate_exit_codes(files) -> None:
    ok = run("validate", str(files["valid"]))
    assert ok.exit_code == 0 and f"{files['valid']}: valid" in ok.output
    bad = run("validate", str(files["valid"]), str(files["invalid"]))
    assert bad.exit_code == 1
    assert f"{files['invalid']}:3: " in bad.stderr and "client_id" in bad.stderr
    for name in ("hostile", "broken", "missing", "oversize"):
        result = run("validate", str(files["valid"]), str(files["invalid"]), str(files[name]))
        assert result.exit_code == 2, name
        assert str(files[name]) in result.stderr
        assert "Traceback" not in result.output
    assert "DOCTYPE" in run("validate", str(files["hostile"])).stderr
    assert "cannot read" in run("validate", str(files["missing"])).stderr


def test_show_table_and_json() -> None:
    table = run("show", str(MANIFEST_V2))
    assert table.exit_code == 0
    assert "manifest (v2), 2 nodes, 1 links" in table.output
    assert "pc17.emulab.net:22" in table.output and "center" in table.output
    data = json.loads(run("show", str(MANIFEST_V2), "--json").output)
    assert data["type"] == "manifest"
    assert [n["client_id"] for n in data["nodes"]] == ["left", "right"]
    assert data["nodes"][0]["interfaces"] == [{"client_id": "left:if0", "ip": None,
                                               "mac": "13:11:22:33:44:55"}]
    assert data["links"][0]["interfaces"] == ["left:if0", "right:if0"]


def test_show_advertisement_counts() -> None:
    ad = SHARED / "protogeni" / "rspec-schemas" / "2" / "examples" / "type-relation.xml"
    result = run("show", str(ad))
    assert "HARDWARE TYPE" in result.output and "pc3000" in result.output
    data = json.loads(run("show", str(ad), "--json").output)
    assert data["total_by_type"] == {"pc": 3, "pc3000": 2, "pc600": 1}


@pytest.mark.parametrize("name,fragment", [("hostile", "DOCTYPE"), ("broken", "not well-formed"),
                                           ("missing", "cannot read"),
                                           ("oversize", "larger than the limit")])
def test_show_bad_input_is_one_line(files, name, fragment) -> None:
    result = run("show", str(files[name]))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and str(files[name]) in lines[0]
    assert "root:" not in result.output


@pytest.mark.slow
def test_real_subprocess_build_validate_show(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "elasticslice.cli", "rspec"]
    built = subprocess.run(cmd + ["build", "--count", "4", "--lan", "lan0", "--image", IMAGE],
                           capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    path = tmp_path / "lan-4.xml"
    path.write_text(built.stdout)
    checked = subprocess.run(cmd + ["validate", str(path)], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0 and "valid" in checked.stdout
    shown = subprocess.run(cmd + ["show", "--json", "-"], input=built.stdout,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0
    assert len(json.loads(shown.stdout)["nodes"]) == 4
    hostile = tmp_path / "h.xml"
    hostile.write_text('<!DOCTYPE r SYSTEM "http://example.org/x.dtd"><r/>')
    refused = subprocess.run(cmd + ["validate", str(hostile)], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2
    assert "DOCTYPE" in refused.stderr and "Traceback" not in refused.stderr
