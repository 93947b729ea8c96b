"""The emulator's physical nodes: the inventory file and the pool they are taken from.

An inventory is INI: one section per hardware type (``count``, ``cores``, ``memory`` in MiB,
``prefix`` for node names) and an ``[inventory]`` section (``default_hardware_type``: what
``demo --static`` asks for; ``images``). The pool maps requests to free nodes; it never
blocks and never waits.
"""
from __future__ import annotations

import configparser
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from elasticslice.emulator.geni import GeniFault
from elasticslice.emulator.store import BootState, ExecState, Holder, NodeRow, Store
from elasticslice.config import ini_error
from elasticslice.errors import ConfigError
from elasticslice.rpc.codes import GeniCode

DEFAULT_INVENTORY = """
[inventory]
default_hardware_type = m510
images = UBUNTU22-64-STD, UBUNTU20-64-STD, CENTOS8-64-STD

[m400]
count = 40
cores = 8
memory = 65536
prefix = ms01

[m510]
count = 20
cores = 8
memory = 65536
prefix = ms10

[xl170]
count = 10
cores = 10
memory = 65536
prefix = hp

[d430]
count = 8
cores = 16
memory = 65536
prefix = pc
"""


TYPE_KEYS = ("count", "cores", "memory", "prefix")
INVENTORY_KEYS = ("default_hardware_type", "images")
# Upper bounds: every node is a row and a directory, and XML-RPC integers are 32-bit.
LIMITS = {"count": 10_000, "cores": 4096, "memory": 2**31 - 1}


@dataclass(frozen=True)
class HardwareType:
    name: str
    count: int
    cores: int
    memory: int
    prefix: str

    def node_ids(self) -> list[str]:
        width = max(2, len(str(self.count)))
        return [f"{self.prefix}{i:0{width}d}" for i in range(1, self.count + 1)]


@dataclass
class Inventory:
    types: dict[str, HardwareType]
    default_type: str
    images: list[str] = field(default_factory=list)


def _int(parser: configparser.ConfigParser, section: str, key: str, where: str,
         default: int | None = None) -> int:
    raw = parser.get(section, key, fallback=None)
    if raw is None:
        if default is None:
            raise ConfigError("missing", key=f"{section}.{key}", path=where)
        return default
    try:
        value = int(raw)
    except ValueError as err:
        raise ConfigError(f"not an integer: {raw!r}", key=f"{section}.{key}", path=where) from err
    if value < 0 or (key != "count" and value == 0):
        raise ConfigError(f"must be positive: {raw!r}", key=f"{section}.{key}", path=where)
    if value > LIMITS[key]:
        raise ConfigError(f"at most {LIMITS[key]}: {raw!r}", key=f"{section}.{key}", path=where)
    return value


def _check_keys(parser: configparser.ConfigParser, section: str, known: tuple[str, ...],
                where: str) -> None:
    for key in parser.options(section):
        if key not in known:
            raise ConfigError(f"unknown key (known: {', '.join(known)})",
                              key=f"{section}.{key}", path=where)


def load_inventory(path: str | Path | None = None) -> Inventory:
    """Read an inventory file (the built-in default when ``path`` is None)."""
    parser = configparser.ConfigParser()
    where = str(path) if path else "<built-in inventory>"
    try:
        if path is None:
            parser.read_string(DEFAULT_INVENTORY, source=where)
        else:
            text = Path(path).read_text(encoding="utf-8")
            parser.read_string(text, source=where)
    except OSError as err:
        raise ConfigError(f"cannot read inventory: {err.strerror}", path=where) from err
    except configparser.Error as err:
        raise ConfigError(ini_error(err), path=where) from err
    types: dict[str, HardwareType] = {}
    prefixes: set[str] = set()
    node_ids: set[str] = set()
    for section in parser.sections():
        if section == "inventory":
            _check_keys(parser, section, INVENTORY_KEYS, where)
            continue
        _check_keys(parser, section, TYPE_KEYS, where)
        prefix = parser.get(section, "prefix", fallback=section).strip()
        if not prefix.isalnum() or prefix in prefixes:
            raise ConfigError(f"prefix must be alphanumeric and unique: {prefix!r}",
                              key=f"{section}.prefix", path=where)
        prefixes.add(prefix)
        types[section] = HardwareType(section, _int(parser, section, "count", where),
                                      _int(parser, section, "cores", where),
                                      _int(parser, section, "memory", where, 4096), prefix)
        names = types[section].node_ids()
        if node_ids.intersection(names):
            raise ConfigError(f"node names {prefix}... collide with another type's",
                              key=f"{section}.prefix", path=where)
        node_ids.update(names)
    if not types:
        raise ConfigError("no hardware types (one section per type)", path=where)
    default = parser.get("inventory", "default_hardware_type", fallback=next(iter(types)))
    if default not in types:
        raise ConfigError(f"unknown hardware type {default!r}",
                          key="inventory.default_hardware_type", path=where)
    images = [i.strip() for i in parser.get("inventory", "images",
                                            fallback="UBUNTU22-64-STD").split(",") if i.strip()]
    return Inventory(types, default, images)


