"""A node is a separate machine: a hostile startup command printed the emulator's CA and SA
private keys (``../../ca-key.pem``), inherited the emulator's whole environment, and a daemon
that called ``setsid`` survived DeleteNodes, stop and restarts (two copies after one restart).
What else a node may see (its image, nothing of the host) is test_node_image.py's.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from elasticslice.emulator import EmulatorServer, isolate
from elasticslice.rspec import NodeSpec, build_request
from tests.helpers import REPO, process_alive, wait_for
from tests.elasticslice.emulator.helpers import Session, ok
from tests.elasticslice.emulator.node_helpers import (add_node, as_root, exited, host_pid,
                                                      node_pids, serve)

pytestmark = pytest.mark.slow

needs_namespaces = pytest.mark.skipif(
    isolate.choose({}).isolation is not isolate.Isolation.NAMESPACES,
    reason=f"Linux namespaces unavailable here: {isolate.choose({}).reason}")

SECRETS = ["ca-key.pem", "sa-key.pem", "cm-key.pem", "server-key.pem", "admin.pem",
           "user.pem", "password", "state.db", "emulator.json", "server.json"]
DOCUMENTED_ENV = {"PATH", "HOME", "LANG", "ELASTICSLICE_NODE_ID", "ELASTICSLICE_CLIENT_ID",
                  "ELASTICSLICE_HOSTNAME", "ELASTICSLICE_NODE_IP", "ELASTICSLICE_CORES",
                  "ELASTICSLICE_MEMORY", "ELASTICSLICE_HARDWARE_TYPE",
                  "ELASTICSLICE_SLICE_URN", "ELASTICSLICE_SLIVER_URN", "ELASTICSLICE_NODE_DIR"}
# a daemon the classic way: forked off, its own session, deaf to SIGTERM
DAEMON = ("setsid -f sh -c 'trap \"\" TERM; echo $$ > /tmp/daemon.pid; exec sleep 300' "
          "</dev/null")


def _slice(s: Session) -> tuple[str, str]:
    """A slice with a sliver (one plain node) that AddNodes can grow."""
    urn, cred, _ = s.create(rspec=build_request([NodeSpec("base")]))
    return urn, cred


_add, _exited = add_node, exited


def _daemon(sandbox: Path) -> int:
    """The host PID of the node's daemon, once it runs in a session of its own."""
    pid_file = sandbox / "root" / "tmp" / "daemon.pid"  # the node's /tmp/daemon.pid
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30,
             what="daemon started")
    # The pid is written just before ``exec sleep``: while the exec runs, the process's
    # environment (which names its node) reads empty, so it is found once the exec is done.
    pid = wait_for(lambda: host_pid(sandbox, int(pid_file.read_text())), timeout=30,
                   what="the daemon's host pid")
    assert process_alive(pid)
    stat = Path(f"/proc/{pid}/stat").read_text()
    assert stat[stat.rfind(")") + 2:].split()[3] == str(pid)  # it leads its own session
    return pid


def _sleepers(sandbox: Path) -> set[int]:
    """The node's ``sleep 300`` processes (the daemon after its exec)."""
    found = set()
    for pid in node_pids(sandbox):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"300"]:
                found.add(pid)
        except OSError:
            continue
    return found


@needs_namespaces
def test_startup_command_cannot_read_the_emulators_keys_or_state(emulator):
    d = emulator.dir.resolve()
    me = os.getpid()  # the emulator runs in this process
    paths = [f"{d}/{name}" for name in SECRETS] + [f"../../{name}" for name in SECRETS]
    paths += [f"/proc/{me}/root{d}/ca-key.pem", f"/proc/{me}/cwd/{d}/ca-key.pem",
              f"/proc/{me}/environ", f"/proc/1/root{d}/ca-key.pem"]
    tries = "; ".join(f"cat '{p}' >/dev/null 2>&1 && echo 'READ {p}' >> found" for p in paths)
    # a hostile node also tries to take its image off, or to see what is under it
    attack = (f"umount -l /usr 2>/dev/null; umount -l / 2>/dev/null; "
              f"mount -o remount,rw /etc 2>/dev/null; {tries}; "
              f"unshare -Urm sh -c 'umount -l /usr; cat {d}/ca-key.pem' >> found 2>/dev/null; "
              f"touch /usr/bin/planted /etc/planted 2>/dev/null && echo WROTE >> found; "
              f"ls -A {d} >> found 2>/dev/null; echo done >> found")
    s = Session(emulator)
    urn, cred = _slice(s)
    node = _add(s, urn, cred, "hostile", as_root(attack))  # root of the node: it has sudo
    _exited(s, urn, cred, "hostile")
    assert all((d / name).is_file() for name in SECRETS)  # there to be read, from outside
    assert (node / "root" / "found").read_text().splitlines() == ["done"]
    assert not Path("/usr/bin/planted").exists() and not Path("/etc/planted").exists()


@needs_namespaces
def test_startup_environment_is_exactly_the_documented_one(emulator, monkeypatch):
    monkeypatch.setenv("PROTOGENI_PASSPHRASE", "hunter2")
    monkeypatch.setenv("ELASTICSLICE_EMULATOR_SECRET", "s3cret")
    dump = "import json, os; json.dump(dict(os.environ), open('/tmp/env.json', 'w'))"
    s = Session(emulator)
    urn, cred = _slice(s)
    node = _add(s, urn, cred, "w1", f"exec python3 -c \"{dump}\"")
    assert _exited(s, urn, cred, "w1")["execute_status"] == 0  # the image's python3
    env = json.loads((node / "root" / "tmp" / "env.json").read_text())
    assert set(env) - {"PWD"} == DOCUMENTED_ENV  # the shell adds PWD
    assert "hunter2" not in json.dumps(env) and "s3cret" not in json.dumps(env)
    assert env["HOME"] == "/root" and env["ELASTICSLICE_NODE_DIR"] == str(node)
    documented = (REPO / "docs" / "emulator.md").read_text()
    assert all(f"`{name}`" in documented for name in DOCUMENTED_ENV)


