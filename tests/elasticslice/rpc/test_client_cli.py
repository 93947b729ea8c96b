"""The client commands against the emulator: CliRunner for the flow, a real subprocess too."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys


from tests.helpers import REPO, wait_for

from .helpers import genilib_request, run_cli, sliver_status


def test_cli_slice_life(emu, tmp_path):
    rspec = tmp_path / "req.xml"
    rspec.write_text(genilib_request("node0", "node1"))
    version = json.loads(run_cli(emu, "getversion").output)
    assert str(version["sa"]["version"]) == "1.01" and version["cm"]["version"]["api"] == 2
    assert "registered" in run_cli(emu, "create-slice", "--hours", "3").output
    assert "2 node(s)" in run_cli(emu, "create-sliver", str(rspec)).output

    ready = wait_for(lambda: (s := sliver_status(emu))["status"] == "ready" and s, timeout=20,
                     what="sliver ready")
    assert {n["client_id"] for n in ready["nodes"]} == {"node0", "node1"}
    assert {"status", "state", "component_id"} <= set(ready["nodes"][0])
    text = run_cli(emu, "sliver-status").output
    assert "status: ready" in text and "node0" in text

    out = run_cli(emu, "add-nodes", "2", "--hardware-type", "m400").output
    assert "added 2 node(s): node-0 node-1" in out
    wait_for(lambda: (s := sliver_status(emu))["status"] == "ready" and len(s["nodes"]) == 4,
             timeout=20, what="four nodes ready")
    added = [n["component_id"].rsplit("+", 1)[-1] for n in sliver_status(emu)["nodes"]
             if n["client_id"].startswith("node-")]
    assert all(name.startswith("ms01") for name in added), added  # free m400s, by name
    short = run_cli(emu, "add-nodes", "11", "--hardware-type", "xl170", ok=False)
    assert short.exit_code == 1 and "Traceback" not in short.output
    assert re.search(r"--hardware-type xl170: \d+ free node\(s\) of that type at the CM, "
                     r"11 asked for", short.output), short.output  # (one of ours may be one)
    assert len(short.output.strip().splitlines()) == 1
    assert "deleted 2" in run_cli(emu, "delete-nodes", "node0", "node-1").output
    assert {n["client_id"] for n in sliver_status(emu)["nodes"]} == {"node1", "node-0"}

    assert "renewed until" in run_cli(emu, "renew", "--hours", "5").output
    resolved = json.loads(run_cli(emu, "resolve").output)
    assert resolved["urn"].endswith("+slice+elastic")
    summary = json.loads(run_cli(emu, "discover", "--available", "--json").output)
    assert summary["nodes"] and all(n["available"] for n in summary["nodes"])
    assert "<rspec" in run_cli(emu, "discover").output

    assert "deleted" in run_cli(emu, "delete-slice").output
    gone = run_cli(emu, "sliver-status", ok=False)
    assert gone.exit_code == 1
    assert "SEARCHFAILED" in gone.output and "Traceback" not in gone.output


def test_cli_errors_are_one_line_with_code_name(emu, tmp_path):
    rspec = tmp_path / "req.xml"
    rspec.write_text(genilib_request("a"))
    run_cli(emu, "create-slice")
    run_cli(emu, "create-sliver", str(rspec))
    again = run_cli(emu, "create-sliver", str(rspec), ok=False)
    assert again.exit_code == 1
    lines = [line for line in again.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "REFUSED" in lines[0] and "CreateSliver" in lines[0]
    bad = tmp_path / "bad.xml"
    bad.write_text("<rspec")
    broken = run_cli(emu, "create-sliver", str(bad), ok=False)
    assert broken.exit_code == 1 and "bad.xml" in broken.output
    unknown = run_cli(emu, "delete-nodes", "nope", ok=False)
    assert unknown.exit_code == 1 and "BADARGS" in unknown.output
    missing_cm = run_cli(emu, "sliver-status", "--cm", "wisc", ok=False)
    assert missing_cm.exit_code == 1 and "[cm_urls]" in missing_cm.output


def test_cli_as_a_real_process(emu, tmp_path):
    rspec = tmp_path / "req.xml"
    rspec.write_text(genilib_request("solo"))
    env = {**os.environ, "ELASTICSLICE_CONFIG": str(emu.config_path),
           "PYTHONPATH": str(REPO)}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "elasticslice.cli", *args], env=env,
                              capture_output=True, text=True, timeout=60)

    for args in (("create-slice",), ("create-sliver", str(rspec))):
        proc = run(*args)
        assert proc.returncode == 0, proc.stderr
    status = wait_for(lambda: (p := run("sliver-status", "--json")).returncode == 0
                      and json.loads(p.stdout)["status"] == "ready" and json.loads(p.stdout),
                      timeout=30, what="ready via subprocess")
    assert status["nodes"][0]["client_id"] == "solo"
    proc = run("create-slice")
    assert proc.returncode == 1 and "ERROR" in proc.stderr and "Traceback" not in proc.stderr
    assert (emu.dir / "password").read_text().strip() not in proc.stderr