def sync_nodes(store: Store, inventory: Inventory) -> None:
    """Create the inventory's nodes that the store does not have yet; keep the others."""
    with store.transaction():
        known = {n.node_id for n in store.nodes()}
        for hw in inventory.types.values():
            for node_id in hw.node_ids():
                if node_id not in known:
                    store.put_node(NodeRow(node_id, hw.name, hw.cores, hw.memory))


@dataclass
class NodeRequest:
    """One node a CreateSliver or AddNodes asks for."""

    client_id: str
    hardware_type: str | None = None
    component_id: str | None = None


def pick_nodes(store: Store, inventory: Inventory, requests: list[NodeRequest],
               reloading: set[str] | frozenset[str] = frozenset(),
               rng: random.Random | None = None) -> list[NodeRow]:
    """Free nodes for ``requests`` (same order), or the GENI refusal CloudLab would give.

    A request naming a node gets that node; one with a hardware type the first free nodes of
    that type; one with neither (every AddNodes node without ``node``, an RSpec node without
    a type) ANY free node of any type, drawn at random with ``rng`` (seeded by ``serve
    --seed``): CloudLab's CM gives such a node the type ``pc`` (GeniCM.pm.in: "Need some
    kind of default"), the class every PC type belongs to, and its mapper picks among them.
    Nodes in ``reloading`` (their last slice's processes are still being stopped) are not
    free yet."""
    free = [n for n in store.nodes(holder=Holder.FREE) if n.node_id not in reloading]
    by_id = {n.node_id: n for n in free}
    taken: set[str] = set()
    picked: list[NodeRow | None] = [None] * len(requests)
    for i, req in enumerate(requests):
        if req.component_id:
            node_id = req.component_id.rsplit("+", 1)[-1]
            node = by_id.get(node_id)
            if node is None or node_id in taken:
                exists = store.get_node(node_id)
                if exists is None:
                    raise GeniFault(GeniCode.SEARCHFAILED, f"No such node: {node_id}")
                why = " (being reloaded)" if node_id in reloading else ""
                raise GeniFault(GeniCode.BADARGS, f"Node {node_id} is reserved{why} "
                                                  f"(asked for {req.client_id})")
            if req.hardware_type and node.hardware_type != req.hardware_type:
                raise GeniFault(GeniCode.MAPPING_IMPOSSIBLE,
                                f"Node {node_id} is a {node.hardware_type}, not a "
                                f"{req.hardware_type}")
            taken.add(node_id)
            picked[i] = node
    wanted: dict[str, list[int]] = {}
    anything: list[int] = []
    for i, req in enumerate(requests):
        if picked[i] is None:
            if req.hardware_type is None:
                anything.append(i)
                continue
            if req.hardware_type not in inventory.types:
                raise GeniFault(GeniCode.SEARCHFAILED,
                                f"No such hardware type: {req.hardware_type}")
            wanted.setdefault(req.hardware_type, []).append(i)
    for hw, slots in wanted.items():
        available = [n for n in free if n.hardware_type == hw and n.node_id not in taken]
        if len(available) < len(slots):
            raise GeniFault(GeniCode.INSUFFICIENT_NODES,
                            f"Not enough free nodes of type {hw}: {len(slots)} requested, "
                            f"{len(available)} available")
        for slot, node in zip(slots, available):
            taken.add(node.node_id)
            picked[slot] = node
    if anything:
        available = [n for n in free if n.node_id not in taken]
        if len(available) < len(anything):
            raise GeniFault(GeniCode.INSUFFICIENT_NODES,
                            f"Not enough free nodes: {len(anything)} requested, "
                            f"{len(available)} available")
        for slot, node in zip(anything, (rng or random.Random()).sample(available,
                                                                        len(anything))):
            picked[slot] = node
    return [n for n in picked if n is not None]


def release(node: NodeRow) -> NodeRow:
    """The node back in the free pool, forgetting everything about its last holder."""
    node.holder = Holder.FREE
    node.tenant = node.slice_urn = node.client_id = node.sliver_urn = ""
    node.disk_image = node.startup = ""
    node.shell = "sh"
    node.sliver_type = "raw-pc"
    node.tarballs, node.interfaces, node.attrs = [], [], {}
    node.boot_state = BootState.NOTREADY
    node.boot_started = node.allocated_at = 0.0
    node.execute_state = ExecState.NONE
    node.execute_status = None
    node.value = 1.0
    return node


def hold_for_tenant(node: NodeRow, tenant: str, now: float | None = None) -> NodeRow:
    release(node)
    node.holder = Holder.TENANT
    node.tenant = tenant
    node.allocated_at = time.time() if now is None else now
    return node


def counts(store: Store) -> dict[str, dict[str, int]]:
    """Per hardware type: how many nodes are free, in slices, and held by other tenants."""
    out: dict[str, dict[str, int]] = {}
    for node in store.nodes():
        row = out.setdefault(node.hardware_type, {h.value: 0 for h in Holder})
        row[node.holder.value] += 1
    return out
