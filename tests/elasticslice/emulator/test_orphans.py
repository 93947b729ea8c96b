"""An emulator killed with SIGKILL used to leave its nodes' startup processes running for
ever; the restart (a power cycle) then ran them a second time next to the orphans. With
namespaces a node now goes down with its emulator (test_isolation); without them (the
fallback, process groups) its processes still outlive it, until the restart kills them."""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from elasticslice.emulator import EmulatorServer, isolate
from elasticslice.emulator.orphans import PGID_FILE
from elasticslice.rspec import NodeSpec, build_request
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session
from tests.elasticslice.emulator.node_helpers import serve

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _pgids(sandbox: Path) -> set[int]:
    try:
        return {int(x) for x in (sandbox / PGID_FILE).read_text().split()}
    except OSError:
        return set()


def test_restart_after_sigkill_kills_the_orphaned_startup_processes(tmp_path, emulator_pki,
                                                                     monkeypatch):
    monkeypatch.setenv(isolate.ENV_VAR, "off")   # serve's environment, and the restart's
    d = tmp_path / "emu"
    shutil.copytree(emulator_pki, d)
    emu = serve(d, "--boot-delay", "0.1")
    proc = emu.proc
    try:
        s = Session(emu)
        request = build_request([NodeSpec("n1", hardware_type="m400",
                                          executes=[("sh", "sleep 300")])])
        urn, cred, _ = s.create(rspec=request)
        node = next(iter(s.status(urn, cred)["details"].values()))["component_urn"]
        sandbox = d / "nodes" / node.rsplit("+", 1)[-1]
        old = wait_for(lambda: _pgids(sandbox), timeout=20, what="startup process")
        (old_pid,) = old
        assert _alive(old_pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    try:
        assert _alive(old_pid)  # the orphan outlived its emulator
        with EmulatorServer(d, port=0, boot_delay=0.1):
            wait_for(lambda: not _alive(old_pid), timeout=10, what="orphan killed")
            new = wait_for(lambda: _pgids(sandbox), timeout=20, what="power cycle")
            assert old_pid not in new and all(_alive(p) for p in new)
        wait_for(lambda: not any(_alive(p) for p in new), timeout=10, what="stopped")
    finally:
        try:
            os.killpg(old_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_live_groups_names_the_groups_with_a_live_member_not_a_zombie_or_a_gone_one():
    """A node's shutdown asks which of its process groups still run, in one pass over
    /proc: a group whose only member is a zombie (nobody reaped it) is not running, nor is
    one whose processes are gone; a group with a live member is."""
    import subprocess
    import time

    from elasticslice.emulator.orphans import live_groups
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    zombie = subprocess.Popen(["true"], start_new_session=True)
    gone = subprocess.Popen(["true"], start_new_session=True)
    try:
        gone.wait()
        wait_for(lambda: not _alive(zombie.pid), 10, what="the zombie")   # not reaped yet
        assert Path(f"/proc/{zombie.pid}").exists()
        groups = [sleeper.pid, zombie.pid, gone.pid]
        assert live_groups(groups) == {sleeper.pid}
        assert live_groups([]) == set()
        sleeper.kill()
        sleeper.wait()
        time.sleep(0.05)
        assert live_groups(groups) == set()
    finally:
        for proc in (sleeper, zombie):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
