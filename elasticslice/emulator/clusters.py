"""The box's clusters: several CMs behind one SA, as CloudLab's Utah, Wisconsin and Clemson.

``emulator init --cm utah --cm wisc`` makes a box whose SA (``/protogeni/xmlrpc/sa``, the
box's domain D) registers slices once, and whose CMs are each a cluster of their own:

* its domain ``<name>.D`` (``urn:publicid:IDN+utah.emulab.test+authority+cm``), its CM
  certificate ``D/cms/<name>/cm.pem`` (it signs the cluster's sliver credentials, and is
  the client certificate of the cluster's callbacks);
* its inventory ``D/cms/<name>/inventory.ini`` (built in for ``utah``, ``wisc`` and
  ``clemson``, with CloudLab's hardware types there; ``--cm NAME=FILE`` for another);
* its state ``D/cms/<name>/state.db`` (slivers, nodes, endpoints, reclamations; the
  slices are the SA's), its nodes ``D/cms/<name>/nodes/``, its node network, reclaimer,
  tenants and node configuration server;
* its URLs ``https://host:port/cluster/<name>/protogeni/xmlrpc/{cm,dynslice,admin}``. The
  first cluster is also served at the SA's ``/protogeni/xmlrpc/{cm,dynslice,admin}``, as
  Emulab's CM is at the SA's host.

A box without ``--cm`` is one CM in the SA's domain, in ``D`` itself, as it always was.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from elasticslice.errors import ConfigError

if TYPE_CHECKING:
    from elasticslice.emulator.authority import Identity

NAME = re.compile(r"[a-z][a-z0-9]{0,15}")
NAME_RULE = "a lowercase letter, then lowercase letters or digits; at most 16"
MAX = 8  # clusters in one box

# CloudLab's clusters and some of their hardware types (counts scaled down): the default
# type, then each (type, count, cores, memory MB, node name prefix).
IMAGES = "UBUNTU22-64-STD, UBUNTU20-64-STD"
TYPES = {
    "utah": ("m510", [("m400", 24, 8, 65536, "ms04"), ("m510", 16, 8, 65536, "ms10"),
                      ("xl170", 8, 10, 65536, "hp")]),
    "wisc": ("c220g5", [("c220g1", 10, 16, 131072, "c220g1n"),
                        ("c220g5", 16, 20, 196608, "c220g5n"),
                        ("c240g5", 6, 20, 196608, "c240g5n")]),
    "clemson": ("c6320", [("c6320", 16, 28, 262144, "clnode"),
                          ("c8220", 8, 20, 262144, "clgpu")]),
}


def inventory_text(default: str, types: list[tuple[str, int, int, int, str]],
                   images: str | None = IMAGES) -> str:
    """An inventory INI (``serve --inventory``, ``--cm NAME=FILE``): ``default`` the
    default hardware type, ``types`` each ``(type, count, cores, memory MB, node name
    prefix)``; ``images`` the line of images its nodes may boot (None: no line)."""
    head = f"[inventory]\ndefault_hardware_type = {default}\n"
    if images:
        head += f"images = {images}\n"
    return head + "".join(f"\n[{hw}]\ncount = {count}\ncores = {cores}\nmemory = {memory}\n"
                          f"prefix = {prefix}\n" for hw, count, cores, memory, prefix in types)


BUILTIN = {name: inventory_text(default, types) for name, (default, types) in TYPES.items()}


@dataclass(frozen=True)
class Cluster:
    """One CM of the box: its name, its home ``D/cms/<name>`` and its domain."""

    name: str
    home: Path
    domain: str

    @property
    def identity(self) -> Identity:
        from elasticslice.emulator.authority import Identity
        return Identity(self.domain)

    @property
    def inventory(self) -> Path:
        return self.home / "inventory.ini"

    def url(self, base: str) -> str:
        """This cluster's XML-RPC base, from the SA's (``.../protogeni/xmlrpc``)."""
        root, _, tail = base.partition("/protogeni/xmlrpc")
        return f"{root}/cluster/{self.name}/protogeni/xmlrpc{tail}"


def clusters_of(directory: Path, domain: str, names: list[str]) -> list[Cluster]:
    return [Cluster(n, directory / "cms" / n, f"{n}.{domain}") for n in names]


def parse_specs(specs: tuple[str, ...] | list[str]) -> list[tuple[str, Path | None]]:
    """``--cm NAME`` or ``--cm NAME=INVENTORY`` options: (name, inventory file or None);
    one clear line for an unknown, bad or repeated name."""
    out: list[tuple[str, Path | None]] = []
    for spec in specs:
        name, eq, file = spec.partition("=")
        if not NAME.fullmatch(name):
            raise ConfigError(f"invalid cluster name {name!r} ({NAME_RULE})", key="cm")
        if any(name == seen for seen, _ in out):
            raise ConfigError(f"cluster {name!r} given twice", key="cm")
        if eq and not file:
            raise ConfigError(f"cluster {name!r}: no inventory file after '='", key="cm")
        if not eq and name not in BUILTIN:
            raise ConfigError(f"unknown cluster {name!r} (built in: {', '.join(BUILTIN)}; "
                              f"another needs its inventory: --cm {name}=FILE)", key="cm")
        if eq:
            from elasticslice.emulator.pool import load_inventory
            load_inventory(file)  # a bad file is named here, before anything is written
        out.append((name, Path(file) if eq else None))
    if len(out) > MAX:
        raise ConfigError(f"at most {MAX} clusters in one box (got {len(out)})", key="cm")
    return out


def write_inventories(directory: Path, specs: list[tuple[str, Path | None]]) -> list[str]:
    """Keep a copy of each cluster's inventory in its home; the names, in order."""
    texts = {name: BUILTIN[name] if file is None else file.read_text(encoding="utf-8")
             for name, file in specs}
    shutil.rmtree(directory / "cms", ignore_errors=True)
    for name, text in texts.items():
        home = directory / "cms" / name
        (home / "nodes").mkdir(parents=True, exist_ok=True)
        (home / "inventory.ini").write_text(text.lstrip("\n"), encoding="utf-8")
    return list(texts)


def pick(directory: Path, name: str | None) -> Cluster | None:
    """The cluster an admin command names (``--cm``; the first when none is named), or None
    for a box of one CM; one clear line for a name the box does not have."""
    from elasticslice.emulator.setup import load_config
    d = Path(directory).resolve()
    found = load_config(d).cluster_list(d)
    if name is None:
        return found[0] if found else None
    if not found:
        raise ConfigError(f"no cluster {name!r}: this box has one CM (init had no --cm)",
                          key="cm", path=str(d))
    for cluster in found:
        if cluster.name == name:
            return cluster
    raise ConfigError(f"no cluster {name!r} (this box has: "
                      f"{', '.join(c.name for c in found)})", key="cm", path=str(d))
