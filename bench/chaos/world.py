"""What a chaos run runs on: an emulator (CloudLab in a box) and an elastic cluster whose
nodes are real Troy node agents, and the faults done to them (:meth:`World.inject`).

Everything is real: the emulator is its HTTPS XML-RPC server on 127.0.0.1, the nodes'
agents are processes the emulator starts, the manager's callback endpoint is its HTTPS
server; a fault stops, kills or reconfigures one of them.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from bench.chaos.schedule import Fault, Kind
from elasticslice.config import load_config
from elasticslice.emulator import EmulatorServer
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.errors import ElasticSliceError
from elasticslice.managers import SimpleElasticSliceManager, lifecycle
from elasticslice.managers.policy import PolicyConfig
from elasticslice.pilots import ElasticCluster
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.transport import RetryPolicy

log = logging.getLogger(__name__)

EMULATOR = {"boot_delay": 0.2, "notify_interval": 0.3, "max_wait": 5, "slow_seconds": 0.5}
RETRY = RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.05)
INTERVALS = {m: 0.3 for m in SimpleElasticSliceManager.DEF_ORDER}
POLICY = PolicyConfig(add_cooldown=0.0, delete_cooldown=0.0, max_add_per_cycle=10,
                      max_delete_per_cycle=1)
PROC = Path("/proc")


def agent_pids(scheduler: str) -> dict[str, int]:
    """client_id -> pid of the node agents joining ``scheduler`` (found by their command
    line: ``troy.frameworks.dask node <scheduler> <cores> <client_id>``)."""
    found: dict[str, int] = {}
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
                found[args[at + 2]] = int(entry.name)
    return found


class World:
    """One run's emulator and cluster in ``directory`` (the emulator's PKI copied from
    ``pki``); ``seed`` seeds the emulator's faulty answers."""

    def __init__(self, directory: Path, pki: Path, seed: int, *, maxthreshold: int = 3,
                 idle_timeout: float | None = 3.0) -> None:
        self.dir = directory
        self.emu_dir = directory / "emulator"
        shutil.copytree(pki, self.emu_dir)
        self.seed = seed
        self.maxthreshold = maxthreshold
        self.idle_timeout = idle_timeout
        self.emulator: EmulatorServer | None = None
        self.port = 0
        self.cluster: ElasticCluster | None = None
        self.server: ProtoGeniServer | None = None
        self.emulator_calls_faulted = 0
        self._timers: list[threading.Timer] = []

    # ------------------------------------------------------------------ up and down
    def start(self) -> None:
        self.emulator = EmulatorServer(self.emu_dir, port=0, seed=self.seed, **EMULATOR)
        self.emulator.start()
        self.port = self.emulator.port
        config = load_config(self.emu_dir / "elasticslice.conf",
                             env={"ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(self.dir / "cache")})
        self.server = ProtoGeniServer(config, retry=RETRY)
        self.cluster = ElasticCluster(self.server, self.dir / "cluster",
                                      maxthreshold=self.maxthreshold, margin=1.0,
                                      idle_timeout=self.idle_timeout, intervals=INTERVALS,
                                      policy=POLICY,
                                      manager_options={"agent_timeout": 20.0})
        self.cluster.start()

    def close(self) -> None:
        """Stop the timers, give the nodes back (the cluster's close), stop the emulator."""
        for timer in self._timers:
            timer.cancel()
            timer.join()
        try:
            if self.cluster is not None:
                self.cluster.close()
            if self.server is not None:
                self.server.close()
        finally:
            if self.emulator is not None:
                self._count_faulted()
                self.emulator.stop()
                self.emulator = None

    @property
    def db(self) -> Path:
        return self.emu_dir / "state.db"

    def admin(self) -> AdminClient:
        return AdminClient(self.emu_dir)

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
                   Kind.CALLBACK_DROP: self.drop_callbacks}[fault.kind]
        return bool(handler(fault))

    def restart_manager(self, fault: Fault) -> bool:
        """As a crash: the cycle and the endpoint die, nothing is unregistered or flushed
        on purpose; a new manager starts from the same state directory."""
        assert self.cluster is not None
        old = self.cluster.manager
        if old is None:
            return False
        old.cycle.stop()
        if old.endpoint_server is not None:
            old.endpoint_server.stop()
        self.cluster.replace_manager()
        old.state.close()
        return True

    def kill_pilot(self, fault: Fault) -> bool:
        assert self.cluster is not None and self.cluster.framework is not None
        pids = agent_pids(self.cluster.framework.scheduler_address)
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
        emulator = self.emulator
        if emulator is None or emulator.ctx is None:
            return False
        nodes = sorted(n.node_id for n in emulator.ctx.store.nodes()
                       if n.holder.value == "slice")
        if not nodes:
            return False
        node = nodes[fault.pick % len(nodes)]
        settings = emulator.ctx.settings
        saved = settings.max_wait
        if fault.kind is Kind.REVOKE_NOW:
            settings.max_wait = 0
        try:
            self.admin().call("Revoke", nodes=[node])
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
        """The manager's callback endpoint stops (the CM's calls are refused) and comes
        back on the same address after ``duration`` seconds."""
        assert self.cluster is not None
        manager = self.cluster.manager
        if manager is None or manager.endpoint_server is None:
            return False
        server = manager.endpoint_server
        port = server.port
        server.stop()
        self._later(fault.duration, lambda: self._callbacks_back(manager, port))
        return True

    def _callbacks_back(self, manager: Any, port: int) -> None:
        if self.cluster is None or self.cluster.manager is not manager:
            return  # the manager was replaced meanwhile: the new one has its own endpoint
        manager.endpoint_config = dataclasses.replace(manager.endpoint_config, port=port)
        registered = set(manager.registered)
        try:
            lifecycle.start_endpoint(manager)
        except (ElasticSliceError, OSError) as err:
            log.warning("chaos: the callback endpoint did not come back on %d: %s", port, err)
            return
        manager.registered = registered  # the same URL: still registered at the CM
