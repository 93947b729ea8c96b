"""Booting nodes and the execute service.

A node given to a slice is ``notready``; after 30% of the boot delay it is ``changing``;
then its sandbox ``D/nodes/<node>/`` gets the install tarballs unpacked and the node is
``ready`` (or ``failed`` when a tarball cannot be installed or fault injection says so);
then its startup commands run there, with the node's identity as their whole environment,
as a separate machine (:mod:`elasticslice.emulator.isolate`: own PID and mount namespaces,
the emulator directory out of sight) or, where Linux does not allow that, in their own
process group. Their exit status is the node's ``execute_status``. Deleting a node kills
every process it started and wipes the sandbox (CloudLab reimages a node it takes back).
"""
from __future__ import annotations

import heapq
import re
import logging
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from elasticslice.emulator import isolate, orphans
from elasticslice.emulator.context import Context
from elasticslice.emulator.store import BootState, ExecState, Holder, NodeRow
from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

SHELLS = {"sh": "/bin/sh", "bash": "/bin/bash"}
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
CHANGING_AT = 0.3


class InstallError(ElasticSliceError):
    """A tarball could not be fetched or unpacked into a node's sandbox."""


def fetch_tarball(url: str, dest: Path) -> Path:
    """Download (file:// or loopback http(s)) ``url`` into ``dest``; refuse anything else."""
    parts = urllib.parse.urlparse(url)
    if parts.scheme == "file":
        return Path(urllib.parse.unquote(parts.path))
    if parts.scheme in ("http", "https") and parts.hostname in LOOPBACK_HOSTS:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=30) as resp, open(dest, "wb") as out:
                shutil.copyfileobj(resp, out)
        except OSError as err:
            raise InstallError(f"cannot fetch {url}: {err}") from err
        return dest
    raise InstallError(f"refusing tarball URL {url}: only file:// and loopback http(s)")


def install_tarball(url: str, path: str, sandbox: Path) -> None:
    """Unpack the tarball at ``url`` into ``sandbox``/``path`` (path taken inside the sandbox)."""
    target = (sandbox / path.lstrip("/")).resolve()
    if not target.is_relative_to(sandbox.resolve()):
        raise InstallError(f"install path {path} leaves the node sandbox")
    target.mkdir(parents=True, exist_ok=True)
    source = fetch_tarball(url, sandbox / ".download.tar")
    try:
        with tarfile.open(source) as tar:
            tar.extractall(target, filter="data")
    except (OSError, tarfile.TarError) as err:
        raise InstallError(f"cannot unpack {url}: {err}") from err
    finally:
        (sandbox / ".download.tar").unlink(missing_ok=True)


def localise(command: str, tarballs: list[list[str]], sandbox: Path) -> str:
    """Point a command's absolute install paths (``/local/...``) into the node sandbox.

    Commands run in the sandbox, and a tarball installed at ``/local`` lives in
    ``<sandbox>/local``; CloudLab profiles name such paths absolutely, so they are rewritten.
    """
    for _, path in tarballs:
        clean = "/" + path.strip("/")
        if clean == "/":
            continue
        pattern = r"(?<![\w./-])" + re.escape(clean) + r"(?=/|\s|$|;|&|\|)"
        command = re.sub(pattern, lambda _m: str(sandbox) + clean, command)
    return command


def node_environment(ctx: Context, node: NodeRow, sandbox: Path) -> dict[str, str]:
    """The whole environment of a node's startup commands (nothing of the emulator's)."""
    return {
        "PATH": isolate.NODE_PATH,
        "HOME": str(sandbox),
        "LANG": "C.UTF-8",
        "ELASTICSLICE_NODE_ID": node.node_id,
        "ELASTICSLICE_CLIENT_ID": node.client_id,
        "ELASTICSLICE_HOSTNAME": str(node.attrs.get("hostname", "")),
        "ELASTICSLICE_NODE_IP": "127.0.0.1",
        "ELASTICSLICE_CORES": str(node.cores),
        "ELASTICSLICE_MEMORY": str(node.memory),
        "ELASTICSLICE_HARDWARE_TYPE": node.hardware_type,
        "ELASTICSLICE_SLICE_URN": node.slice_urn,
        "ELASTICSLICE_SLIVER_URN": node.sliver_urn,
        "ELASTICSLICE_NODE_DIR": str(sandbox),
    }


