"""`emulator init` input that used to be accepted (names with spaces in every URN) or to
end in an internal error (a directory that cannot be created)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli


@pytest.mark.parametrize("option, value, expected", [
    ("--domain", "bad domain", "[domain] invalid domain 'bad domain'"),
    ("--user", "x y", "[user] invalid user 'x y'"),
    ("--project", "", "[project] invalid project ''"),
])
def test_names_that_cannot_go_into_urns_are_refused_before_writing(tmp_path, option, value,
                                                                     expected):
    d = tmp_path / "emu"
    result = CliRunner().invoke(cli, ["emulator", "init", "--dir", str(d), option, value])
    assert result.exit_code == 1 and expected in result.output
    assert not d.exists()


def test_directory_that_cannot_be_created_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(cli, ["emulator", "init", "--dir", str(blocker / "emu")])
    assert result.exit_code == 1
    assert "cannot create the directory" in result.output
    assert "internal error" not in result.output
