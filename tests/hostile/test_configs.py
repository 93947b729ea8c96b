"""Hostile config files: the client's [protogeni] (through `getversion`) and the manager's
[manager]/[endpoint] (through `manage --once`, against the package's emulator). Each is one
line naming the file, the key and what is wrong; exit 1; nothing is read without end (a
device in place of a file), and the managed slice of the package is untouched."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from tests.hostile.helpers import ManagedSlice, corpus, one_line_error

CONFIGS = corpus("configs")


def instantiate(template: Path, managed: ManagedSlice, tmp_path: Path) -> tuple[Path, str]:
    """The corpus file with its placeholders filled (the emulator's files and port, a state
    directory of this test), written 0600 like a real config."""
    fill = {b"@EMU@": str(managed.emulator.dir).encode(),
            b"@PORT@": str(managed.emulator.server.port).encode(),
            b"@STATE@": str(tmp_path).encode()}
    data = template.read_bytes()
    for placeholder, value in fill.items():
        data = data.replace(placeholder, value)
    path = tmp_path / template.name
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path, fill[b"@EMU@"].decode()


@pytest.mark.parametrize("template, expected", CONFIGS, ids=[p.name for p, _ in CONFIGS])
def test_hostile_config_is_one_line_naming_file_and_key(
        managed: ManagedSlice, tmp_path: Path, template: Path, expected: str) -> None:
    path, emu = instantiate(template, managed, tmp_path)
    command = ["manage", "--once"] if template.name.startswith(("manager", "endpoint")) \
        else ["getversion"]
    result = CliRunner().invoke(cli, ["--config", str(path), *command])
    line = one_line_error(result.output)
    assert result.exit_code == 1, result.output
    assert line.startswith(f"Error: {path}: ") and expected.replace("@EMU@", emu) in line, line
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").iterdir())
    managed.assert_intact()


def test_the_config_itself_a_device_or_a_fifo_is_one_line(tmp_path: Path) -> None:
    # broke: --config /dev/zero read without end (the machine ran out of memory), a FIFO hung
    fifo = tmp_path / "fifo.conf"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        result = CliRunner().invoke(cli, ["--config", path, "getversion"])
        assert result.exit_code == 1
        assert "is not a regular file" in one_line_error(result.output)
