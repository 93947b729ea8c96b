"""The top-level CLI frame: help, version, and one-line errors."""
from __future__ import annotations

import os
import subprocess
import sys

from click.testing import CliRunner

import pytest

from elasticslice.cli import cli


def test_help_lists_options():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "--config" in result.output and "--debug" in result.output


@pytest.mark.slow
def test_unknown_command_is_one_clear_line():
    proc = subprocess.run([sys.executable, "-m", "elasticslice.cli", "no-such-command"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "No such command" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_output_into_a_closed_pipe_is_not_an_internal_error(tmp_path):
    """`elasticslice ... | head` used to end in `Error: internal error: BrokenPipeError`."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "elasticslice.cli", "rspec", "build",
                               "--count", "50"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
