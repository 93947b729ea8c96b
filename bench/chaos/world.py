"""What a chaos run runs on: an emulator (CloudLab in a box) in this process, and the cluster
as ``elasticslice run`` in a process of its own (the manager, Troy and the Dask scheduler),
whose nodes are real Troy node agents; and the faults done to them (:meth:`World.inject`).

Everything is real: the emulator is its HTTPS XML-RPC server on 127.0.0.1, the nodes'
agents are processes the emulator starts, the cluster is the ``elasticslice`` command line
(through :mod:`bench.chaos.launch`, for its short intervals). A manager restart is a
SIGKILL of the cluster's process (its process group) and the same command again on the
same ``--state-dir``, which resumes the run.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from bench.chaos.invariants import Stores
from bench.chaos.schedule import Fault, Kind
from bench.chaos.workflow import Recorder, completions, recording_workflow
from elasticslice.emulator import EmulatorServer
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent.parent
EMULATOR = {"boot_delay": 0.2, "notify_interval": 0.3, "max_wait": 5, "slow_seconds": 0.5}
# the cluster's client of the emulator: many quick retries (up to 30% of calls fail), and
# in all 5-10 s of them, the time an emulator restart takes on a loaded machine (its stop
# waits up to 5 s for its control address to go): with 0.6 s, a process resuming when the
# emulator restarted ended on "connection refused" with no report (a CI run). The product's
# default covers minutes.
CLIENT_ENV = {"ELASTICSLICE_RETRIES": "15", "ELASTICSLICE_RETRY_DELAY": "0.01",
              "ELASTICSLICE_RETRY_MAX_DELAY": "1.0"}
PROC = Path("/proc")


def agent_pids(scheduler: str) -> dict[str, int]:
    """client_id -> pid of the node agents joining ``scheduler`` (found by their command
    line: ``troy.frameworks.dask node <scheduler> <cores> <client_id>``).

    A process an agent has just forked to start a unit carries the agent's command line
    until it execs: it is left out (its parent matches too), and so is a process gone
    meanwhile. Else a SIGKILL meant for the agent may kill the unit being started, and the
    agent, alive, reports that unit "killed by signal 9": FAILED, not requeued."""
    named: dict[int, str] = {}
    parent: dict[int, int | None] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "troy.frameworks.dask" in args and scheduler in args:
            at = args.index(scheduler)
            if len(args) > at + 2:
                pid = int(entry.name)
                named[pid], parent[pid] = args[at + 2], _parent_pid(entry)
    return {name: pid for pid, name in sorted(named.items())
            if parent[pid] is not None and parent[pid] not in named}


def _parent_pid(entry: Path) -> int | None:
    """The parent pid of the process at ``/proc/<pid>`` (None: it is gone)."""
    try:
        status = (entry / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return None


class World:
    """One run's emulator and cluster process in ``directory`` (the emulator's PKI copied
    from ``pki``); ``seed`` seeds the emulator's faulty answers; the cluster runs
    ``workflow`` (a WfFormat trace, made a recording workflow) within ``timeout`` s.
    ``sites``: the clusters of a box of several CMs (``pki`` made with them), the slice
    holding a sliver at each."""

    def __init__(self, directory: Path, pki: Path, seed: int, *, workflow: Path,
                 time_scale: float, timeout: float = 180.0, maxthreshold: int = 3,
                 sites: tuple[str, ...] = ()) -> None:
        self.dir = directory
        self.emu_dir = directory / "emulator"
        shutil.copytree(pki, self.emu_dir)
        self.sites = sites
        self.stores = Stores.of(self.emu_dir, sites)
        self.seed = seed
        self.maxthreshold = maxthreshold
        self.trace, self.time_scale, self.timeout = workflow, time_scale, timeout
        self.state_dir = directory / "cluster"
        self.ran = directory / "ran"
        self.workflow = directory / "workflow.json"
        self.report = directory / "report.json"
        self.tasks = 0
        self.emulator: EmulatorServer | None = None
        self.recorder: Recorder | None = None  # where the tasks on the nodes say they ran
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.incarnations = 0
        self.emulator_calls_faulted = 0
        self._deadline = 0.0
        self._lock = threading.Lock()   # the cluster process: one replacement at a time
        self._out: IO[bytes] | None = None
        self._log: Path | None = None   # the current process' output
        self._timers: list[threading.Timer] = []

    # ------------------------------------------------------------------ up and down
    def start(self) -> None:
        """The emulator, the recording workflow, the cluster's first process."""
        self.emulator = EmulatorServer(self.emu_dir, port=0, seed=self.seed, **EMULATOR)
        self.emulator.start()
        self.port = self.emulator.port
        self.recorder = Recorder(self.ran, self.emulator.ctx.boot.control_address())
        self.tasks = recording_workflow(self.trace, self.workflow, self.ran, self.time_scale,
                                        self.recorder.url)
        self._deadline = time.monotonic() + self.timeout
        with self._lock:
            self._launch()

    def _launch(self) -> None:
        """Start ``elasticslice run`` (again: it resumes) with what is left of the time."""
        left = max(10.0, self._deadline - time.monotonic())
        argv = [sys.executable, "-m", "bench.chaos.launch", "-c",
                str(self.emu_dir / "elasticslice.conf"), "run", str(self.workflow),
                "--state-dir", str(self.state_dir), "--max-nodes", str(self.maxthreshold),
                "--report", str(self.report), "--timeout", f"{left:.0f}",
                "--release"]   # stopped (SIGINT, --timeout): the nodes go back, no leak
        env = {**os.environ, **CLIENT_ENV, "PYTHONUNBUFFERED": "1",  # its lines as they come
               "ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(self.dir / "cache")}
        if self._out is not None:
            self._out.close()
        self._log = self.dir / f"process-{self.incarnations}.log"
        self._out = open(self._log, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                     start_new_session=True)
        self.incarnations += 1
        log.info("cluster process %d started (pid %d)", self.incarnations, self.proc.pid)

    def cluster_file(self) -> dict[str, Any]:
        """``<state_dir>/cluster.json`` ({} while there is none)."""
        try:
            return dict(json.loads((self.state_dir / "cluster.json").read_text()))
        except (OSError, ValueError, TypeError):
            return {}

    def wait_serving(self, timeout: float = 120.0) -> bool:
        """Wait (bounded) until the current process has started its cluster: its servers
        listen (it prints its first progress line). False: it ended, or not in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc, log_file = self.proc, self._log
            if proc is None or proc.poll() is not None or log_file is None:
                return False
            try:
                if re.search(rb"^\[ *[0-9.]+s\] tasks ", log_file.read_bytes(), re.M):
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def wait_end(self) -> int | None:
        """The exit status of the cluster's last process (None: still running at the
        deadline, plus a minute for giving the nodes back)."""
        while True:
            proc = self.proc
            assert proc is not None
            try:
                code = proc.wait(0.2)
            except subprocess.TimeoutExpired:
                if time.monotonic() > self._deadline + 60.0:
                    return None
                continue
            with self._lock:
                if proc is self.proc:
                    return code

    def all_ran(self) -> bool:
        """Every task's work ran to its end at least once."""
        runs = completions(self.ran)
        return len(runs) == self.tasks and all(runs.values())

    def close(self) -> None:
        """Stop the timers and the cluster's process if it still runs (SIGINT: with
        ``--release`` it gives the nodes back; SIGKILL after 60 s), then the emulator."""
        for timer in self._timers:
            timer.cancel()
            timer.join()
        try:
            with self._lock:
                proc = self.proc
                if proc is not None and proc.poll() is None:
                    log.warning("chaos: the cluster process still runs: interrupting it")
                    os.killpg(proc.pid, signal.SIGINT)
                    try:
                        proc.wait(60.0)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                daemon = self.daemon_pid()   # one left by a killed run: it keeps nothing now
                if daemon is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(daemon, signal.SIGTERM)
                if self._out is not None:
                    self._out.close()
                    self._out = None
        finally:
            if self.emulator is not None:
                self._count_faulted()
                self.emulator.stop()
                self.emulator = None
            if self.recorder is not None:
                self.recorder.close()
                self.recorder = None

    def admin(self, site: str = "") -> AdminClient:
        return AdminClient(self.emu_dir, cluster=site or None)

    def slice_nodes(self, pilots: set[str] | None = None) -> list[tuple[str, str, Any]]:
        """(cluster, node id, its context) of the nodes slices hold, at every CM, sorted;
        ``pilots``: only nodes whose client_id is one of them."""
        emulator = self.emulator
        if emulator is None:
            return []
        out = []
        for site, agg in zip(self.sites or ("",), emulator.aggregates):
            out += [(site, n.node_id, agg.ctx) for n in agg.ctx.store.nodes()
                    if n.holder.value == "slice" and (pilots is None or n.client_id in pilots)]
        return sorted(out, key=lambda t: (t[0], t[1]))

    def _later(self, seconds: float, action: Any) -> None:
        timer = threading.Timer(seconds, action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _count_faulted(self) -> None:
        if self.emulator is not None and self.emulator.faults is not None:
            counts = self.emulator.faults.counts
            self.emulator_calls_faulted += sum(v for k, v in counts.items() if k.value != "none")

    # ------------------------------------------------------------------ faults
    def inject(self, fault: Fault) -> bool:
        """Do ``fault`` now; False when it had no target (no pilot, no node to revoke)."""
        handler = {Kind.MANAGER_RESTART: self.restart_manager, Kind.PILOT_KILL: self.kill_pilot,
                   Kind.EMULATOR_FAULTS: self.faulty_answers,
                   Kind.REVOKE_SHORT: self.revoke, Kind.REVOKE_NOW: self.revoke,
                   Kind.EMULATOR_RESTART: self.restart_emulator,
                   Kind.CALLBACK_DROP: self.drop_callbacks, Kind.REBOOT: self.reboot,
                   Kind.CM_BUSY: self.cm_busy}[fault.kind]
        return bool(handler(fault))

    def restart_manager(self, fault: Fault) -> bool:
        """A crash: SIGKILL to the cluster's processes (the run's process group: Troy and
        the scheduler; and its manager daemon, in a session of its own), then the same
        command on the same state dir."""
        with self._lock:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return False
            daemon = self.daemon_pid()
            os.killpg(proc.pid, signal.SIGKILL)
            if daemon is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(daemon, signal.SIGKILL)
            proc.wait()
            log.warning("chaos: SIGKILL to the cluster process (pid %d) and its manager "
                        "daemon (pid %s)", proc.pid, daemon)
            self._launch()
        return True

    def daemon_pid(self) -> int | None:
        """The pid of the run's manager daemon (its state dir's lock says), if any."""
        try:
            text = (self.state_dir / "state" / "manage.lock").read_text().strip()
        except OSError:
            return None
        if not text.isdigit():
            return None
        try:   # a pid of a daemon that ended may be another process' now
            cmdline = Path(f"/proc/{text}/cmdline").read_bytes()
        except OSError:
            return None
        return int(text) if b"daemon" in cmdline and os.fsencode(self.state_dir) in cmdline \
            else None

    def kill_pilot(self, fault: Fault) -> bool:
        scheduler = self.cluster_file().get("scheduler")
        pids = agent_pids(str(scheduler)) if scheduler else {}
        if not pids:
            return False
        name = sorted(pids)[fault.pick % len(pids)]
        try:
            os.kill(pids[name], signal.SIGKILL)
        except ProcessLookupError:
            return False
        log.warning("chaos: SIGKILL to the agent of %s (pid %d)", name, pids[name])
        return True

    def faulty_answers(self, fault: Fault) -> bool:
        emulator = self.emulator
        if emulator is None or emulator.faults is None:
            return False
        emulator.faults.rate = fault.rate
        self._later(fault.duration, lambda: self._answers_ok(emulator))
        return True

    @staticmethod
    def _answers_ok(emulator: EmulatorServer) -> None:
        if emulator.faults is not None:
            emulator.faults.rate = 0.0

    def revoke(self, fault: Fault) -> bool:
        """``emulator revoke`` of one node of the slice; REVOKE_NOW with max_wait 0."""
        nodes = self.slice_nodes()
        if not nodes:
            return False
        site, node, ctx = nodes[fault.pick % len(nodes)]
        settings = ctx.settings
        saved = settings.max_wait
        if fault.kind is Kind.REVOKE_NOW:
            settings.max_wait = 0
        try:
            self.admin(site).call("Revoke", nodes=[node])
        except ElasticSliceError as err:
            log.warning("chaos: revoke %s failed: %s", node, err)
            return False
        finally:
            settings.max_wait = saved
        return True

    def restart_emulator(self, fault: Fault) -> bool:
        """Stop the emulator (its node processes die: a power cycle) and start it again on
        the same directory and port; the node agents start again from their tarballs."""
        if self.emulator is None:
            return False
        self._count_faulted()
        # under the lock, once the cluster's process listens: a process starting meanwhile
        # would find no control address to listen on ("Cannot assign requested address":
        # the box's lives while it serves; a control node's does not go with the CM)
        with self._lock:
            self.wait_serving(60.0)
            self.emulator.stop()
            self.emulator = None
            deadline = time.monotonic() + 30.0
            while True:
                try:
                    emulator = EmulatorServer(self.emu_dir, port=self.port, **EMULATOR,
                                              seed=random.Random(fault.at).randrange(1 << 30))
                    emulator.start()
                    break
                except ElasticSliceError:  # the port is not free again yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            self.emulator = emulator
        return True

    def drop_callbacks(self, fault: Fault) -> bool:
        """The CM's calls to the manager's endpoint fail for ``duration`` seconds (what a
        dropped connection looks like from the CM); it retries on its own schedule."""
        emulator = self.emulator
        if emulator is None or getattr(emulator, "reclaimer", None) is None:
            return False
        emulator.reclaimer.callbacks.fail_for(fault.duration)
        return True

    def reboot(self, fault: Fault) -> bool:
        """``emulator reboot`` of one node holding a pilot (its agent joined the cluster's
        scheduler): its processes get SIGTERM, then SIGKILL; its disk stays; its startup
        command runs again at the end of the reboot, and the agent rejoins with what it has
        on its disk, or the manager replaces the node."""
        scheduler = self.cluster_file().get("scheduler")
        pilots = set(agent_pids(str(scheduler))) if scheduler else set()
        nodes = self.slice_nodes(pilots) if pilots else []
        if not nodes:
            return False
        site, node, _ = nodes[fault.pick % len(nodes)]
        try:
            self.admin(site).call("Reboot", nodes=[node])
        except ElasticSliceError as err:  # e.g. it is still booting
            log.warning("chaos: reboot %s failed: %s", node, err)
            return False
        log.warning("chaos: reboot of %s", node)
        return True

    def cm_busy(self, fault: Fault) -> bool:
        """One CM of several answers BUSY to every call for ``duration`` seconds (the
        others answer as before): the manager's growth, renewals and releases there wait;
        elsewhere they go on."""
        emulator = self.emulator
        if emulator is None or len(self.sites) < 2:
            return False
        from elasticslice.emulator.cm import ComponentManager
        from elasticslice.emulator.dynamic import DynamicSliceService
        site = self.sites[fault.pick % len(self.sites)]
        emulator.pressure.set(busy={f"{site}/{module}.{m}": 1.0 for module, service in
                                    (("cm", ComponentManager), ("dynslice", DynamicSliceService))
                                    for m in service.METHODS})
        self._later(fault.duration, lambda: emulator.pressure.set(busy={}))
        log.warning("chaos: %s answers BUSY for %.1f s", site, fault.duration)
        return True
