"""Node processes as the host sees them, and an emulator in its own process (to kill -9)."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import wait_for

PROC = Path("/proc")


@dataclass
class ServedEmulator:
    """What :class:`tests.elasticslice.emulator.helpers.Session` needs: ``dir`` and ``url``."""
    dir: Path
    url: str
    proc: subprocess.Popen[bytes]


def serve(d: Path, *options: str) -> ServedEmulator:
    """``elasticslice emulator serve --dir d`` in a child process, once it answers."""
    (d / "server.json").unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "elasticslice.cli", "emulator", "serve", "--dir", str(d),
         "--port", "0", *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (d / "server.json").exists(), timeout=30, what="server.json")
    return ServedEmulator(d, json.loads((d / "server.json").read_text())["url"], proc)


def _live(entry: Path) -> bool:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def node_pids(sandbox: Path) -> set[int]:
    """Host PIDs of the live processes started for the node of ``sandbox`` (the processes
    carry ``ELASTICSLICE_NODE_DIR`` in their environment)."""
    marker = f"ELASTICSLICE_NODE_DIR={sandbox}".encode()
    found = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ and _live(entry):
            found.add(int(entry.name))
    return found


def host_pid(sandbox: Path, pid: int) -> int | None:
    """The host PID of the node process that the node itself calls ``pid`` (inside its own
    PID namespace the numbers differ)."""
    for candidate in node_pids(sandbox):
        try:
            status = (PROC / str(candidate) / "status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines()
                      if line.startswith("NSpid:")), [])
        if nspid and nspid[-1] == str(pid):
            return candidate
    return None


def as_root(command: str) -> str:
    """``command`` as root of the node: a startup command runs as the experiment's creator,
    who has passwordless sudo, as on CloudLab."""
    return f"sudo sh -c {shlex.quote(command)}"


def node_dir(emu: object, node_id: str) -> Path:
    """The host's folder of a node (``D/nodes/<node>``: its ``root/`` is the node's ``/``)."""
    return emu.dir / "nodes" / node_id  # type: ignore[attr-defined]


def detail_of(s: object, urn: str, cred: str, client_id: str) -> dict:
    """The SliverStatus details of one node."""
    return next(d for d in s.status(urn, cred)["details"].values()  # type: ignore[attr-defined]
                if d["client_id"] == client_id)


def add_node(s: object, urn: str, cred: str, client_id: str, startup: str,
             **args: object) -> Path:
    """AddNodes one node with ``startup`` (in a script of a tarball when CloudLab's CM would
    refuse the command itself: ``helpers.startup_args``) and other AddNodes ``args``; its
    host folder."""
    from tests.elasticslice.emulator.helpers import ok, startup_args
    tarballs = tuple(args.pop("tarballs", ()))  # type: ignore[arg-type]
    node = {**args, **startup_args(startup, tarballs)}
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred],  # type: ignore[attr-defined]
                      "nodes": {client_id: node}}))
    node_id = detail_of(s, urn, cred, client_id)["component_urn"].rsplit("+", 1)[-1]
    return node_dir(s.emu, node_id)  # type: ignore[attr-defined]


def exited(s: object, urn: str, cred: str, client_id: str, timeout: float = 60) -> dict:
    """The node's details once its startup command exited (or the node failed)."""
    last: dict = {}

    def done() -> dict | None:
        last.update(detail_of(s, urn, cred, client_id))
        return dict(last) if last.get("execute_state") == "exited" or \
            last["status"] == "failed" else None
    try:
        return wait_for(done, timeout=timeout, what=f"startup of {client_id} to exit")
    except pytest.fail.Exception:  # say where the node was, and what its startup said
        node_id = str(last.get("component_urn", "")).rsplit("+", 1)[-1]
        pytest.fail(f"timed out after {timeout}s waiting for startup of {client_id} to exit: "
                    f"{last}; {said_by(node_dir(s.emu, node_id))}")  # type: ignore[attr-defined]


def runlog(sandbox: Path) -> str:
    """The node's runlog (its startup command's output, as runstartup writes it)."""
    from elasticslice.emulator.nodefs import NodeDir
    return NodeDir(sandbox).runlog_text() or ""


def said_by(sandbox: Path) -> str:
    """What a node said: its init (startup.log) and its startup command (its runlog)."""
    log = sandbox / "startup.log"
    init = log.read_text(errors="replace")[-2000:] if log.exists() else "(none)"
    return f"startup.log: {init or '(empty)'}; runlog: {runlog(sandbox)[-2000:] or '(none)'}"
