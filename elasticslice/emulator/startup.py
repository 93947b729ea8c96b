"""What a node's startup runs, as CloudLab's CM and boot scripts make it (the host's side).

- One execute service (RSpec) or AddNodes ``startup``: the command itself, whatever its
  shell; runstartup runs it with Perl's ``exec($runcmd)`` of one string, that is ``/bin/sh
  -c COMMAND`` (``protogeni/lib/GeniCM.pm.in``: ``startupCount == 1`` keeps the command,
  not the shell; ``clientside/tmcc/common/runstartup``).
- Several execute services (RSpec only): the CM writes a wrapper, ``geni_startup.<node>``,
  and that file is the startup command (``GeniCM.pm.in``, the "TEMPORARY ELSE"):
  :func:`geni_startup` writes it exactly as the CM does (``exec &>`` included: dash, the
  images' ``/bin/sh``, reads it differently from bash, as on CloudLab). The box keeps it in
  the node's ``geni`` folder, read-only on the node at ``/var/emulab/boot/geni/`` (the CM
  keeps it in the experiment's folder, ``/proj/<pid>/exp/<eid>/``, which box nodes do not
  have).
- The environment (:func:`node_environment`): the boot scripts', as runstartup leaves it
  (HOME ``/root``, the PATH of :data:`elasticslice.emulator.isolate.NODE_PATH`), plus the
  box's ``ELASTICSLICE_*`` variables (an extension: CloudLab nodes have ``geni-get``).
- Who runs it and who has sudo (:func:`startup_spec`): the node's accounts
  (:mod:`elasticslice.emulator.nodeusers`), the creator's first.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticslice.emulator import isolate, nodefs, nodeusers
from elasticslice.emulator.context import Context
from elasticslice.emulator.images import STOCK_DIRS, Image
from elasticslice.emulator.store import NodeRow

NOT_LOCALISED = {*STOCK_DIRS, "tmp", "proc", "dev", "sys"}
WRAPPER_PREFIX = "geni_startup."


def localise(command: str, names: list[str], root: Path) -> str:
    """Without namespaces only: point a command's absolute paths into the node's own tree
    (``/local/...`` -> ``<root>/local/...``) for the top-level ``names`` the node has."""
    for name in names:
        clean = "/" + name.strip("/")
        if clean == "/" or name in NOT_LOCALISED:
            continue
        pattern = r"(?<![\w./-])" + re.escape(clean) + r"(?=/|\s|$|;|&|\|)"
        command = re.sub(pattern, lambda _m: str(root) + clean, command)
    return command


def node_environment(ctx: Context, node: NodeRow, node_dir: nodefs.NodeDir,
                     image: Image | None, isolated: bool = True,
                     address: str = "127.0.0.1") -> dict[str, str]:
    """The whole environment of a node's startup command (nothing of the emulator's).
    The ``ELASTICSLICE_*`` variables are an extension of the box: CloudLab nodes have
    ``geni-get``."""
    env = {
        "PATH": isolate.NODE_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "ELASTICSLICE_NODE_ID": node.node_id,
        "ELASTICSLICE_CLIENT_ID": node.client_id,
        "ELASTICSLICE_HOSTNAME": str(node.attrs.get("hostname", "")),
        "ELASTICSLICE_NODE_IP": address,
        "ELASTICSLICE_CORES": str(node.cores),
        "ELASTICSLICE_MEMORY": str(node.memory),
        "ELASTICSLICE_HARDWARE_TYPE": node.hardware_type,
        "ELASTICSLICE_SLICE_URN": node.slice_urn,
        "ELASTICSLICE_SLIVER_URN": node.sliver_urn,
        "ELASTICSLICE_NODE_DIR": str(node_dir.path),
    }
    if not isolated:  # the fallback: the layers only through the environment
        env["HOME"] = str(node_dir.root / "root")
        tops = [node_dir.layer, ctx.directory / "box", image.root if image else None]
        paths = [str(t / sub) for t in tops if t is not None
                 for sub in ("usr/local/bin", "usr/bin") if (t / sub).is_dir()]
        env["PATH"] = os.pathsep.join([*paths, isolate.NODE_PATH])
        sites = [str(p) for t in tops if t is not None
                 for p in sorted(t.glob("usr/local/lib/python3*/dist-packages"))]
        if sites:
            env["PYTHONPATH"] = os.pathsep.join(sites)
    return env


def geni_startup(executes: list[list[str]]) -> str:
    """The CM's wrapper for several execute services, line for line as ``GeniCM.pm.in``
    prints it (shells other than sh and csh are refused by the CM before this)."""
    text = "#!/bin/sh\n\n# Redirect all output to a file\nexec &> /var/tmp/startup.log\n\n"
    for count, (shell, cmd) in enumerate(executes):
        if "bin" not in shell:
            shell = f"/bin/{shell}"
        log, stat = f"/var/tmp/startup-{count}.txt", f"/var/tmp/startup-{count}.status"
        text += (f"echo -n 'Services execution {count} at '\ndate\n\n"
                 f'{shell} -c "{cmd}" >{log} 2>&1\nstatus=$?\necho "$status" > {stat}\n'
                 f'echo "Execution {count} exited with status $status"\n'
                 "echo '----------------------------------'\n")
    return text + "exit 0\n"


def startup_command(node: NodeRow, node_dir: nodefs.NodeDir, isolated: bool) -> str | None:
    """The node's startup command (None: it has none): the one execute's command, or the
    path of the wrapper of several (written now into the node's ``geni`` folder); without
    namespaces, its absolute paths pointed into the node's folder."""
    executes = [[str(s), str(c)] for s, c in node.attrs.get("executes") or []]
    names = [] if isolated or not node_dir.root.is_dir() else \
        [entry.name for entry in node_dir.root.iterdir()]
    if not isolated:
        executes = [[s, localise(c, names, node_dir.root)] for s, c in executes]
    if not executes:
        return None
    if len(executes) == 1:
        return executes[0][1]
    name = WRAPPER_PREFIX + re.sub(r"[^\w.-]", "_", node.client_id)
    node_dir.geni.mkdir(parents=True, exist_ok=True)
    wrapper = node_dir.geni / name
    staged = wrapper.with_name(f".{name}.tmp")
    staged.write_text(geni_startup(executes), encoding="utf-8")
    staged.chmod(0o755)
    os.replace(staged, wrapper)
    return f"/{nodefs.GENI_MOUNT}/{name}" if isolated else str(wrapper)


def startup_spec(ctx: Context, node: NodeRow, node_dir: nodefs.NodeDir, image: Image | None,
                 choice: isolate.Choice) -> dict[str, Any]:
    """What the node's init runs and as whom (:mod:`elasticslice.emulator.nodeinit`): the
    command, the creator's account (``run_as``), the users' homes, the uids its sudo serves
    and the node's id map; without users (not root) the command runs as root and sudo
    serves root alone."""
    spec: dict[str, Any] = {"command": startup_command(node, node_dir, choice.isolated),
                            "sudo": []}
    if not (choice.isolated and choice.users):
        return spec
    logins = [str(x) for x in node.attrs.get("logins") or []]
    accounts = nodeusers.write_accounts(node_dir.layer, image.root / "etc" if image else None,
                                        logins, ctx.config.project)
    creator = accounts.get(logins[0]) if logins else None
    spec.update({
        "id_map": nodeusers.id_map(),
        "homes": [[a.home, a.uid, a.gid] for a in accounts.users],
        "sudo": [a.uid for a in accounts.users],
        "run_as": ({"login": creator.login, "uid": creator.uid, "gid": creator.gid,
                    "groups": list(creator.groups)} if creator is not None else
                   {"login": logins[0]} if logins else None),  # no account: status 666
    })
    return spec


def read_report(fd: int, on_runlog: Callable[[str], None]) -> int | None:
    """What the node's init reports (:mod:`elasticslice.emulator.nodeinit`): its runlog's
    path (to ``on_runlog`` at once), then the startup's status (None: the node went down
    first). Reads until the status, not to the end (``unshare`` around the node holds the
    pipe too)."""
    with os.fdopen(fd, encoding="ascii", errors="replace") as lines:
        for line in lines:
            line = line.strip()
            if line.startswith("runlog "):
                on_runlog(line[len("runlog "):])
            elif line.isdigit():
                return int(line)
    return None
