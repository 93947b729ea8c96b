"""Booting nodes, their startup command, and reboots.

A node given to a slice is ``notready``; after 30% of its boot time it is ``changing``;
then its disk is imaged (:mod:`elasticslice.emulator.nodefs`: a fresh root, the custom
image's files for it), its install tarballs are unpacked from the CM's kept copies as
install-tarfile does (:func:`elasticslice.emulator.nodefs.install_changed`) and the node is
``ready`` (or ``failed`` when a tarball cannot be installed, its image cannot be used, or
fault injection says so); then its startup command runs as runstartup runs it
(:mod:`elasticslice.emulator.startup`, :mod:`elasticslice.emulator.nodeexec`): as the
experiment's creator, on a separate machine booted from its image
(:mod:`elasticslice.emulator.isolate`) or, where Linux does not allow that, in its own
process group. Its exit status is the node's ``execute_status``; its output, the node's
runlog. Deleting a node kills every process it started and wipes its folder (CloudLab
reimages a node it takes back).

A reboot (:meth:`BootRunner.reboot`; ``rc.startcmd``'s ``doboot`` at every boot) is a
shutdown (SIGTERM to every process of the node, SIGKILL 3 s later:
:meth:`elasticslice.emulator.nodeprocs.NodeProcesses.stop`; ``notready``, rawstate SHUTDOWN), then a boot that takes :data:`REBOOT_FRACTION` of
the node's boot time (``changing``, BOOTING) on the disk the node left: only the tarballs
whose kept copy changed since the node installed them are installed again, then the
startup command runs again, with a new runlog.
"""
from __future__ import annotations

import heapq
import logging
import os
import shutil
import signal
import subprocess
import threading

from elasticslice.emulator import (geniget, isolate, network, nodefs, nodeusers, orphans,
                                   startup, tarfiles)
from elasticslice.emulator.context import Context
from elasticslice.emulator.geni import GeniFault
from elasticslice.emulator.images import Images
from elasticslice.emulator.nodeprocs import NodeProcesses
from elasticslice.emulator.store import BootState, ExecState, Holder, NodeRow
from elasticslice.emulator.tarfiles import TarfileStore
from elasticslice.errors import ElasticSliceError
from elasticslice.rpc.codes import GeniCode

log = logging.getLogger(__name__)

CHANGING_AT = 0.3
REBOOT_FRACTION = 0.5  # a reboot loads no image: half the node's boot time (an estimate)


def rebootable(node: NodeRow | None, node_id: str) -> NodeRow:
    """``node`` when it may be rebooted; else the fault: SEARCHFAILED no such node, BADARGS
    not in a slice, BUSY booting already."""
    if node is None:
        raise GeniFault(GeniCode.SEARCHFAILED, f"No such node: {node_id}")
    if node.holder is not Holder.SLICE:
        raise GeniFault(GeniCode.BADARGS, f"{node_id} is not in a slice")
    if node.boot_state in (BootState.NOTREADY, BootState.CHANGING):
        raise GeniFault(GeniCode.BUSY, f"{node_id} is booting; reboot it once it is up")
    return node


