"""How a node's startup command is started: as a separate machine when Linux allows it.

With namespaces (the default where unprivileged user namespaces and overlay mounts work), each
node runs under :mod:`elasticslice.emulator.nodeinit` as PID 1 of its own user, PID, mount
and UTS namespaces, on a machine of its own: the image read-only, its own writable tree, and
nothing else of the host (:mod:`elasticslice.emulator.nodefs`); every process of the node
dies with it. The network is the host's (node processes reach the emulator and each other on
127.0.0.1) unless :mod:`elasticslice.emulator.network` gives each node a network namespace of
its own, which the node's init is started in (``nsenter --net``).

Where the emulator may map more than one id (root: ``CAP_SETUID`` and ``CAP_SETGID`` in the
host's user namespace) the node's user namespace also holds the node's users
(:mod:`elasticslice.emulator.nodeusers`) and the startup command runs as the experiment's
creator; elsewhere node root is the only id and the startup command runs as root, which the
emulator says once at start. Without namespaces (or with ``ELASTICSLICE_NODE_ISOLATION=off``)
the node's command runs in one process group, in the node's root folder, as the emulator's
user, and the emulator says once at start that nodes can read the host.
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
NODE_FILES = tuple(NODE_INIT.with_name(n) for n in ("nodeinit.py", "nodeexec.py", "nodesudo.py"))
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
    users: bool = False  # the node's users exist (its user namespace maps them)
    users_reason: str = ""  # why not

    @property
    def isolated(self) -> bool:
        return self.isolation is Isolation.NAMESPACES


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
    users_reason = _probe_users()
    return Choice(Isolation.NAMESPACES, users=not users_reason, users_reason=users_reason)


def announce(choice: Choice) -> None:
    """The one line at start saying that nodes are not isolated, or have no users, and why."""
    if choice.isolation is Isolation.NAMESPACES and choice.users:
        log.info("nodes run in their own user, PID, mount and UTS namespaces, on their "
                 "image; startup commands run as the experiment's creator")
    elif choice.isolation is Isolation.NAMESPACES:
        log.warning("node users off (%s): startup commands run as root of the node, not as "
                    "the experiment's creator", choice.users_reason)
    else:
        log.warning("node isolation off (%s): startup commands run in process groups, nodes "
                    "can read the host's files (the emulator directory too), and daemons "
                    "that call setsid outlive their node", choice.reason)


def node_command(isolation: Isolation, machine: dict[str, Any], startup: dict[str, Any],
                 status_fd: int, netns: str | None = None,
                 lifeline_fd: int | None = None) -> list[str]:
    """The argv that boots the node on ``machine``
    (:func:`elasticslice.emulator.nodefs.machine_spec`) and runs ``startup`` there
    (``command``, ``run_as``, ``homes``, ``sudo``, ``id_map``: see
    :mod:`elasticslice.emulator.nodeinit`), in the network namespace ``netns`` (a path; None:
    the host's network); with namespaces, the node goes down when ``lifeline_fd``
    (:func:`lifeline`, passed to the process) reaches its end. Without namespaces the node's
    users, its sudo service and its id map are left out (the command runs as this process's
    user)."""
    isolated = isolation is Isolation.NAMESPACES
    parts = startup if isolated else {"command": startup.get("command")}
    spec = {**machine, **parts, "status_fd": status_fd, "isolate": isolated}
    if lifeline_fd is not None and isolated:
        spec["lifeline_fd"] = lifeline_fd
    argv = [sys.executable, "-I", "-S", str(NODE_INIT), json.dumps(spec)]
    if isolated and not spec.get("id_map"):  # else the init makes its namespaces itself
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


def _trial(command: str, startup: dict[str, Any], files: dict[str, str],
           ) -> tuple[bool, str, int | None]:
    """Boot a trial node (its own root, the image with a layer over /usr, /dev) that runs
    ``command`` (``TOP``: the folder around the node); whether it exited 0, what it said
    last, and the host's owner of the node's ``/tmp/probe-made`` if it made one. ``files``
    go on its disk first."""
    from elasticslice.emulator import nodefs
    with tempfile.TemporaryDirectory(prefix="es-isolation-probe-") as tmp:
        top = Path(tmp).resolve()
        node = nodefs.NodeDir(top / "nodes" / "probe")
        nodefs.prepare(node, None)
        (top / "secret").write_text("x")
        for name, text in files.items():
            (node.root / name).write_text(text)
        (top / "box" / "usr" / "share").mkdir(parents=True)
        (top / "box" / "usr" / "share" / "probe").write_text("x")
        read, write = os.pipe()
        machine = nodefs.machine_spec(node, None, top / "box", "probe", [])
        argv = node_command(Isolation.NAMESPACES, machine,
                            {**startup, "command": command.replace("TOP", str(top))}, write)
        try:
            proc = subprocess.run(argv, pass_fds=(write,), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=30, env={"PATH": NODE_PATH})
        except (OSError, subprocess.TimeoutExpired) as err:
            return False, f"trial node: {err}", None
        finally:
            os.close(write)
        with os.fdopen(read, encoding="ascii") as statuses:
            reported = [line for line in statuses.read().split("\n") if line.isdigit()]
        said = (proc.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
        made = node.root / "tmp" / "probe-made"
        owner = made.stat().st_uid if made.exists() else None
        ok = proc.returncode == 0 and reported == ["0"]
        return ok, said or f"status {reported or proc.returncode}", owner


@functools.cache
def _probe() -> str:
    """Why namespaces cannot isolate nodes here ("" when they can): a trial node that must
    boot its machine (its own root, the image with a layer over /usr, /dev) and not see the
    folder around it."""
    if not sys.platform.startswith("linux"):
        return f"no Linux namespaces on {sys.platform}"
    if _unshare() is None:
        return "no unshare command (util-linux)"
    ok, said, _ = _trial("test -e /mine && test -e /usr/share/probe && ! test -e TOP/secret "
                         "&& test -x /bin/sh && test -c /dev/null", {}, {"mine": "x"})
    if not ok:
        return (f"a node on its own image (user, PID, mount and UTS namespaces, overlay "
                f"mounts) failed: {said}")
    return ""


@functools.cache
def _probe_users() -> str:
    """Why a node cannot have users here ("" when it can): mapping them takes root, and a
    trial node whose command runs as a user must make a file the host sees as that user's
    (:func:`elasticslice.emulator.nodeusers.host_id`)."""
    from elasticslice.emulator import nodeusers
    if os.geteuid() != 0:
        return ("not root: a node's user namespace maps its users only with CAP_SETUID and "
                "CAP_SETGID in this machine's")
    uid = nodeusers.FIRST_UID
    run_as = {"login": "probe", "uid": uid, "gid": uid, "groups": [uid]}
    ok, said, owner = _trial(f"test \"$(id -u):$(id -G)\" = '{uid}:{uid}' && "
                             "touch /tmp/probe-made",
                             {"id_map": nodeusers.id_map(), "run_as": run_as}, {})
    if not ok or owner != nodeusers.host_id(uid):
        return f"a trial node with users failed: {said}"
    return ""
