"""What every part of a running emulator shares: settings, names, keys, state, pool."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from elasticslice.emulator.authority import Authority, Identity
from elasticslice.emulator.faults import FaultInjector
from elasticslice.emulator.pace import Latency
from elasticslice.emulator.pool import Inventory
from elasticslice.emulator.setup import EmulatorConfig
from elasticslice.emulator.store import Store

if TYPE_CHECKING:
    from elasticslice.emulator.boot import BootRunner


@dataclass
class Settings:
    """Tunable behaviour of a running emulator (``serve`` options)."""

    boot_delay: float = 5.0
    notify_interval: float = 10.0
    max_wait: int = 60
    default_slice_hours: float = 16.0
    max_slice_days: float = 14.0
    allow_remote_endpoints: bool = False
    tenant_load: float = 0.0
    tenant_interval: float = 5.0
    callback_timeout: float = 10.0
    values_timeout: float = 2.0  # a SetResourceValues push to a client endpoint
    latency: Latency = field(default_factory=Latency)  # serve --latency / --time-scale
    seed: int | None = None  # serve --seed: the mapper's draws (and the faults', the pace's)


@dataclass
class Context:
    directory: Path
    config: EmulatorConfig
    identity: Identity
    authority: Authority
    store: Store
    inventory: Inventory
    settings: Settings
    faults: FaultInjector
    boot: BootRunner | None = None
    node_config_url: str = ""  # the node configuration server geni-get asks (tmcd.py)
    url: str = ""  # the XML-RPC base URL, once the server listens
    # A CM of a box of several (clusters.py): its name and home (D/cms/<name>: its state,
    # nodes, kept tarballs). A box of one CM: "" and the directory itself.
    cluster: str = ""
    home: Path | None = None
    box: list[Context] = field(default_factory=list)  # every CM of the box (itself too)
    # serialises CM/SA decisions that read and then change the pool
    lock: threading.RLock = field(default_factory=threading.RLock)
    wakeup: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # A slice credential's target_gid must be the GID the SA recorded for the slice.
        self.authority.known_gid = self._slice_gid
        if self.home is None:
            self.home = self.directory
        if not self.box:
            self.box = [self]

    @property
    def where(self) -> Path:
        """This CM's own folder: its state, nodes, kept tarballs (``home``)."""
        assert self.home is not None
        return self.home

    def control_ips(self) -> set[str]:
        """The control machine's addresses on the box's node networks (one per CM that
        has one): where the box's nodes reach this machine."""
        return {c.boot.fabric.control_ip for c in self.box
                if c.boot is not None and c.boot.fabric is not None}

    def _slice_gid(self, urn: str) -> str | None:
        row = self.store.get_slice(urn) if "+slice+" in urn else None
        return row.gid if row is not None else None

    def clock(self) -> float:
        return time.time()

    def next_id(self, name: str) -> int:
        """A persistent counter (sliver numbers, VLAN tags...)."""
        with self.store.transaction():
            value = int(self.store.get_meta(f"counter:{name}", "0") or "0") + 1
            self.store.set_meta(f"counter:{name}", str(value))
        return value

    def node_dir(self, node_id: str) -> Path:
        return self.where / "nodes" / node_id
