"""Hostile workload files for `troy run`: each is refused before anything runs, with one line
naming the file and the place (a JSON path, a task, a line and column), exit status 1."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers import REPO
from tests.hostile.helpers import corpus, one_line_error
from troy.cli import cli

WORKLOADS = corpus("workloads")


@pytest.mark.parametrize("path, expected", WORKLOADS, ids=[p.name for p, _ in WORKLOADS])
def test_hostile_workload_is_one_line_naming_file_and_place(path: Path, expected: str,
                                                            tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["run", str(path), "--timeout", "60",
                                      "--report", str(report)])
    line = one_line_error(result.output)
    assert result.exit_code == 1, result.output
    assert line.startswith(f"Error: {path}: ") and expected in line, line
    assert not report.exists()  # refused before anything ran


def test_deep_nesting_as_a_real_process_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"tasks": [{"id": "a", "executable": "/bin/true", "environment": '
                    + '{"A": ' * 50_000 + "1" + "}" * 50_000 + "}]}")
    run = subprocess.run([sys.executable, "-m", "troy.cli", "run", str(deep)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert one_line_error(run.stdout + run.stderr).startswith(f"Error: {deep}: ")
