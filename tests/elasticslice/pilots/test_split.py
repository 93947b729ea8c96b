"""`elasticslice run` split by trust, tried the way an attacker and a crash would: the
CloudLab key, its passphrase and the cluster CA's key are opened by the manager daemon's
process alone; the daemon never loads Dask or Parsl and holds no connection to the Dask
scheduler; what a node (or a stranger) sends to every port the daemon serves never runs
there as a pickle; and a SIGKILL of the daemon mid-run costs no unit and leaves no node.
Real processes against a real emulator."""
from __future__ import annotations

import json
import os
import pickle
import re
import socket
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from elasticslice.channel import socket_address
from tests.elasticslice.helpers import (FORKJOIN, RUN_TIMEOUT, nodes_in_slices,
                                        pilot_image_config, units)
from tests.helpers import process_alive, wait_for

pytestmark = pytest.mark.slow

#: a sitecustomize that logs every file each Python process opens (audit hook "open"),
#: one file per process: PID.opened
AUDIT = textwrap.dedent('''
    import os, sys
    _busy = []
    def _hook(event, args):
        if event != "open" or _busy or not args or not isinstance(args[0], (str, bytes)):
            return
        _busy.append(1)
        try:
            out = os.path.join(os.environ["OPEN_LOG_DIR"], f"{os.getpid()}.opened")
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(fd, os.fsencode(args[0]) + b"\\n")
            os.close(fd)
        except Exception:
            pass
        finally:
            _busy.pop()
    sys.addaudithook(_hook)
''')

class Marker:
    """Unpickled anywhere, it writes the file it names: proof that a pickle ran there."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (os.system, (f"echo ran-in-pid-$$ >> {self.path}",))

def run_env(tmp: Path, audit: bool = False) -> dict[str, str]:
    env = {**os.environ, "ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp / "cred-cache")}
    if audit:
        hooks = tmp / "hooks"
        hooks.mkdir()
        (hooks / "sitecustomize.py").write_text(AUDIT)
        (tmp / "opened").mkdir()
        env["PYTHONPATH"] = os.pathsep.join([str(hooks), env.get("PYTHONPATH", "")])
        env["OPEN_LOG_DIR"] = str(tmp / "opened")
    return env

def start_run(emulator: Any, tmp: Path, state_dir: Path, env: dict[str, str],
              log: Path, time_scale: float = 0.03,
              extra: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "elasticslice.cli", "-c", str(pilot_image_config(emulator, tmp)),
         "run", str(FORKJOIN), "--state-dir", str(state_dir), "--time-scale", str(time_scale),
         "--max-nodes", "2", *extra], env=env, stdout=subprocess.PIPE, stderr=open(log, "a"),
        text=True, stdin=subprocess.DEVNULL)

def daemon_pid(state_dir: Path) -> int | None:
    try:
        text = (state_dir / "state" / "manage.lock").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None

def opened_by(tmp: Path, pid: int) -> list[str]:
    path = tmp / "opened" / f"{pid}.opened"
    return path.read_text().splitlines() if path.exists() else []

def tcp_sockets(pid: int) -> list[tuple[int, int, int]]:
    """(local port, remote port, TCP state) of each TCP socket process ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[9] in inodes:
                    found.append((int(fields[1].rsplit(":", 1)[1], 16),
                                  int(fields[2].rsplit(":", 1)[1], 16), int(fields[3], 16)))
    return found

LISTEN = 0x0A

def hostile_send(host: str, port: int, payload: bytes, wrap: bool) -> None:
    """``payload`` raw and as an HTTP POST body, plain or over TLS (no client
    certificate), to ``host:port``; whatever the server answers or does."""
    for body in (payload, b"POST /report HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/octet-stream\r\nContent-Length: "
                          + str(len(payload)).encode() + b"\r\n\r\n" + payload):
        try:
            sock = socket.create_connection((host, port), timeout=5)
        except OSError:
            continue
        try:
            if wrap:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(sock, server_hostname=host)
            sock.sendall(body)
            sock.settimeout(1)
            sock.recv(4096)
        except OSError:
            pass
        finally:
            sock.close()

def pickle_every_door(state_dir: Path, sockets: list[tuple[int, int, int]], host: str,
                      marker: Path) -> None:
    """Pickles that would write ``marker`` where they ran, to what a node or a stranger can
    reach of the daemon of ``state_dir``: its channel (a pickle is not a frame) and every
    port it listens on (from ``sockets``), raw and over TLS, and in an HTTP body."""
    payload = pickle.dumps(Marker(str(marker)))
    with socket_address(state_dir / "manager.sock") as address:
        channel = socket.socket(socket.AF_UNIX)
        channel.connect(address)
    channel.sendall(payload + b"\n")
    channel.close()
    listening = sorted({local for local, _, state in sockets if state == LISTEN})
    assert len(listening) >= 3   # enrolment, tarball publisher, callback endpoint
    for port in listening:
        for wrap in (False, True):
            hostile_send(host, port, payload, wrap)