class BootRunner:
    """Moves nodes through their boot states on a timer and runs their startup commands."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._queue: list[tuple[float, str, str, str]] = []  # due, node, sliver, stage
        self._cond = threading.Condition()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._groups: dict[str, set[int]] = {}
        self._procs_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._isolation: isolate.Choice | None = None

    def isolation(self) -> isolate.Choice:
        """How nodes are isolated (decided once, at start)."""
        if self._isolation is None:
            self._isolation = isolate.choose()
        return self._isolation

    # ---- life cycle
    def start(self) -> None:
        orphans.reap(self.ctx.directory / "nodes")  # before startup commands run again
        isolate.announce(self.isolation())
        for node in self.ctx.store.nodes(holder=Holder.SLICE):
            if node.boot_state in (BootState.NOTREADY, BootState.CHANGING):
                self.schedule(node)
            elif node.boot_state is BootState.READY and node.attrs.get("executes"):
                # A restarted emulator is a power cycle: startup commands run again.
                threading.Thread(target=self._execute, args=(node,), daemon=True).start()
        self._thread = threading.Thread(target=self._run, name="emulator-boot", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._procs_lock:
            node_ids = list(set(self._procs) | set(self._groups))
        for node_id in node_ids:
            self.kill(node_id)

    def schedule(self, node: NodeRow) -> None:
        """Queue the node's next boot step (from its current state and the boot delay)."""
        delay = self.ctx.settings.boot_delay
        fraction = 1.0 if node.boot_state is BootState.CHANGING else CHANGING_AT
        entry = (node.boot_started + delay * fraction, node.node_id, node.sliver_urn,
                 node.boot_state.value)
        with self._cond:
            heapq.heappush(self._queue, entry)
            self._cond.notify_all()

    # ---- the timer
    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                if not self._queue:
                    self._cond.wait(timeout=1.0)
                    continue
                due = self._queue[0][0]
                now = self.ctx.clock()
                if due > now:
                    self._cond.wait(timeout=min(due - now, 1.0))
                    continue
                _, node_id, sliver_urn, stage = heapq.heappop(self._queue)
            node = self.ctx.store.get_node(node_id)
            if node is None or node.sliver_urn != sliver_urn or node.boot_state.value != stage:
                continue  # deleted, reallocated, or already advanced by an earlier entry
            try:
                self._advance(node)
            except Exception:  # one bad node must not stop the others booting
                log.exception("boot step of %s failed", node_id)

    def _advance(self, node: NodeRow) -> None:
        store = self.ctx.store
        if node.boot_state is BootState.NOTREADY:
            store.update_node(node.node_id, node.sliver_urn, boot_state=BootState.CHANGING)
            node.boot_state = BootState.CHANGING
            self.schedule(node)
            return
        if self.ctx.faults.boot_fails():
            store.update_node(node.node_id, node.sliver_urn, boot_state=BootState.FAILED,
                              attrs={**node.attrs, "error": "boot failed (injected fault)"})
            log.info("node %s failed to boot (injected fault)", node.node_id)
            return
        if not node.tarballs and not node.attrs.get("executes"):
            self._finish_boot(node)  # nothing slow to do: no thread needed
            return
        threading.Thread(target=self._finish_boot, args=(node,), daemon=True,
                         name=f"boot-{node.node_id}").start()

    def _finish_boot(self, node: NodeRow) -> None:
        sandbox = self.ctx.node_dir(node.node_id)
        sandbox.mkdir(parents=True, exist_ok=True)
        try:
            for url, path in node.tarballs:
                install_tarball(url, path, sandbox)
        except InstallError as err:
            log.warning("node %s: %s", node.node_id, err)
            self.ctx.store.update_node(node.node_id, node.sliver_urn,
                                       boot_state=BootState.FAILED,
                                       attrs={**node.attrs, "error": str(err)})
            return
        executes = node.attrs.get("executes") or []
        if not self.ctx.store.update_node(
                node.node_id, node.sliver_urn, boot_state=BootState.READY,
                execute_state=ExecState.PENDING if executes else ExecState.NONE):
            return
        if executes:
            self._execute(node)

    # ---- the execute service
    def _execute(self, node: NodeRow) -> None:
        try:
            self._run_startup(node)
        except Exception:  # e.g. the store closed under us while the emulator stops
            if not self._stopping:
                log.exception("startup of node %s failed", node.node_id)

    def _belongs(self, node: NodeRow) -> bool:
        current = self.ctx.store.get_node(node.node_id)
        return current is not None and current.sliver_urn == node.sliver_urn

    def _run_startup(self, node: NodeRow) -> None:
        sandbox = self.ctx.node_dir(node.node_id)
        sandbox.mkdir(parents=True, exist_ok=True)
        commands = [[SHELLS.get(shell, "/bin/sh"), localise(command, node.tarballs, sandbox)]
                    for shell, command in node.attrs.get("executes") or []]
        self.ctx.store.update_node(node.node_id, node.sliver_urn,
                                   execute_state=ExecState.RUNNING, execute_status=None)
        proc, statuses = self._spawn(node, sandbox, commands)
        if proc is None:
            status = 127
        else:
            reported = _statuses(statuses, len(commands))
            if self._stopping:
                return  # the state stays "running": a restart runs it again
            if reported and (reported[-1] != 0 or len(reported) == len(commands)):
                status = reported[-1]
            else:  # the node died before its commands were done
                code = proc.wait()
                status = code if code >= 0 else 128 - code
        self.ctx.store.update_node(node.node_id, node.sliver_urn,
                                   execute_state=ExecState.EXITED, execute_status=status)
        log.info("node %s startup exited with %s", node.node_id, status)
        if proc is not None:
            proc.wait()  # with namespaces, the node lives on while its daemons do
            with self._procs_lock:
                if self._procs.get(node.node_id) is proc:
                    del self._procs[node.node_id]

    def _spawn(self, node: NodeRow, sandbox: Path, commands: list[list[str]]
               ) -> tuple[subprocess.Popen[bytes] | None, int]:
        """Start the node's first process; it and the read end of its status pipe."""
        isolation = self.isolation().isolation
        read, write = os.pipe()
        try:
            with open(sandbox / "startup.log", "ab") as logfile:
                proc = subprocess.Popen(
                    isolate.node_command(isolation, self.ctx.directory.resolve(),
                                         sandbox.resolve(), commands, write),
                    cwd=sandbox, env=node_environment(self.ctx, node, sandbox),
                    stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT,
                    start_new_session=True, pass_fds=(write,))
        except OSError as err:
            log.warning("node %s: cannot start its startup commands: %s", node.node_id, err)
            os.close(read)
            return None, -1
        finally:
            os.close(write)
        orphans.record(sandbox, proc.pid)
        with self._procs_lock:
            self._procs[node.node_id] = proc
            self._groups.setdefault(node.node_id, set()).add(proc.pid)
        if self._stopping or not self._belongs(node):
            # deleted (or stopping) while we were starting it: it must not survive
            _signal_group(proc.pid, signal.SIGKILL)
        return proc, read

    def kill(self, node_id: str, wipe: bool = False) -> None:
        """Stop the node's startup processes: every process group it started, daemons too."""
        with self._procs_lock:
            proc = self._procs.pop(node_id, None)
            groups = self._groups.pop(node_id, set())
        alive = set(groups)
        for pgid in groups:
            if not _signal_group(pgid, signal.SIGTERM):
                alive.discard(pgid)
        deadline = time.monotonic() + 3.0
        while alive and time.monotonic() < deadline:
            alive = {g for g in alive if _group_alive(g)}
            if alive:
                time.sleep(0.05)
        for pgid in alive:
            _signal_group(pgid, signal.SIGKILL)
        if proc is not None:
            try:
                proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                log.warning("node %s: startup process %s would not die", node_id, proc.pid)
        if wipe:
            shutil.rmtree(self.ctx.node_dir(node_id), ignore_errors=True)

    def running(self, node_id: str) -> bool:
        with self._procs_lock:
            groups = set(self._groups.get(node_id, set()))
        return any(_group_alive(g) for g in groups)


def _statuses(fd: int, count: int) -> list[int]:
    """Exit statuses the node reports (one a line) until its commands are done: ``count``
    of them or a failure (not EOF: the ``unshare`` around the node holds the pipe too)."""
    reported: list[int] = []
    with os.fdopen(fd, encoding="ascii") as lines:
        for line in lines:
            if line.strip().isdigit():
                reported.append(int(line))
                if reported[-1] != 0 or len(reported) >= count:
                    break
    return reported


def _group_alive(pgid: int) -> bool:
    """Whether a process group has a live (not zombie) member; zombies whose parent never
    reaps them (no init in a container) would otherwise look alive forever."""
    proc = Path("/proc")
    if not proc.is_dir():
        return _signal_group(pgid, 0)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True
