"""The top-level CLI frame: help, version, and one-line errors."""
from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from elasticslice.cli import cli


def test_help_lists_options():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "--config" in result.output and "--debug" in result.output


def test_unknown_command_is_one_clear_line():
    proc = subprocess.run([sys.executable, "-m", "elasticslice.cli", "no-such-command"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "No such command" in proc.stderr
    assert "Traceback" not in proc.stderr
