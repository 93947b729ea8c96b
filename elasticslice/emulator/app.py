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

from elasticslice.emulator.aggregate import Aggregate
from elasticslice.emulator.authority import Authority, Identity
from elasticslice.emulator.clusters import Cluster
from elasticslice.emulator.context import Context, Settings
from elasticslice.emulator.dispatch import EmulatorDispatcher
from elasticslice.emulator.dynamic import Reclaimer
from elasticslice.emulator.faults import FaultInjector
from elasticslice.emulator.pace import Latency
from elasticslice.emulator.pool import Inventory, load_inventory, sync_nodes
from elasticslice.emulator.pressure import Pressure
from elasticslice.emulator.sa import SliceAuthority
from elasticslice.emulator.server import TLSServer, server_context
from elasticslice.emulator.setup import (EmulatorConfig, base_url, load_config, lock_directory,
                                         write_atomic, write_client_conf)
from elasticslice.emulator.sliver import SliverOps
from elasticslice.emulator.store import Store
from elasticslice.errors import ConfigError, ElasticSliceError

log = logging.getLogger(__name__)


class EmulatorServer:
    """SA, CM v2, the dynamic-slice server and the admin service on one HTTPS port (a CM,
    dynamic-slice server and admin service per cluster in a box of several: clusters.py)."""

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
        self.ctx: Context | None = None  # the (first) CM's
        self.sa_ctx: Context | None = None  # the SA's (the CM's too in a box of one CM)
        self.aggregates: list[Aggregate] = []  # every CM (clusters.py), the first first
        self.reclaimer: Reclaimer | None = None
        self.slivers: SliverOps | None = None
        self._tls: TLSServer | None = None
        self._stores: list[Store] = []
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
        clusters = cfg.cluster_list(self.directory)
        if clusters and self.inventory_path is not None:
            raise ConfigError("this box has clusters, each with its own inventory (init --cm "
                              "NAME=FILE); --inventory is for a box of one CM",
                              key="inventory", path=str(self.directory))
        unknown = sorted(self.pressure.clusters() - {c.name for c in clusters})
        if unknown:
            raise ConfigError(f"--slow/--busy name cluster {unknown[0]!r}, which this box "
                              f"does not have ({', '.join(c.name for c in clusters) or 'none'})",
                              key="slow", path=str(self.directory))
        authority = self._authority(identity)
        store = Store(self.directory / "state.db").open()
        self._stores = [store]
        try:
            if clusters:
                sa_ctx, cms = self._clusters(cfg, identity, authority, store, clusters)
            else:
                sa_ctx = self._context(cfg, identity, authority, store,
                                       load_inventory(self.inventory_path))
                cms = [sa_ctx]
            self.aggregates = [Aggregate.build(ctx, self.seed) for ctx in cms]
            first = self.aggregates[0]
            dispatcher = EmulatorDispatcher(
                [SliceAuthority(sa_ctx), *first.services()], self.faults, identity.admin_urn,
                self.pressure, self.settings.latency,
                clusters={c.name: a.services() for c, a in zip(clusters, self.aggregates)})
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
            self.aggregates = []  # built, never started: nothing of theirs runs
            self._close_stores()
            raise
        self.sa_ctx, self.ctx = sa_ctx, first.ctx
        self.slivers, self.reclaimer = first.slivers, first.reclaimer
        url = base_url(self.host, self._tls.port)
        for cluster, agg in zip(clusters or [None], self.aggregates):
            agg.start_nodes(url if cluster is None else cluster.url(url))
        self._tls.start()
        for agg in self.aggregates:
            agg.reclaimer.start()
        fabric = first.ctx.boot.network() if first.ctx.boot is not None else None
        write_client_conf(self.directory, self.host, self.port,
                          fabric.control_ip if fabric is not None else None)
        info = {"url": self.url, "port": self.port, "host": self.host, "pid": os.getpid(),
                "node_config_url": first.ctx.node_config_url,
                "control_address": first.control_address()}
        if clusters:
            info["clusters"] = {c.name: {"url": a.ctx.url, "cm_urn": a.ctx.identity.cm_urn,
                                         "node_config_url": a.ctx.node_config_url,
                                         "control_address": a.control_address()}
                                for c, a in zip(clusters, self.aggregates)}
        write_atomic(self.directory / "server.json", json.dumps(info) + "\n")
        log.info("emulator serving %s (state %s)", self.url, store.path)

    def _authority(self, identity: Identity, home: Path | None = None) -> Authority:
        try:
            return Authority(self.directory, identity, home).load()
        except OSError as err:
            raise ConfigError(f"emulator keys missing: {err}", path=str(self.directory)) from err

    def _context(self, cfg: EmulatorConfig, identity: Identity, authority: Authority,
                 store: Store, inventory: Inventory, cluster: Cluster | None = None
                 ) -> Context:
        sync_nodes(store, inventory)
        return Context(self.directory, cfg, identity, authority, store, inventory,
                       self.settings, self.faults, cluster=cluster.name if cluster else "",
                       home=cluster.home if cluster else None)

    def _clusters(self, cfg: EmulatorConfig, identity: Identity, authority: Authority,
                  store: Store, clusters: list[Cluster]) -> tuple[Context, list[Context]]:
        """The SA's context and each cluster's CM (its keys, state, inventory, nodes)."""
        cms = []
        for cluster in clusters:
            inventory = load_inventory(cluster.inventory)
            own = Store(cluster.home / "state.db", slices=store).open()
            self._stores.append(own)
            cms.append(self._context(cfg, cluster.identity,
                                     self._authority(cluster.identity, cluster.home), own,
                                     inventory, cluster))
        sa_ctx = Context(self.directory, cfg, identity, authority, store, cms[0].inventory,
                         self.settings, self.faults, box=cms)
        for ctx in cms:
            ctx.box = cms
        return sa_ctx, cms

    def _close_stores(self) -> None:
        for store in reversed(self._stores):
            store.close()
        self._stores = []

    def stop(self) -> None:
        self.pressure.close()
        for agg in self.aggregates:
            agg.reclaimer.stop()
        if self._tls is not None:
            self._tls.stop()
            self._tls = None
        for agg in self.aggregates:
            agg.stop()
        self.aggregates = []
        self._close_stores()
        self.ctx = self.sa_ctx = None
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
