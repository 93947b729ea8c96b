"""Node processes left behind by an emulator that died without stopping them (SIGKILL, a
crash): each node's folder (``D/nodes/<node>/``, the host's side of the node) records the
process group of its node's first process, and the next
start kills those groups, so that the power cycle of a restart does not run a node's
daemons twice, and a later DeleteNodes has nothing it cannot see. With namespaces
(:mod:`elasticslice.emulator.isolate`) the group holds the node's ``unshare`` and init:
killing them ends the node's PID namespace, daemons that left the group with ``setsid`` too.

A recorded group is only killed while one of its processes still carries the node folder's
``ELASTICSLICE_NODE_DIR`` in its environment: a process group id the kernel has since given
to an unrelated program is left alone.
"""
from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

PGID_FILE = ".startup-pgids"
PROC = Path("/proc")


def record(sandbox: Path, pgid: int) -> None:
    """Note a process group that a startup command of this sandbox runs in."""
    with open(sandbox / PGID_FILE, "a", encoding="ascii") as handle:
        handle.write(f"{pgid}\n")


def reap(nodes_dir: Path) -> int:
    """Kill the recorded process groups still running for their sandbox; returns how many."""
    killed = 0
    if not nodes_dir.is_dir() or not PROC.is_dir():
        return 0
    for sandbox in nodes_dir.iterdir():
        pgid_file = sandbox / PGID_FILE
        try:
            pgids = {int(x) for x in pgid_file.read_text(encoding="ascii").split()}
        except (OSError, ValueError):
            continue
        for pgid in pgids:
            if _runs_for(pgid, sandbox):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                    killed += 1
                    log.warning("node %s: killed process group %d left by a previous run",
                                sandbox.name, pgid)
                except (ProcessLookupError, PermissionError):
                    pass
        pgid_file.unlink(missing_ok=True)
    return killed


def _runs_for(pgid: int, sandbox: Path) -> bool:
    """Whether a live process of group ``pgid`` was started for ``sandbox``."""
    marker = f"ELASTICSLICE_NODE_DIR={sandbox}".encode()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rfind(")") + 2:].split()
            if len(fields) < 3 or fields[2] != str(pgid) or fields[0] == "Z":
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                return True
        except OSError:
            continue
    return False


def live_groups(pgids: Iterable[int]) -> set[int]:
    """Those of ``pgids`` that have a live member: not a zombie (zombies whose parent never
    reaps them, with no init in a container, would otherwise look alive forever). One pass
    over /proc for them all: a node's shutdown asks every 50 ms for each of its groups, and
    a pass per group, through pathlib, cost 2 ms with 60 processes on the machine."""
    want = {str(g).encode(): g for g in pgids}
    if not want:
        return set()
    if not PROC.is_dir():
        return {g for g in want.values() if signal_group(g, 0)}
    found: set[int] = set()
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                stat = os.read(fd, 1024)
            finally:
                os.close(fd)
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split(None, 3)   # state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != b"Z" and fields[2] in want:
            found.add(want[fields[2]])
            if len(found) == len(want):
                break
    return found


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
