"""A misspelled ELASTICSLICE_* variable is named on stderr, with the closest known one."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from elasticslice.cli import cli
from elasticslice.envcheck import option_variables, unknown_variables, warn_unknown_variables

pytestmark = pytest.mark.slow


def run_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICSLICE_")}
    return subprocess.run([sys.executable, "-m", "elasticslice.cli", *args],
                          env={**base, "HOME": str(tmp_path), **env}, capture_output=True,
                          text=True, timeout=120)


def test_a_misspelled_variable_is_not_silently_ignored(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "rspec", "validate", "nosuch.xml", ELASTICSLICE_SLICE_NAM="exp2")
    warnings = [x for x in done.stderr.splitlines() if "ELASTICSLICE_SLICE_NAM" in x]
    assert len(warnings) == 1, done.stderr
    assert "WARNING" in warnings[0]
    assert "$ELASTICSLICE_SLICE_NAM is not a variable elasticslice reads" in warnings[0]
    assert "did you mean $ELASTICSLICE_SLICE_NAME?" in warnings[0]


def test_variables_elasticslice_reads_are_not_warned_about(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "rspec", "validate", "nosuch.xml",
                   ELASTICSLICE_SLICE_NAME="exp2",                   # a [protogeni] key
                   ELASTICSLICE_INTERVAL_ADD_NODES="30",            # a [manager] interval
                   ELASTICSLICE_ENDPOINT_PORT="0",                  # an [endpoint] key
                   ELASTICSLICE_EMULATOR_SERVE_BOOT_DELAY="0.2",    # an option, automatically
                   ELASTICSLICE_EMULATOR_DIR=str(tmp_path),         # an option's own envvar
                   ELASTICSLICE_NODE_ISOLATION="off",               # the emulator's switch
                   ELASTICSLICE_DELETE_NODES="ms0101")              # a delete command's
    assert "WARNING" not in done.stderr, done.stderr


def test_a_name_far_from_every_known_one_gets_no_guess() -> None:
    known = option_variables(cli, "ELASTICSLICE")
    assert "ELASTICSLICE_EMULATOR_SERVE_LOG_FILE" in known
    assert unknown_variables({"ELASTICSLICE_ZZZ": "1", "OTHER": "x"}, known) == [
        ("ELASTICSLICE_ZZZ", None)]


def test_each_variable_is_warned_about_once_per_process() -> None:
    env = {"ELASTICSLICE_RETRIS": "3"}
    first = warn_unknown_variables(cli, env=env)
    assert first == ["$ELASTICSLICE_RETRIS is not a variable elasticslice reads: ignored; "
                     "did you mean $ELASTICSLICE_RETRIES?"]
    assert warn_unknown_variables(cli, env=env) == []


def test_every_variable_the_code_reads_is_known() -> None:
    """A variable elasticslice reads (a literal name in its code, such as the emulator's
    ``ELASTICSLICE_NODE_NETWORK``) is never warned about as one it does not read."""
    import re
    root = Path(__file__).resolve().parents[2] / "elasticslice"
    names = {m for path in root.rglob("*.py")
             for m in re.findall(r"[\"'](ELASTICSLICE_[A-Z][A-Z0-9_]*[A-Z0-9])[\"']",
                                 path.read_text())}
    names.discard("ELASTICSLICE_PILOT_ENV")   # a here-document's delimiter (bootstrap.py)
    assert {"ELASTICSLICE_NODE_NETWORK", "ELASTICSLICE_NODE_ISOLATION"} <= names
    assert warn_unknown_variables(cli, env={n: "1" for n in names}) == []
