"""One emulator per directory: a second `serve` (or `init --force`) on a directory that a
running emulator serves used to start anyway, rewrite the first one's client config and
server.json with its own port, and on exit delete server.json: the first emulator went on
running but neither the client nor the admin commands could find it any more."""
from __future__ import annotations

import json

from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator import EmulatorServer
from elasticslice.emulator.adminclient import AdminClient


def test_second_serve_on_a_served_directory_is_refused_and_the_first_keeps_serving(emulator):
    conf_before = emulator.config_path.read_text()
    info_before = (emulator.dir / "server.json").read_text()
    result = CliRunner().invoke(cli, ["emulator", "serve", "--dir", str(emulator.dir),
                                      "--port", "0"])
    assert result.exit_code == 1
    assert "already serving this directory" in result.output
    assert json.loads(info_before)["url"] in result.output
    assert "Traceback" not in result.output
    assert emulator.config_path.read_text() == conf_before
    assert (emulator.dir / "server.json").read_text() == info_before
    assert "pool" in AdminClient(emulator.dir).call("Status")


def test_init_force_under_a_running_emulator_is_refused(emulator):
    result = CliRunner().invoke(cli, ["emulator", "init", "--dir", str(emulator.dir), "--force"])
    assert result.exit_code == 1 and "already serving this directory" in result.output
    assert (emulator.dir / "state.db").exists()
    assert "pool" in AdminClient(emulator.dir).call("Status")


def test_directory_is_free_again_after_stop(emulator):
    directory = emulator.dir
    emulator.server.stop()
    with EmulatorServer(directory, port=0, boot_delay=0.2) as again:
        emulator.server = again
        assert "pool" in AdminClient(directory).call("Status")
