"""`elasticslice nodes` / `manifest` and `--wait`, against the emulator (real TLS, real boots).

Regressions of issue 12: no command showed the nodes you got (the manifest was printed by
none), and waiting for nodes meant running `sliver-status` by hand.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from elasticslice.rspec import RSpecType, parse, validate
from tests.helpers import REPO

from .helpers import genilib_request, run_cli, sliver_status

SLOW_BOOT = {"boot_delay": 600.0}  # nodes that stay notready for the whole test


def _sliver(emu, tmp_path, *names, wait=True):
    rspec = tmp_path / "req.xml"
    rspec.write_text(genilib_request(*names))
    run_cli(emu, "create-slice")
    return run_cli(emu, "create-sliver", str(rspec), *(["--wait", "--timeout", "120"] if wait
                                                      else []))


def test_nodes_after_create_sliver_shows_ssh_lines_that_match_the_manifest(emu, tmp_path):
    _sliver(emu, tmp_path, "node0", "node1")
    manifest_text = run_cli(emu, "manifest").stdout
    manifest = parse(manifest_text)
    assert manifest.type is RSpecType.MANIFEST and validate(manifest_text) == []
    table = run_cli(emu, "nodes").stdout.splitlines()
    assert table[0].split() == ["CLIENT_ID", "STATUS", "HOSTNAME", "IP", "SSH"]
    listing = json.loads(run_cli(emu, "nodes", "--json").stdout)
    assert listing["slice_urn"].endswith("+slice+elastic")
    by_id = {n["client_id"]: n for n in listing["nodes"]}
    assert set(by_id) == {"node0", "node1"}
    for node in manifest.nodes:
        login = node.logins[0]
        ssh = f"ssh -p {login.port} {login.username}@{login.hostname}"
        shown = by_id[node.client_id]
        assert (shown["ssh"], shown["hostname"], shown["ipv4"], shown["status"]) == \
            (ssh, node.hostname, node.ipv4, "ready")
        assert login.username == "elastic" and login.port == 22  # the user of the config
        row = next(line for line in table if line.split()[0] == node.client_id)
        assert row.split()[1:4] == ["ready", node.hostname, node.ipv4] and row.endswith(ssh)


def test_manifest_output_feeds_rspec_show_as_the_readme_says(emu, tmp_path):
    _sliver(emu, tmp_path, "a", wait=False)
    (tmp_path / "manifest.xml").write_text(run_cli(emu, "manifest").stdout)
    shown = json.loads(run_cli(emu, "rspec", "show", "--json", str(tmp_path / "manifest.xml"))
                       .stdout)
    assert shown["type"] == "manifest" and shown["nodes"][0]["logins"][0]["port"] == 22


@pytest.mark.parametrize("emu_options", [{"boot_delay": 1.0}])
def test_create_sliver_wait_returns_once_every_node_is_ready(emu, tmp_path):
    result = _sliver(emu, tmp_path, "n0", "n1")
    assert "2 node(s) ready" in result.stdout
    assert "waiting: 2/2 ready" in result.stderr.splitlines()[-1]
    assert all(n["status"] == "ready" for n in sliver_status(emu)["nodes"])  # already, no polling
    added = run_cli(emu, "add-nodes", "1", "--wait", "--timeout", "120")
    assert "added 1 node(s): node-0" in added.stdout and "1 node(s) ready" in added.stdout
    assert "waiting: 1/1 ready" in added.stderr  # only the new node is waited for
    assert sliver_status(emu)["status"] == "ready"


@pytest.mark.parametrize("emu_options", [SLOW_BOOT])
def test_wait_times_out_with_one_line_and_exit_3(emu, tmp_path):
    rspec = tmp_path / "req.xml"
    rspec.write_text(genilib_request("n0", "n1"))
    run_cli(emu, "create-slice")
    for args in (["create-sliver", str(rspec)], ["sliver-status"], ["add-nodes", "1"]):
        result = run_cli(emu, *args, "--wait", "--timeout", "0.5", ok=False)
        assert result.exit_code == 3, result.output
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: timed out after 0.5s waiting for the nodes: 0/")
        assert "notready" in last and "Traceback" not in result.output
    assert [n["status"] for n in sliver_status(emu)["nodes"]] == ["notready"] * 3


@pytest.mark.parametrize("emu_options", [{"boot_delay": 0.05, "boot_failure_rate": 1.0}])
def test_wait_stops_at_a_failed_node_with_exit_1(emu, tmp_path):
    rspec = tmp_path / "req.xml"
    rspec.write_text(genilib_request("n0"))
    run_cli(emu, "create-slice")
    result = run_cli(emu, "create-sliver", str(rspec), "--wait", "--timeout", "120", ok=False)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == \
        "Error: node n0 failed: boot failed (injected fault) (0/1 ready, 1 failed)"
    assert "failed" in run_cli(emu, "nodes").stdout


def test_usage_and_sliver_errors_are_one_line(emu, tmp_path):
    timeout_alone = run_cli(emu, "sliver-status", "--timeout", "5", ok=False)
    assert timeout_alone.exit_code == 2 and "--timeout needs --wait" in timeout_alone.output
    bad_image = run_cli(emu, "add-nodes", "1", "--disk-image", "URN", ok=False)
    assert bad_image.exit_code == 2 and "disk image 'URN' is not an image URN" in \
        bad_image.output
    run_cli(emu, "create-slice")
    for command in ("nodes", "manifest"):
        none = run_cli(emu, command, ok=False)
        assert none.exit_code == 1 and "SEARCHFAILED" in none.output
        assert len(none.output.strip().splitlines()) == 1


def test_nodes_json_parses_from_a_real_process(emu, tmp_path):
    _sliver(emu, tmp_path, "x", wait=False)
    out = subprocess.run([sys.executable, "-m", "elasticslice.cli", "--config",
                          str(emu.config_path), "sliver-status", "--wait", "--timeout", "120"],
                         capture_output=True, text=True, cwd=REPO, timeout=180)
    assert out.returncode == 0 and "status: ready" in out.stdout and "waiting:" in out.stderr
    listing = subprocess.run([sys.executable, "-m", "elasticslice.cli", "--config",
                              str(emu.config_path), "nodes", "--json"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert [n["client_id"] for n in json.loads(listing.stdout)["nodes"]] == ["x"]
