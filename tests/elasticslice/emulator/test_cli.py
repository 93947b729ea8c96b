"""`elasticslice emulator ...`: init, serve (a real subprocess), admin commands, report."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

from click.testing import CliRunner

import pytest

from elasticslice.cli import cli
from elasticslice.config import load_config
from elasticslice.rpc import pki
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session


@pytest.mark.slow
def test_init_writes_pki_and_a_working_client_config(tmp_path):
    d = tmp_path / "emu"
    result = CliRunner().invoke(cli, ["emulator", "init", "--dir", str(d), "--port", "0"])
    assert result.exit_code == 0, result.output
    for name in ("ca.pem", "ca-key.pem", "server.pem", "user.pem", "password", "cm.pem",
                 "elasticslice.conf", "admin.pem"):
        assert (d / name).exists(), name
    assert oct((d / "user.pem").stat().st_mode & 0o777) == "0o600"
    assert "ENCRYPTED" in (d / "user.pem").read_text()
    cert = pki.load_pem_cert((d / "user.pem").read_bytes())
    assert pki.urn_from_certificate(cert) == "urn:publicid:IDN+emulab.test+user+elastic"
    assert pki.aia_url_from_certificate(cert).endswith("/protogeni/xmlrpc/sa")
    cfg = load_config(d / "elasticslice.conf")
    assert cfg.cm_urls[0].endswith("/protogeni/xmlrpc/cm") and cfg.ca_bundle == d / "ca.pem"
    again = CliRunner().invoke(cli, ["emulator", "init", "--dir", str(d)])
    assert again.exit_code == 1 and "already an emulator directory" in again.output


def test_admin_commands_need_a_running_server(tmp_path, emulator_pki):
    d = tmp_path / "emu"
    shutil.copytree(emulator_pki, d)
    result = CliRunner().invoke(cli, ["emulator", "revoke", "--dir", str(d), "ms0101"])
    assert result.exit_code == 1 and "no emulator is running" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["emulator", "report", "--dir", str(tmp_path)])
    assert result.exit_code == 1 and "not an emulator directory" in result.output


@pytest.mark.slow
def test_serve_revoke_load_report_and_clean_shutdown(tmp_path, emulator_pki):
    d = tmp_path / "emu"
    shutil.copytree(emulator_pki, d)
    proc = subprocess.Popen(
        [sys.executable, "-m", "elasticslice.cli", "emulator", "serve", "--dir", str(d),
         "--port", "0", "--boot-delay", "0.1", "--notify-interval", "0.2", "--max-wait", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("emulator serving https://127.0.0.1:"), line
        wait_for(lambda: (d / "server.json").exists(), timeout=20, what="server.json")
        info = json.loads((d / "server.json").read_text())

        class Emu:
            dir = d
            url = info["url"]
        s = Session(Emu)
        urn, cred, _ = s.create()
        node = next(iter(s.status(urn, cred)["details"].values()))["component_urn"]
        node_id = node.rsplit("+", 1)[-1]
        runner = CliRunner()
        result = runner.invoke(cli, ["emulator", "revoke", "--dir", str(d), node_id])
        assert result.exit_code == 0 and f"{node_id}: reclaiming" in result.output
        result = runner.invoke(cli, ["emulator", "load", "--dir", str(d), "--busy", "3"])
        assert result.exit_code == 0 and "3 nodes" in result.output

        def reclaimed():
            out = runner.invoke(cli, ["emulator", "report", "--dir", str(d), "--json"])
            events = json.loads(out.output)["reclamations"]
            return events and events[0]["outcome"] != "pending" and events
        (event,) = wait_for(reclaimed, timeout=20, what="reclamation in report")
        assert event["node_id"] == node_id and event["outcome"] == "forced"
        text = runner.invoke(cli, ["emulator", "report", "--dir", str(d)]).output
        assert node_id in text and "forced" in text
        status = json.loads(runner.invoke(cli, ["emulator", "status", "--dir", str(d),
                                                "--json"]).output)
        assert status["tenant_target"] == 3
        assert sum(row["tenant"] for row in status["pool"].values()) == 3
        table = runner.invoke(cli, ["emulator", "status", "--dir", str(d)]).output
        assert "m510" in table and "other tenants want 3 nodes" in table
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "emulator stopped" in out and "Traceback" not in err
    assert not (d / "server.json").exists()


def test_serve_bad_input_is_one_clear_line(tmp_path, emulator):
    runner = CliRunner()
    result = runner.invoke(cli, ["emulator", "serve", "--dir", str(tmp_path / "nothing")])
    assert result.exit_code == 1 and "not an emulator directory" in result.output
    result = runner.invoke(cli, ["emulator", "serve", "--dir", str(emulator.dir),
                                 "--fault-rate", "2"])
    assert result.exit_code == 2 and "--fault-rate" in result.output
    busy_port = str(emulator.server.port)
    other = tmp_path / "other"
    shutil.copytree(emulator.dir, other, ignore=shutil.ignore_patterns("state.db*", "serve.lock"))
    result = runner.invoke(cli, ["emulator", "serve", "--dir", str(other),
                                 "--port", busy_port])
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{busy_port}" in result.output
    assert "serve --port 0 picks a free port" in result.output
    assert "Traceback" not in result.output
    bad = tmp_path / "inv.ini"
    bad.write_text("[m400]\ncount = x\n")
    result = runner.invoke(cli, ["emulator", "serve", "--dir", str(other),
                                 "--inventory", str(bad)])
    assert result.exit_code == 1 and "m400.count" in result.output