def children(pid: int, marker: str) -> list[int]:
    """The processes whose parent is ``pid`` and whose command line has ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and marker.encode() in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.timeout(600)   # two scenarios of one run, each up to 100 s on a loaded machine
def test_the_credentials_are_the_daemon_s_alone_and_each_process_sigkilled_loses_nothing(
        emulator: Any, tmp_path: Path) -> None:
    """One run, two scenarios (they were two tests, each with a run of its own):

    1. the credentials are the daemon's alone and it never speaks Dask: while the run goes
       on, the daemon holds no connection to the scheduler, and pickles sent to its channel
       and to every port it listens on never run; at the end, the CloudLab key, its
       passphrase and the CA's key were opened by the daemon alone, which never loaded
       Dask, Parsl or cloudpickle (an audit hook logs what each process opens);
    2. the manager daemon, then the Dask scheduler, then the run's own process, each with
       SIGKILL during the run: the daemon is started again by the run, the scheduler by its
       framework on its address, the run by its user (the same command attaches to the
       daemon that kept the nodes); the run ends with every task done, none lost, no node
       held."""
    state_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    env = run_env(tmp_path, audit=True)
    run = start_run(emulator, tmp_path, state_dir, env, log, time_scale=0.2,  # ~20 s tasks
                    extra=("--release",))
    marker = tmp_path / "pickle-ran"
    second = None
    try:
        # 1. what a node or a stranger can do to the daemon, while the run goes on
        wait_for(lambda: "DONE" in [s for s, _ in units(state_dir).values()], RUN_TIMEOUT,
                 0.2, what="a task done on a node")
        first = daemon_pid(state_dir)
        assert first is not None and first != run.pid and process_alive(first)
        scheduler_port = int(json.loads((state_dir / "cluster.json").read_text())
                             ["scheduler"].rsplit(":", 1)[1])
        sockets = tcp_sockets(first)
        # the daemon holds no connection to (nor listener of) the Dask scheduler
        assert all(scheduler_port not in (local, remote) for local, remote, _ in sockets)
        # what a node or a stranger can reach of the daemon: its channel, every port
        pickle_every_door(state_dir, sockets, emulator.control_address, marker)
        assert run.poll() is None   # all of it while the run goes on
        # 2. each process SIGKILLed in turn, a task running on a node
        wait_for(lambda: "RUNNING" in [s for s, _ in units(state_dir).values()],
                 RUN_TIMEOUT, 0.2, what="a task running on a node")
        # 2.1. the manager daemon
        assert daemon_pid(state_dir) == first
        os.kill(first, 9)
        wait_for(lambda: daemon_pid(state_dir) not in (None, first)
                 and process_alive(daemon_pid(state_dir)), 120, 0.2,
                 what="a new daemon serving the run")
        daemon = daemon_pid(state_dir)
        # 2.2. the Dask scheduler, in a process of its own
        address = json.loads((state_dir / "cluster.json").read_text())["scheduler"]
        [scheduler] = children(run.pid, "troy.frameworks.dask scheduler")
        os.kill(scheduler, 9)
        wait_for(lambda: [p for p in children(run.pid, "troy.frameworks.dask scheduler")
                          if p != scheduler], 120, 0.2, what="a new scheduler")
        wait_for(lambda: "RUNNING" in [s for s, _ in units(state_dir).values()],
                 RUN_TIMEOUT, 0.2, what="a task running again")
        # 2.3. the run's own process: the daemon keeps the nodes for the same command
        os.kill(run.pid, 9)
        run.wait()
        assert process_alive(daemon) and nodes_in_slices(emulator) >= 1
        # resumed with another setting: the daemon that kept the nodes stops, keeping them,
        # and one with the new setting takes them
        second = start_run(emulator, tmp_path, state_dir, env, log, time_scale=0.2,
                           extra=("--release", "--max-nodes", "3"))
        out, _ = second.communicate(timeout=RUN_TIMEOUT)
    finally:
        for proc in (run, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = log.read_text()
    assert second.returncode == 0, stderr[-3000:]
    assert out.startswith("DONE: 10/10 tasks done, 0 failed, 0 canceled;"), out
    assert re.search(r", 0 lost(;|$)", out.strip()), out
    assert "1 restart(s)" in out   # the run's own process came back once
    assert "Traceback" not in stderr
    assert not marker.exists(), marker.read_text()
    assert json.loads((state_dir / "cluster.json").read_text())["scheduler"] == address
    run_log = (state_dir / "run.log").read_text()
    assert "the manager daemon was gone: a new one" in run_log
    assert "has other settings: it stops (the nodes are kept)" in stderr   # said at once
    assert not process_alive(daemon)
    # three daemons served the run: the first, the one after its SIGKILL, the new settings'
    served = [int(pid) for pid in re.findall(r"manager daemon (\d+) serving",
                                             (state_dir / "daemon.log").read_text())]
    assert len(served) == 3 and served[:2] == [first, daemon], served
    last = served[2]
    wait_for(lambda: not process_alive(last), 60, what="the daemon to end with the run")
    # who opened what: the CloudLab key and passphrase, the CA's key
    emu = Path(emulator.config_path).parent
    secrets = {str(emu / "user.pem"), str(emu / "password"),
               str(state_dir / "pki" / "ca.key")}
    theirs = set(opened_by(tmp_path, first))
    mine = set(opened_by(tmp_path, run.pid))
    assert secrets <= theirs, sorted(secrets - theirs)
    for pid in (run.pid, second.pid):   # the run's processes, before and after the restart
        theirs_not = secrets & set(opened_by(tmp_path, pid))
        assert not theirs_not, (pid, sorted(theirs_not))
    # no daemon of the run ever loaded Dask, Parsl or cloudpickle: it cannot decode their
    # messages
    for pid in (first, daemon, last):
        loaded = set(opened_by(tmp_path, pid))
        assert not [p for p in loaded if "/distributed/" in p or "/parsl/" in p
                    or "/cloudpickle/" in p], (pid, sorted(loaded)[:20])
    assert any("/distributed/" in p for p in mine)   # the audit hook sees imports
    assert nodes_in_slices(emulator) == 0   # given back: --release, and the run ended


def test_a_daemon_whose_manager_cannot_start_ends_the_run_in_one_line(
        emulator: Any, tmp_path: Path) -> None:
    """The callback endpoint's port taken: the daemon's manager cannot start after it said
    it was ready; the run says why in one line and exits 1 (another daemon would fail the
    same way: none is started again), and no daemon is left."""
    taken = socket.socket()
    taken.bind((emulator.control_address, 0))
    taken.listen()
    port = taken.getsockname()[1]
    state_dir, log = tmp_path / "run", tmp_path / "stderr.log"
    try:
        run = start_run(emulator, tmp_path, state_dir, run_env(tmp_path), log,
                        extra=("--endpoint-port", str(port)))
        out, _ = run.communicate(timeout=RUN_TIMEOUT)
    finally:
        taken.close()
    errors = [line for line in log.read_text().splitlines() if not line.startswith("[")]
    assert run.returncode == 1 and out == "", errors
    assert errors == [f"Error: {state_dir}: the manager cannot start: cannot listen on "
                      f"{emulator.control_address}:{port}: Address already in use (see "
                      f"{state_dir / 'daemon.log'})"], errors
    pid = daemon_pid(state_dir)
    assert pid is not None and not process_alive(pid)
    assert (state_dir / "daemon.log").read_text().count(" serving ") == 1   # not again


def test_a_manager_whose_address_is_not_there_yet_is_tried_again_a_while(
        tmp_path: Path) -> None:
    """Broke the chaos smoke run: the daemon started while the box restarted, its control
    address gone for a moment, and the run stopped for good. An address not on this machine
    (yet) is tried again for a minute; a port taken, or the minute over, ends the run."""
    import errno

    from elasticslice.errors import ElasticSliceError
    from elasticslice.pilots.managerdaemon import ADDRESS_WAIT, ManagerDaemon

    def failure(code: int) -> ElasticSliceError:
        try:
            try:
                raise OSError(code, os.strerror(code))
            except OSError as err:
                raise ElasticSliceError("cannot serve tarballs on 100.70.0.1:0") from err
        except ElasticSliceError as wrapped:
            return wrapped

    daemon = ManagerDaemon(None, tmp_path / "d")
    daemon.stop()   # its waits end at once
    assert daemon._may_come(failure(errno.EADDRNOTAVAIL))
    assert not daemon._may_come(failure(errno.EADDRINUSE))
    daemon._unavailable_since -= ADDRESS_WAIT + 1
    assert not daemon._may_come(failure(errno.EADDRNOTAVAIL))
