"""Nodes reboot (docs/emulator.md, "CloudLab's rules, from its source": R9, R15): a
shutdown (every process SIGTERM, SIGKILL 3 s later), then a boot on the disk the node left,
where ``rc.tarfiles`` installs again only the tarballs whose copy changed (install-tarfile:
timestamp, then MD5) and ``rc.startcmd`` runs the startup command again, with a new runlog.
The box never rebooted a node: a start script that could not run twice, or a pilot that
could not rejoin, worked in the box and stayed out on CloudLab."""
from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator import isolate
from elasticslice.emulator.tarfiles import TarfileStore
from tests.helpers import process_alive, wait_for
from tests.elasticslice.emulator.helpers import Session, as_script
from tests.elasticslice.emulator.node_helpers import (add_node, detail_of, exited, node_pids,
                                                      runlog)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not isolate.choose({}).users,
    reason=f"no node users here: {isolate.choose({}).users_reason or isolate.choose({}).reason}")]

ONE_NODE = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="base"/></rspec>"""
# what the node sees of its tarball at each boot, then it changes it (as root), and leaves
# a daemon behind (in a session of its own)
STARTUP = ("cat /local/app/version >> /tmp/seen; "
           "sudo sh -c 'echo changed-by-the-node > /local/app/version'; "
           "setsid -f sleep 300 < /dev/null > /dev/null 2>&1; echo up")


def _reboot(emulator, node_id: str) -> str:
    result = CliRunner().invoke(cli, ["emulator", "reboot", "--dir", str(emulator.dir),
                                      node_id])
    assert result.exit_code == 0, result.output
    return result.output


def _sleepers(sandbox: Path) -> set[int]:
    return {pid for pid in node_pids(sandbox)
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"300"]}


def _version(text: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("local/app/version")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


def test_a_reboot_is_a_shutdown_then_a_boot_on_the_disk_the_node_left(emulator, file_server):
    (file_server.root / "app.tgz").write_bytes(_version("1\n"))
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=ONE_NODE)
    node = add_node(s, urn, cred, "w1", STARTUP, tarballs=[f"{file_server.url}/app.tgz"])
    node_id = node.name
    assert exited(s, urn, cred, "w1")["execute_status"] == 0
    # the CM's copy of app.tgz, which nodes install (the startup may be a script's tarball)
    kept = TarfileStore(emulator.dir).kept(urn, f"{file_server.url}/app.tgz")
    assert kept.is_file()
    seen = node / "root" / "tmp" / "seen"
    boots = []
    for change in ("none", "newer, same bytes", "new bytes"):
        daemon = wait_for(lambda: _sleepers(node), timeout=30, what="the node's daemon")
        if change != "none":
            stamp = kept.stat().st_mtime + 10 * (len(boots) + 1)
            if change == "new bytes":
                kept.write_bytes(_version("2\n"))
            os.utime(kept, (stamp, stamp))
        assert _reboot(emulator, node_id) == f"{node_id}: rebooting (w1)\n"
        down = detail_of(s, urn, cred, "w1")  # a shutdown: not ready at once
        assert (down["status"], down["rawstate"], down["execute_state"]) == \
            ("notready", "SHUTDOWN", "pending")
        assert exited(s, urn, cred, "w1")["execute_status"] == 0
        assert detail_of(s, urn, cred, "w1")["status"] == "ready"
        wait_for(lambda: not any(process_alive(p) for p in daemon), timeout=30,
                 what="the daemon of the boot before gone")
        # the startup has returned; its daemon (forked by setsid) may not have exec'd yet
        boots.append(wait_for(lambda: _sleepers(node), timeout=30,
                              what="the daemon of this boot"))
    # the disk stays: what the node changed is seen again, until the CM's copy changes
    assert seen.read_text().splitlines() == ["1", "changed-by-the-node",
                                             "changed-by-the-node", "2"]
    installed = json.loads((node / "installed.json").read_text())
    assert installed[f"/ {file_server.url}/app.tgz"]["stamp"] == int(kept.stat().st_mtime)
    runlogs = (node / "runlogs").read_text().split()
    assert len(runlogs) == len(set(runlogs)) == 4  # a new runlog at every boot
    assert runlog(node) == f"up\n{as_script(STARTUP)[0]} returned 0\n"
    assert all(len(b) == 1 for b in boots) and len(set().union(*boots)) == 3


def test_a_node_that_cannot_be_rebooted_is_one_line(emulator_factory):
    emulator = emulator_factory(boot_delay=600)  # its nodes stay booting
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=ONE_NODE)
    booting = detail_of(s, urn, cred, "base")["component_urn"].rsplit("+", 1)[-1]
    free = next(n.node_id for n in emulator.server.ctx.store.nodes()
                if n.holder.value == "free")
    for nodes, said in (([booting], f"{booting} is booting"),
                        ([free], f"{free} is not in a slice"),
                        (["nosuch"], "No such node: nosuch")):
        result = CliRunner().invoke(cli, ["emulator", "reboot", "--dir", str(emulator.dir),
                                          *nodes])
        assert result.exit_code == 1 and said in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert detail_of(s, urn, cred, "base")["rawstate"] == "SHUTDOWN"  # as it was
    emulator.server.stop()
    result = CliRunner().invoke(cli, ["emulator", "reboot", "--dir", str(emulator.dir),
                                      booting])
    assert result.exit_code == 1 and "no emulator is running here" in result.output
