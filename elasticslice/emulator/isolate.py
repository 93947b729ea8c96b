"""How a node's startup commands are started: as a separate machine when Linux allows it.

With namespaces (the default where unprivileged user namespaces and overlay mounts work), each
node runs under :mod:`elasticslice.emulator.nodeinit` as PID 1 of its own user, PID, mount
and UTS namespaces, on a machine of its own: the image read-only, its own writable tree, and
nothing else of the host (:mod:`elasticslice.emulator.nodefs`); every process of the node
dies with it. The network is the host's (node processes reach the emulator and each other on
127.0.0.1) unless :mod:`elasticslice.emulator.network` gives each node a network namespace of
its own, which the node's init is started in (``nsenter --net``). Without namespaces (or
with ``ELASTICSLICE_NODE_ISOLATION=off``) the node's commands run in one process group, in
the node's root folder, and the emulator says once at start that nodes can read the host.
"""
from __future__ import annotations

import enum
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV_VAR = "ELASTICSLICE_NODE_ISOLATION"
NODE_INIT = Path(__file__).with_name("nodeinit.py")
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UNSHARE_ARGS = ("--user", "--map-root-user", "--pid", "--fork", "--mount", "--uts",
                "--kill-child")


class Isolation(enum.Enum):
    NAMESPACES = "namespaces"
    PROCESS_GROUPS = "process-groups"


@dataclass(frozen=True)
class Choice:
    isolation: Isolation
    reason: str = ""  # why not namespaces


def choose(env: dict[str, str] | None = None) -> Choice:
    """Namespaces when they work here, unless ``ELASTICSLICE_NODE_ISOLATION=off``."""
    value = (os.environ if env is None else env).get(ENV_VAR, "auto").strip().lower()
    if value == "off":
        return Choice(Isolation.PROCESS_GROUPS, f"{ENV_VAR}=off")
    if value not in ("", "auto"):
        log.warning("%s=%s is not auto or off; using auto", ENV_VAR, value)
    reason = _probe()
    if reason:
        return Choice(Isolation.PROCESS_GROUPS, reason)
    return Choice(Isolation.NAMESPACES)


def announce(choice: Choice) -> None:
    """The one line at start saying that nodes are not isolated, and why."""
    if choice.isolation is Isolation.NAMESPACES:
        log.info("nodes run in their own user, PID, mount and UTS namespaces, on their image")
    else:
        log.warning("node isolation off (%s): startup commands run in process groups, nodes "
                    "can read the host's files (the emulator directory too), and daemons "
                    "that call setsid outlive their node", choice.reason)


def node_command(isolation: Isolation, machine: dict[str, Any], commands: list[list[str]],
                 status_fd: int, netns: str | None = None,
                 lifeline_fd: int | None = None) -> list[str]:
    """The argv that runs ``commands`` ([[shell, command], ...]) as the node's processes on
    ``machine`` (:func:`elasticslice.emulator.nodefs.machine_spec`), in the network
    namespace ``netns`` (a path; None: the host's network); with namespaces, the node goes
    down when ``lifeline_fd`` (:func:`lifeline`, passed to the process) reaches its end."""
    spec = {**machine, "commands": commands, "status_fd": status_fd,
            "isolate": isolation is Isolation.NAMESPACES}
    if lifeline_fd is not None and isolation is Isolation.NAMESPACES:
        spec["lifeline_fd"] = lifeline_fd
    argv = [sys.executable, "-I", "-S", str(NODE_INIT), json.dumps(spec)]
    if isolation is Isolation.NAMESPACES:
        argv = [_unshare() or "unshare", *UNSHARE_ARGS, "--", *argv]
    if netns is not None:
        argv = [shutil.which("nsenter", path=os.environ.get("PATH", "") + os.pathsep +
                             NODE_PATH) or "nsenter", f"--net={netns}", "--", *argv]
    return argv


_lifeline: tuple[int, int, int] | None = None   # (pid, read end, write end)
_lifeline_lock = threading.Lock()


def lifeline() -> int:
    """The read end of this process's lifeline, for its nodes' inits: a pipe whose write end
    only this process holds (close-on-exec, never written), so a node sees its end of file
    when the emulator's process is gone, however it went (SIGKILL, a crash, an embedded
    emulator's program killed), and goes down instead of running on, orphaned. A forked
    child makes its own."""
    global _lifeline
    with _lifeline_lock:
        if _lifeline is None or _lifeline[0] != os.getpid():
            read, write = os.pipe()
            _lifeline = (os.getpid(), read, write)
        return _lifeline[1]


def _unshare() -> str | None:
    return shutil.which("unshare", path=os.environ.get("PATH", "") + os.pathsep + NODE_PATH)


@functools.cache
def _probe() -> str:
    """Why namespaces cannot isolate nodes here ("" when they can): a trial node that must
    boot its machine (its own root, the image with a layer over /usr, /dev) and not see the
    folder around it."""
    if not sys.platform.startswith("linux"):
        return f"no Linux namespaces on {sys.platform}"
    if _unshare() is None:
        return "no unshare command (util-linux)"
    from elasticslice.emulator import nodefs
    with tempfile.TemporaryDirectory(prefix="es-isolation-probe-") as tmp:
        top = Path(tmp).resolve()
        node = nodefs.NodeDir(top / "nodes" / "probe")
        nodefs.prepare(node, None)
        (top / "secret").write_text("x")
        (node.root / "mine").write_text("x")
        (top / "box" / "usr" / "share").mkdir(parents=True)
        (top / "box" / "usr" / "share" / "probe").write_text("x")
        read, write = os.pipe()
        check = (f"test -e /mine && test -e /usr/share/probe && ! test -e {top}/secret && "
                 "test -x /bin/sh && test -c /dev/null")
        machine = nodefs.machine_spec(node, None, top / "box", "probe", [])
        argv = node_command(Isolation.NAMESPACES, machine, [["/bin/sh", check]], write)
        try:
            proc = subprocess.run(argv, pass_fds=(write,), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=30, env={"PATH": NODE_PATH})
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"trial node: {err}"
        finally:
            os.close(write)
        with os.fdopen(read, encoding="ascii") as statuses:
            reported = statuses.read().split()
        if proc.returncode != 0 or reported != ["0"]:
            said = (proc.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
            return (f"a node on its own image (user, PID, mount and UTS namespaces, overlay "
                    f"mounts) failed: {said or 'no detail'}")
    return ""