@needs_namespaces
def test_setsid_daemon_is_gone_after_delete_nodes(emulator):
    s = Session(emulator)
    urn, cred = _slice(s)
    sandbox = _add(s, urn, cred, "w1", DAEMON)
    keep = _add(s, urn, cred, "w2", DAEMON)
    daemon, other = _daemon(sandbox), _daemon(keep)
    assert _exited(s, urn, cred, "w1")["execute_status"] == 0
    ok(s.cm.DeleteNodes({"slice_urn": urn, "credentials": [cred], "nodes": ["w1"]}))
    wait_for(lambda: not process_alive(daemon), timeout=30, what="daemon killed")
    assert not node_pids(sandbox) and process_alive(other)  # only the deleted node's


@needs_namespaces
def test_setsid_daemon_is_gone_after_the_emulator_stops(emulator):
    s = Session(emulator)
    urn, cred = _slice(s)
    sandbox = _add(s, urn, cred, "w1", DAEMON)
    daemon = _daemon(sandbox)
    emulator.server.stop()
    wait_for(lambda: not process_alive(daemon), timeout=30, what="daemon killed")
    assert not node_pids(sandbox)


@needs_namespaces
def test_a_killed_emulators_nodes_go_down_with_it_and_a_restart_runs_them_once(
        tmp_path, emulator_pki):
    """Killed (and perhaps never started again: a box in a temporary folder, a program
    embedding one killed), its nodes used to run on for ever, orphaned: they go down with it,
    a daemon in a session of its own that ignores SIGTERM too; a restart is a power cycle
    that runs the daemon once."""
    d = tmp_path / "emu"
    shutil.copytree(emulator_pki, d)
    emu = serve(d, "--boot-delay", "0.1")
    try:
        s = Session(emu)
        urn, cred = _slice(s)
        sandbox = _add(s, urn, cred, "w1", DAEMON)
        old = _daemon(sandbox)
    finally:
        emu.proc.send_signal(signal.SIGKILL)
        emu.proc.wait(timeout=30)
    try:
        wait_for(lambda: not process_alive(old), timeout=30, what="the daemon gone")
        wait_for(lambda: not node_pids(sandbox), timeout=30, what="every node process gone")
        with EmulatorServer(d, port=0, boot_delay=0.1):
            new = wait_for(lambda: _sleepers(sandbox), timeout=30,
                           what="the daemon of the power cycle")
            assert len(new) == 1 and old not in new
        wait_for(lambda: not node_pids(sandbox), timeout=30, what="stopped")
    finally:
        for pid in node_pids(sandbox):
            os.kill(pid, signal.SIGKILL)


def test_forced_fallback_warns_once_and_still_runs_nodes(emulator_factory, monkeypatch,
                                                          caplog):
    monkeypatch.setenv(isolate.ENV_VAR, "off")
    caplog.set_level(logging.WARNING, logger="elasticslice.emulator")
    emulator = emulator_factory()
    s = Session(emulator)
    urn, cred = _slice(s)
    sandboxes = [_add(s, urn, cred, f"w{i}", "geni-get client_id > who") for i in range(3)]
    for i in range(3):
        assert _exited(s, urn, cred, f"w{i}")["execute_status"] == 0
    assert [(x / "root" / "who").read_text().strip() for x in sandboxes] == ["w0", "w1", "w2"]
    warnings = [r.getMessage() for r in caplog.records if "node isolation off" in r.getMessage()]
    assert len(warnings) == 1 and f"{isolate.ENV_VAR}=off" in warnings[0]
    assert "nodes can read the host's files" in warnings[0]


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not SYSTEM_PYTHON,
                    reason="needs root (to become an unprivileged user), setpriv, python3")
def test_node_is_isolated_without_privileges():
    """CI and users are not root: the same node init, started by user nobody, builds the
    node's machine (the emulator here runs as root, so this is the proof)."""
    from elasticslice.emulator import nodefs
    top = Path(tempfile.mkdtemp(prefix="es-unprivileged-"))
    try:
        node = nodefs.NodeDir(top / "emu" / "nodes" / "n1")
        nodefs.prepare(node, None)
        for source in isolate.NODE_FILES:  # the init and its siblings
            shutil.copy(source, top / source.name)
        (top / "emu" / "ca-key.pem").write_text("secret")
        for path in [top, *top.rglob("*")]:
            os.chown(path, 65534, 65534)
        top.chmod(0o755)
        (top / "emu" / "ca-key.pem").chmod(0o600)
        machine = nodefs.machine_spec(node, None, None, "n1", [str(top / "emu")])
        spec = {**machine, "isolate": True, "status_fd": 1,
                "command": f"test -x /usr/bin/env && cat {top}/emu/ca-key.pem > /seen 2>&1"}
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare",
             *isolate.UNSHARE_ARGS, "--", SYSTEM_PYTHON, "-I", "-S", str(top / "nodeinit.py"),
             json.dumps(spec)], cwd=node.root, capture_output=True, timeout=60, check=False)
        # what it reports: its runlog, then the status: cat failed
        assert result.stdout.split(b"\n")[1:] == [b"1", b""], result.stderr
        assert "No such file" in (node.root / "seen").read_text()
        assert (node.root / "seen").stat().st_uid == 65534  # root in the node, nobody outside
    finally:
        shutil.rmtree(top, ignore_errors=True)
