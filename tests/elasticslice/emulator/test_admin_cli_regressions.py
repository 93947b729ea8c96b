"""Admin commands: input and set-ups that used to end in an internal error."""
from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from elasticslice.cli import cli


def test_load_with_a_count_beyond_xmlrpc_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["emulator", "load", "--dir", str(tmp_path),
                                      "--busy", "99999999999"])
    assert result.exit_code == 2 and "Invalid value for '--busy'" in result.output
    assert "internal error" not in result.output


def test_missing_admin_certificate_is_one_line(tmp_path, emulator_pki):
    d = tmp_path / "emu"
    shutil.copytree(emulator_pki, d)
    (d / "admin.pem").unlink()
    (d / "server.json").write_text(json.dumps({"url": "https://127.0.0.1:1/protogeni/xmlrpc"}))
    result = CliRunner().invoke(cli, ["emulator", "status", "--dir", str(d)])
    assert result.exit_code == 1
    assert "cannot load the admin certificate" in result.output
    assert "internal error" not in result.output