class BootRunner:
    """Moves nodes through their boot states on a timer and runs their startup commands."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._queue: list[tuple[float, str, str, str]] = []  # due, node, sliver, stage
        self._cond = threading.Condition()
        self.procs = NodeProcesses()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._isolation: isolate.Choice | None = None
        self._network: network.Choice | None = None
        self.fabric: network.Fabric | None = None
        self.images = Images(ctx.directory, ctx.identity, ctx.config.project)
        self.tarfiles = TarfileStore(ctx.where)
        self.box = ctx.directory / "box"

    def isolation(self) -> isolate.Choice:
        """How nodes are isolated (decided once, at start)."""
        if self._isolation is None:
            self._isolation = isolate.choose()
        return self._isolation

    def network(self) -> network.Fabric | None:
        """The box's networks (:mod:`elasticslice.emulator.network`), made at the first
        call; None: nodes share the host's network."""
        if self._network is None:
            self._network = choice = network.choose()
            if choice.on:
                try:
                    self.fabric = network.Fabric().start(
                        prefer=self._last_control_address(), owner=str(self.ctx.where),
                        public=self._public())
                except (network.NetworkError, OSError) as err:
                    self._network = choice = network.Choice(False, str(err))
            if self.fabric is not None:
                tarfiles.BOX_HOSTS.add(self.fabric.control_ip)  # the CM fetches from there
                if self.ctx.cluster:  # where this cluster's nodes found it last time
                    self.ctx.store.set_meta("control_address", self.fabric.control_ip)
                self.fabric.set_nodes([n for hw in self.ctx.inventory.types.values()
                                       for n in hw.node_ids()])
            elif choice.reason.startswith(network.ENV_VAR):
                log.info("nodes share this machine's network (%s)", choice.reason)
            else:
                log.warning("nodes share this machine's network (%s): they reach its "
                            "127.0.0.1 services, and LAN addresses are not configured",
                            choice.reason)
        return self.fabric

    def _public(self) -> network.Fabric | None:
        """The first cluster's fabric, for another cluster of a box of several: its control
        address is the control machine's one public address, which every cluster's nodes
        reach (docs/emulator.md, "The node's network"); None for the first cluster."""
        first = self.ctx.box[0] if self.ctx.box else self.ctx
        if first is self.ctx or first.boot is None:
            return None
        return first.boot.network()

    def _last_control_address(self) -> str | None:
        """The control address the client config names (``[pilots] listen``, written by
        the last ``serve`` of this directory), if any."""
        from elasticslice.config import load_pilot_settings
        if self.ctx.cluster:
            return self.ctx.store.get_meta("control_address")
        try:
            return load_pilot_settings(self.ctx.directory / "elasticslice.conf").listen
        except (ElasticSliceError, OSError):
            return None

    def control_address(self) -> str:
        """Where nodes reach the control machine (the emulator's node services too)."""
        fabric = self.network()
        return fabric.control_ip if fabric is not None else "127.0.0.1"

    def node_address(self, node_id: str) -> str:
        """A node's control address (the manifest's ``host@ipv4``)."""
        fabric = self.fabric if self._network is not None else self.network()
        return fabric.node_ip(node_id) if fabric is not None else "127.0.0.1"

    # ---- life cycle
    def start(self) -> None:
        orphans.reap(self.ctx.where / "nodes")  # before startup commands run again
        geniget.install_client(self.box)
        isolate.announce(self.isolation())
        for node in self.ctx.store.nodes(holder=Holder.SLICE):
            if node.boot_state in (BootState.NOTREADY, BootState.CHANGING):
                self.schedule(node)
            elif node.boot_state is BootState.READY and node.attrs.get("executes"):
                # A restarted emulator is a power cycle: startup commands run again.
                threading.Thread(target=self._execute, args=(node, 0), daemon=True).start()
        self._thread = threading.Thread(target=self._run, name="emulator-boot", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for node_id in self.procs.node_ids():
            self.kill(node_id)
        if self.fabric is not None:
            tarfiles.BOX_HOSTS.discard(self.fabric.control_ip)
            self.fabric.stop()

    def boot_seconds(self, node: NodeRow) -> float:
        """How long the node takes to boot (drawn at allocation under a latency profile);
        a reboot, :data:`REBOOT_FRACTION` of that."""
        value = node.attrs.get("boot_seconds")
        seconds = float(value) if isinstance(value, (int, float)) else \
            self.ctx.settings.boot_delay
        return seconds * REBOOT_FRACTION if node.attrs.get("rebooted") else seconds

    def schedule(self, node: NodeRow) -> None:
        """Queue the node's next boot step (from its current state and its boot time)."""
        delay = self.boot_seconds(node)
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

    def _fail(self, node: NodeRow, error: str) -> None:
        log.warning("node %s: %s", node.node_id, error)
        self.ctx.store.update_node(node.node_id, node.sliver_urn, boot_state=BootState.FAILED,
                                   attrs={**node.attrs, "error": error})

    def _finish_boot(self, node: NodeRow) -> None:
        """Image the node's disk, install its tarballs: ready (or failed). A boot the
        emulator's stop overtook (its store closed, the slice's tarballs gone) ends
        quietly: the node goes with the emulator."""
        try:
            self._boot(node)
        except ElasticSliceError as err:
            if not self._stopping:
                raise
            log.debug("node %s: boot ended by the emulator's stop: %s", node.node_id, err)

    def _boot(self, node: NodeRow) -> None:
        node_dir = nodefs.NodeDir(self.ctx.node_dir(node.node_id))
        generation = self.procs.generation(node.node_id)  # before a reboot can begin
        try:
            image = self.images.resolve(node.disk_image)
            if not node.attrs.get("rebooted"):
                nodefs.prepare(node_dir, image)  # a reboot keeps the disk as the node left it
            nodefs.install_changed(node_dir, node.tarballs,
                                   lambda url: self.tarfiles.kept(node.slice_urn, url),
                                   self._owners())
            nodefs.settle(node_dir)
        except (ElasticSliceError, OSError) as err:
            self._fail(node, str(err))
            return
        executes = node.attrs.get("executes") or []
        if not self.ctx.store.update_node(
                node.node_id, node.sliver_urn, boot_state=BootState.READY,
                execute_state=ExecState.PENDING if executes else ExecState.NONE):
            return
        if executes:
            self._execute(node, generation)

    def _owners(self) -> nodefs.Owners:
        """A tarball member's owner on the host: the node's uid through its uid map (out of
        the node's range: root's, as a failed chown leaves it); without node users, root's."""
        if self.isolation().users:
            return lambda n: nodeusers.host_id(n) if 0 <= n < nodeusers.NODE_IDS else 0
        return lambda _n: 0

    # ---- reboots
    def reboot(self, node_id: str) -> NodeRow:
        """Reboot a node of a slice: it shuts down now (``notready``, rawstate SHUTDOWN) and
        boots again on a background thread (see the module docstring). SEARCHFAILED: no such
        node; BADARGS: not in a slice; BUSY: it is booting already."""
        store = self.ctx.store
        with self.ctx.lock:  # not while the CM gives it to, or takes it from, a slice
            node = rebootable(store.get_node(node_id), node_id)
            generation = self.procs.next_generation(node_id)
            attrs = {k: v for k, v in node.attrs.items() if k != "error"}
            # its disk as it left it; one that failed before it was ever up is imaged again
            attrs["rebooted"] = bool(attrs.get("rebooted")) or node.boot_state is \
                BootState.READY
            executes = bool(attrs.get("executes"))
            store.update_node(node_id, node.sliver_urn, boot_state=BootState.NOTREADY,
                              boot_started=self.ctx.clock(), attrs=attrs,
                              execute_state=ExecState.PENDING if executes else ExecState.NONE,
                              execute_status=None)
            node = store.get_node(node_id) or node
        log.info("node %s: rebooting", node_id)
        threading.Thread(target=self._restart, args=(node, generation), daemon=True,
                         name=f"reboot-{node_id}").start()
        return node

    def _restart(self, node: NodeRow, generation: int) -> None:
        """The shutdown, then the boot from its timer (a DeleteNodes meanwhile ends it)."""
        try:
            self.kill(node.node_id)
            if self._stopping or self.procs.generation(node.node_id) != generation:
                return
            now = self.ctx.clock()
            if self.ctx.store.update_node(node.node_id, node.sliver_urn, boot_started=now):
                node.boot_started = now
                self.schedule(node)
        except Exception:  # e.g. the store closed under us while the emulator stops
            if not self._stopping:
                log.exception("reboot of node %s failed", node.node_id)

    # ---- the execute service
    def _execute(self, node: NodeRow, generation: int) -> None:
        """Run the node's startup command, unless a reboot (``generation``: the boot it is
        of) overtook it."""
        try:
            self._run_startup(node, generation)
        except Exception:  # e.g. the store closed under us while the emulator stops
            if not self._stopping:
                log.exception("startup of node %s failed", node.node_id)

    def _belongs(self, node: NodeRow) -> bool:
        current = self.ctx.store.get_node(node.node_id)
        return current is not None and current.sliver_urn == node.sliver_urn

    def _run_startup(self, node: NodeRow, generation: int) -> None:
        node_dir = nodefs.NodeDir(self.ctx.node_dir(node.node_id))
        if self.procs.generation(node.node_id) != generation:
            return  # rebooted before it started: the reboot runs it
        self.ctx.store.update_node(node.node_id, node.sliver_urn,
                                   execute_state=ExecState.RUNNING, execute_status=None)
        proc, read = self._spawn(node, node_dir, generation)
        if proc is None:
            status = 127
        else:
            status_read = startup.read_report(read, node_dir.add_runlog)
            if self._stopping or self.procs.generation(node.node_id) != generation:
                return  # a restart or the reboot runs it again
            if status_read is None:  # the node died before its command was done
                code = proc.wait()
                status_read = code if code >= 0 else 128 - code
            status = status_read
        self.ctx.store.update_node(node.node_id, node.sliver_urn,
                                   execute_state=ExecState.EXITED, execute_status=status)
        log.info("node %s startup exited with %s", node.node_id, status)
        if proc is not None:
            proc.wait()  # with namespaces, the node lives on while its daemons do
            self.procs.done(node.node_id, proc)

    def _startup_spec(self, node: NodeRow, node_dir: nodefs.NodeDir
                      ) -> tuple[dict, dict[str, str], dict]:
        """What the node's init builds, the startup command's environment, and what it
        runs as whom (:func:`elasticslice.emulator.startup.startup_spec`)."""
        image = self.images.resolve(node.disk_image)
        node_dir.root.mkdir(parents=True, exist_ok=True)
        node_dir.geni.mkdir(exist_ok=True)
        geniget.write_node_config(node_dir.geni, self.ctx.node_config_url,
                                  str(node.attrs.get("geni_key", "")))
        choice = self.isolation()
        spec = startup.startup_spec(self.ctx, node, node_dir, image, choice)  # /etc first
        host = nodefs.hostname(str(node.attrs.get("hostname", "")), node.client_id)
        machine = nodefs.machine_spec(node_dir, image, self.box, host,
                                      hide=[str(self.ctx.directory.resolve())])
        env = startup.node_environment(self.ctx, node, node_dir, image, choice.isolated,
                                       self.node_address(node.node_id))
        return machine, env, spec

    def _wire(self, node: NodeRow) -> str | None:
        """The node's network namespace, on its networks (None: the host's network)."""
        fabric = self.network()
        if fabric is None:
            return None
        sliver = self.ctx.store.get_sliver(node.slice_urn)
        lans = network.lans_of(node.interfaces, sliver.links if sliver is not None else [])
        return str(fabric.add(node.node_id, lans))

    def _spawn(self, node: NodeRow, node_dir: nodefs.NodeDir, generation: int
               ) -> tuple[subprocess.Popen[bytes] | None, int]:
        """Start the node's first process; it and the read end of its status pipe."""
        isolation = self.isolation().isolation
        try:
            machine, env, spec = self._startup_spec(node, node_dir)
            netns = self._wire(node)
        except (ElasticSliceError, OSError, ValueError, network.NetworkError) as err:
            log.warning("node %s: cannot boot its machine: %s", node.node_id, err)
            return None, -1
        read, write = os.pipe()
        lifeline = isolate.lifeline()
        try:
            with open(node_dir.log, "ab") as logfile:
                proc = subprocess.Popen(
                    isolate.node_command(isolation, machine, spec, write, netns, lifeline),
                    cwd=node_dir.root, env=env,
                    stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT,
                    start_new_session=True, pass_fds=(write, lifeline))
        except OSError as err:
            log.warning("node %s: cannot start its startup command: %s", node.node_id, err)
            os.close(read)
            return None, -1
        finally:
            os.close(write)
        orphans.record(node_dir.path, proc.pid)
        self.procs.add(node.node_id, proc)
        if self._stopping or not self._belongs(node) or \
                self.procs.generation(node.node_id) != generation:
            # deleted, rebooted (or stopping) while we were starting it: it must not survive
            orphans.signal_group(proc.pid, signal.SIGKILL)
        return proc, read

    def kill(self, node_id: str, wipe: bool = False) -> None:
        """Shut the node down (:meth:`NodeProcesses.stop`: every process group it started,
        daemons too) and take it off its networks; ``wipe``: its folder too (it left its
        slice)."""
        self.procs.stop(node_id)
        if self.fabric is not None:
            self.fabric.remove(node_id)
        if wipe:
            self.procs.forget(node_id)
            shutil.rmtree(self.ctx.node_dir(node_id), ignore_errors=True)

    def running(self, node_id: str) -> bool:
        return self.procs.running(node_id)
