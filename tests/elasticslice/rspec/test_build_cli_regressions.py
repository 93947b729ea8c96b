"""`rspec build` options that used to be accepted silently."""
from __future__ import annotations

from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.rspec import parse


def test_tarball_that_is_not_a_url_is_refused():
    result = CliRunner().invoke(cli, ["rspec", "build", "--tarball", "agent.tar.gz"])
    assert result.exit_code == 2
    assert "--tarball 'agent.tar.gz': not a URL" in result.output


def test_tarball_url_with_port_and_path_still_splits():
    result = CliRunner().invoke(cli, ["rspec", "build", "--tarball",
                                      "https://h:8080/a.tgz:/local"])
    assert result.exit_code == 0
    assert parse(result.output).nodes[0].installs == [("https://h:8080/a.tgz", "/local")]


def test_shell_without_startup_is_refused():
    result = CliRunner().invoke(cli, ["rspec", "build", "--shell", "bash"])
    assert result.exit_code == 2 and "--shell needs --startup" in result.output
