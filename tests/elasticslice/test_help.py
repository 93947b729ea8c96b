"""Every command and group of `elasticslice` explains itself: a description, and help for
every option (`emulator init --project` used to have none)."""
from __future__ import annotations

import click
from click.testing import CliRunner

from elasticslice.cli import cli


def _walk(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _walk(command, (*path, name))


def test_every_command_and_option_has_help():
    seen = 0
    for path, command in _walk(cli):
        result = CliRunner().invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, path
        assert (command.help or "").strip(), f"{' '.join(path)}: no description"
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert (param.help or "").strip(), f"{' '.join(path)} {param.opts[0]}: no help"
        seen += 1
    assert seen >= 20


def test_emulator_group_help_shows_how_to_start():
    result = CliRunner().invoke(cli, ["emulator", "--help"])
    assert "emulator init  --dir" in result.output and "emulator serve --dir" in result.output
