"""Client commands: bad configs and bad arguments give one clear line and a non-zero exit."""
from __future__ import annotations

import configparser

from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.config import KNOWN


def test_missing_config_is_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["--config", str(tmp_path / "none.conf"), "getversion"])
    assert result.exit_code != 0
    assert "none.conf: config file not found" in result.output
    assert "Traceback" not in result.output


def test_missing_config_names_the_variable_and_init_not_a_repo_path(tmp_path):
    """It pointed at etc/elasticslice.conf.example, a path only a git clone has, and did not
    say where else the config may come from."""
    env = {"HOME": str(tmp_path), "ELASTICSLICE_CONFIG": ""}
    result = CliRunner().invoke(cli, ["getversion"], env=env)
    assert result.exit_code == 1
    line, = result.output.strip().splitlines()
    assert line.startswith(f"Error: {tmp_path}/.protogeni/elasticslice.conf: config file not found")
    assert "ELASTICSLICE_CONFIG" in line and "elasticslice emulator init" in line
    assert "etc/" not in line


def test_unknown_key_names_key_and_file(tmp_path):
    conf = tmp_path / "c.conf"
    conf.write_text("[protogeni]\ncertificat = x\n")
    result = CliRunner().invoke(cli, ["--config", str(conf), "sliver-status"])
    assert result.exit_code != 0
    assert f"{conf}: [certificat] unknown key" in result.output


def test_add_nodes_needs_a_positive_count(tmp_path):
    result = CliRunner().invoke(cli, ["add-nodes", "0"])
    assert result.exit_code == 2 and "N" in result.output


def test_every_contract_command_has_help():
    for command in ("getversion", "create-slice", "create-sliver", "sliver-status", "add-nodes",
                    "delete-nodes", "renew", "discover", "resolve", "delete-slice"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert result.exit_code == 0, command
        assert "Usage:" in result.output


def test_example_config_only_uses_known_keys(repo_root):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(repo_root / "etc" / "elasticslice.conf.example")
    assert set(parser["protogeni"]) <= set(KNOWN)
