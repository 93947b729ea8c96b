"""Client commands against the emulator: behaviour that used to be wrong."""
from __future__ import annotations

import json

from click.testing import CliRunner

from elasticslice.cli import cli
from tests.helpers import wait_for

from .helpers import genilib_request


def _run(emu, *args):
    result = CliRunner().invoke(cli, ["--config", str(emu.config_path), *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_delete_nodes_with_a_repeated_client_id_deletes_and_reports_it_once(emu, tmp_path):
    rspec = tmp_path / "req.xml"
    rspec.write_text(genilib_request("a", "b", "c"))
    _run(emu, "create-slice")
    _run(emu, "create-sliver", str(rspec))
    wait_for(lambda: json.loads(_run(emu, "sliver-status", "--json"))["status"] == "ready",
             timeout=20, what="sliver ready")
    out = _run(emu, "delete-nodes", "a", "a")
    assert out.strip() == "deleted 1 node(s): a"
    nodes = json.loads(_run(emu, "sliver-status", "--json"))["nodes"]
    assert sorted(n["client_id"] for n in nodes) == ["b", "c"]


def test_commands_on_an_unregistered_slice_say_how_to_register_it(emu, monkeypatch):
    monkeypatch.setenv("ELASTICSLICE_SLICE_NAME", "never")
    for command in (["sliver-status"], ["add-nodes", "1"], ["delete-slice"]):
        result = CliRunner().invoke(cli, ["--config", str(emu.config_path), *command])
        assert result.exit_code == 1, command
        assert "SEARCHFAILED" in result.output and "elasticslice create-slice" in result.output
        assert len(result.output.strip().splitlines()) == 1
