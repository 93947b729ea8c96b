"""`emulator serve --background` / `--log-file` and `emulator stop`: the emulator used to run
in the foreground only, logging to the terminal, with nothing to stop it but Ctrl-C."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, process_alive, wait_for
from tests.hostile.netstat import listening, reachable_from_outside

pytestmark = pytest.mark.slow


def elasticslice(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICSLICE_")}
    return subprocess.run([sys.executable, "-m", "elasticslice.cli", *args],
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def emu_dir(emulator_pki: Path, tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "emu"
    shutil.copytree(emulator_pki, d)
    yield d
    try:  # whatever a failed test left running
        pid = json.loads((d / "server.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, KeyError):
        pass


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def documented_files() -> tuple[set[str], set[str]]:
    """The files docs/emulator.md says init writes, and those it says serve adds."""
    text = (REPO / "docs" / "emulator.md").read_text()
    section = text.split("## What `init` writes", 1)[1].split("\nOptions:", 1)[0]
    init_part, serve_part = section.split("`serve` adds:", 1)

    def names(part: str) -> set[str]:
        found = set()
        for row in re.findall(r"^\| ([^|]+) \|", part, flags=re.M):
            for name in re.findall(r"`([^`]+)`", row):
                found.add(name)
                if "(+ keys)" in row:
                    found.add(name.replace(".pem", "-key.pem"))
        return found - {"file"}
    return names(init_part), names(serve_part)


def files_in(d: Path) -> set[str]:
    return {p.name + ("/" if p.is_dir() else "") for p in d.iterdir()}


def test_background_emulator_serves_logs_requests_and_stop_ends_it(emu_dir: Path,
                                                                   tmp_path: Path) -> None:
    init_files, serve_files = documented_files()
    assert files_in(emu_dir) == init_files  # "What init writes" listed what serve writes
    log = tmp_path / "logs" / "emu.log"
    started = elasticslice("emulator", "serve", "--dir", str(emu_dir), "--port", "0",
                           "--background", "--log-file", str(log))
    assert started.returncode == 0, started.stderr
    info = json.loads((emu_dir / "server.json").read_text())
    pid, port = info["pid"], info["port"]
    assert started.stdout.splitlines() == [
        f"emulator serving {info['url']}/{{sa,cm,dynslice}} (pid {pid})",
        f"client config: {emu_dir / 'elasticslice.conf'}",
        f"log: {log}",
        f"stop with: elasticslice emulator stop --dir {emu_dir}"]
    assert process_alive(pid) and os.getsid(pid) == pid  # its own session: no terminal
    tmcd = int(info["node_config_url"].rsplit(":", 1)[1])  # what nodes' geni-get asks
    # the CM on loopback; geni-get's server where the nodes reach this machine (the
    # control address of the box's network, which only this machine and its nodes reach)
    assert listening(pid) == {("127.0.0.1", port), (info["control_address"], tmcd)}
    assert reachable_from_outside({info["control_address"]}) == set()

    version = elasticslice("--config", str(emu_dir / "elasticslice.conf"), "getversion")
    assert version.returncode == 0, version.stderr
    assert f"127.0.0.1:{port}" in version.stdout
    # the requests are in the log file, nothing of the server reached the caller's terminal
    wait_for(lambda: "/protogeni/xmlrpc/cm GetVersion 200" in log.read_text(), 30,
             what="the request in the log")
    assert "urn:publicid:IDN+emulab.test+user+elastic POST /protogeni/xmlrpc/sa GetVersion 200" \
        in log.read_text()
    assert started.stderr == ""
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    added = files_in(emu_dir) - init_files
    assert added == {"state.db", "state.db-wal", "state.db-shm", "server.json"}
    assert added - {"state.db-wal", "state.db-shm"} <= serve_files

    stopped = elasticslice("emulator", "stop", "--dir", str(emu_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"emulator stopped (pid {pid}, {info['url']})\n"
    assert not process_alive(pid)
    assert port_free(port)
    assert not (emu_dir / "server.json").exists()

    again = elasticslice("emulator", "stop", "--dir", str(emu_dir))
    assert again.returncode == 1
    assert again.stderr == f"Error: no emulator is running in {emu_dir}\n"


def test_the_background_variable_does_not_start_emulators_forever(emu_dir: Path) -> None:
    """ELASTICSLICE_EMULATOR_SERVE_BACKGROUND (click reads it like --background) must not
    reach the server it starts, which would start another one, and so on."""
    env = {"ELASTICSLICE_EMULATOR_SERVE_BACKGROUND": "1"}
    started = elasticslice("emulator", "serve", "--dir", str(emu_dir), "--port", "0", env=env)
    assert started.returncode == 0, started.stderr
    pid = json.loads((emu_dir / "server.json").read_text())["pid"]
    assert (emu_dir / "serve.log").exists()  # the default log, in the directory
    assert elasticslice("emulator", "stop", "--dir", str(emu_dir)).returncode == 0
    assert not process_alive(pid)


def test_a_stale_pid_is_not_signalled(emu_dir: Path) -> None:
    """An emulator killed with -9 leaves server.json behind; its pid may since belong to
    another program, which `stop` must leave alone."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        (emu_dir / "server.json").write_text(json.dumps(
            {"url": "https://127.0.0.1:1/protogeni/xmlrpc", "port": 1, "pid": other.pid}))
        stopped = elasticslice("emulator", "stop", "--dir", str(emu_dir))
        assert stopped.returncode == 1
        assert stopped.stderr == (f"Error: no emulator is running in {emu_dir} (removed a stale "
                                  f"server.json: its pid {other.pid} is gone or another "
                                  "program's)\n")
        assert other.poll() is None
        assert not (emu_dir / "server.json").exists()
    finally:
        other.kill()
        other.wait()


def test_a_background_emulator_that_cannot_start_says_why(emu_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = elasticslice("emulator", "serve", "--dir", str(emu_dir), "--port", str(port),
                               "--daemon")
    assert started.returncode == 1
    assert started.stderr == (f"Error: the emulator did not start: cannot listen on "
                              f"127.0.0.1:{port}: Address already in use (serve --port 0 picks "
                              f"a free port) (log: {emu_dir / 'serve.log'})\n")
    assert not (emu_dir / "server.json").exists()


def test_stop_outside_an_emulator_directory_is_one_line(tmp_path: Path) -> None:
    stopped = elasticslice("emulator", "stop", "--dir", str(tmp_path))
    assert stopped.returncode == 1
    assert stopped.stderr.count("\n") == 1 and "not an emulator directory" in stopped.stderr
