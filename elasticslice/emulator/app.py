"""``EmulatorServer``: CloudLab in a box, assembled and run.

    with EmulatorServer(directory, boot_delay=0.2) as emu:
        print(emu.url)   # https://127.0.0.1:P/protogeni/xmlrpc (+ /sa, /cm, /dynslice)

``start()`` opens the state, binds, rewrites ``D/elasticslice.conf`` with the real port and
writes ``D/server.json`` (URL and pid: how admin commands find the running server).
``stop()`` stops the listener, the timers and every node process.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from elasticslice.emulator.admin import AdminService
from elasticslice.emulator.authority import Authority, Identity
from elasticslice.emulator.boot import BootRunner
from elasticslice.emulator.cm import ComponentManager
from elasticslice.emulator.context import Context, Settings
from elasticslice.emulator.dispatch import EmulatorDispatcher
from elasticslice.emulator.dynamic import DynamicSliceService, Reclaimer
from elasticslice.emulator.faults import FaultInjector
from elasticslice.emulator.pace import Latency
from elasticslice.emulator.pool import load_inventory, sync_nodes
from elasticslice.emulator.pressure import Pressure
from elasticslice.emulator.sa import SliceAuthority
from elasticslice.emulator.server import TLSServer, server_context
from elasticslice.emulator.setup import (EmulatorConfig, base_url, load_config, lock_directory,
                                         write_atomic, write_client_conf)
from elasticslice.emulator.sliver import SliverOps
from elasticslice.emulator.store import Store
from elasticslice.emulator.tmcd import NodeConfigServer
from elasticslice.errors import ConfigError, ElasticSliceError

log = logging.getLogger(__name__)


class EmulatorServer:
    """SA, CM v2, the dynamic-slice server and the admin service on one HTTPS port."""

    def __init__(self, directory: str | Path, port: int | None = None, host: str | None = None,
                 inventory: str | Path | None = None, boot_delay: float = 5.0,
                 notify_interval: float = 10.0, max_wait: int = 60, fault_rate: float = 0.0,
                 seed: int | None = None, tenant_load: float = 0.0, tenant_interval: float = 5.0,
                 allow_remote_endpoints: bool = False, slow_seconds: float = 1.0,
                 boot_failure_rate: float | None = None,
                 slow: Mapping[str, float] | None = None,
                 busy: Mapping[str, float] | None = None, latency: str = "none",
                 time_scale: float = 1.0) -> None:
        self.directory = Path(directory).resolve()
        self._port = port
        self._host = host
        self.inventory_path = inventory
        self.settings = Settings(boot_delay=boot_delay, notify_interval=notify_interval,
                                 max_wait=max_wait, tenant_load=tenant_load,
                                 tenant_interval=tenant_interval,
                                 allow_remote_endpoints=allow_remote_endpoints,
                                 latency=Latency(latency, time_scale, seed), seed=seed)
        try:
            self.faults = FaultInjector(fault_rate, seed, slow_seconds=slow_seconds,
                                        boot_rate=boot_failure_rate)
        except ValueError as err:
            raise ConfigError(str(err), key="fault-rate") from err
        self.pressure = Pressure(slow, busy, seed)  # --slow / --busy: a slow CM on demand
        self.seed = seed
        self.ctx: Context | None = None
        self.reclaimer: Reclaimer | None = None
        self.slivers: SliverOps | None = None
        self._tls: TLSServer | None = None
        self._tmcd: NodeConfigServer | None = None
        self._lock_fd: int | None = None
        self.host = host or "127.0.0.1"

    # ---- life cycle
    def start(self) -> EmulatorServer:
        cfg = load_config(self.directory)
        self.host = self._host or cfg.host
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("emulator listening on %s: reachable beyond this machine", self.host)
        port = cfg.port if self._port is None else self._port
        identity = cfg.identity
        self._lock_directory()
        try:
            self._start(cfg, port, identity)
        except BaseException:
            self._unlock_directory()
            raise
        return self

    def _lock_directory(self) -> None:
        self._lock_fd = lock_directory(self.directory)

    def _unlock_directory(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def _start(self, cfg: EmulatorConfig, port: int, identity: Identity) -> None:
        try:
            authority = Authority(self.directory, identity).load()
        except OSError as err:
            raise ConfigError(f"emulator keys missing: {err}", path=str(self.directory)) from err
        inventory = load_inventory(self.inventory_path)
        store = Store(self.directory / "state.db").open()
        try:
            sync_nodes(store, inventory)
            ctx = Context(self.directory, cfg, identity, authority, store, inventory,
                          self.settings, self.faults)
            ctx.boot = BootRunner(ctx)
            slivers = self.slivers = SliverOps(ctx)
            self.reclaimer = Reclaimer(ctx, slivers, seed=self.seed)
            services = [SliceAuthority(ctx), ComponentManager(ctx, slivers),
                        DynamicSliceService(ctx, self.reclaimer), AdminService(ctx, self.reclaimer)]
            dispatcher = EmulatorDispatcher(services, self.faults, identity.admin_urn,
                                            self.pressure, self.settings.latency)
            tls_ctx = server_context(str(self.directory / "server.pem"),
                                     str(self.directory / "server-key.pem"),
                                     str(self.directory / "ca.pem"))
            try:
                self._tls = TLSServer(self.host, port, tls_ctx, dispatcher)
            except OSError as err:
                hint = " (serve --port 0 picks a free port)" if port else ""
                raise ElasticSliceError(f"cannot listen on {self.host}:{port}: "
                                        f"{err.strerror or err}{hint}") from err
        except BaseException:
            store.close()
            raise
        self.ctx = ctx
        # geni-get's server, before nodes boot: where nodes reach the control machine
        self._tmcd = NodeConfigServer(ctx, host=ctx.boot.control_address()).start()
        ctx.node_config_url = self._tmcd.url
        ctx.url = base_url(self.host, self._tls.port)
        ctx.boot.start()
        slivers.reaper.sweep()
        self._tls.start()
        self.reclaimer.start()
        fabric = ctx.boot.network()
        write_client_conf(self.directory, self.host, self.port,
                          fabric.control_ip if fabric is not None else None)
        write_atomic(self.directory / "server.json", json.dumps(
            {"url": self.url, "port": self.port, "host": self.host, "pid": os.getpid(),
             "node_config_url": ctx.node_config_url,
             "control_address": ctx.boot.control_address()}) + "\n")
        log.info("emulator serving %s (state %s)", self.url, store.path)

    def stop(self) -> None:
        self.pressure.close()
        if self.reclaimer is not None:
            self.reclaimer.stop()
        if self._tls is not None:
            self._tls.stop()
            self._tls = None
        if self.ctx is not None:
            if self.slivers is not None:
                self.slivers.reaper.stop()  # teardowns still running finish first
            if self.ctx.boot is not None:
                self.ctx.boot.stop()
            if self._tmcd is not None:
                self._tmcd.stop()
                self._tmcd = None
            self.ctx.store.close()
            self.ctx = None
        if self._lock_fd is not None:
            (self.directory / "server.json").unlink(missing_ok=True)
        self._unlock_directory()

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- where
    @property
    def port(self) -> int:
        if self._tls is None:
            raise ElasticSliceError("emulator is not running")
        return self._tls.port

    @property
    def url(self) -> str:
        """The XML-RPC base URL; append ``/sa``, ``/cm``, ``/dynslice``."""
        return base_url(self.host, self.port)

    @property
    def config_path(self) -> Path:
        return self.directory / "elasticslice.conf"
