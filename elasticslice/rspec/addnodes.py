"""CM v2 ``AddNodes`` arguments from node specifications, and back.

The ``nodes`` struct of ``AddNodes`` maps each new node's client_id to a dict with (all
optional) ``diskimage`` (URN), ``startup`` (a command string, or ``[command, shell]``),
``tarballs`` (URL strings, each installed at ``/``: CloudLab's CM understands nothing else;
``[url, path]`` pairs are an extension of the emulator, sent only for a path other than ``/``,
with a warning), ``lans`` (existing link client_ids, or ``{name, address, netmask, type}``
dicts), ``hardware_type`` and ``node`` (a physical node id such as ``pc17``). Values are never
``None``: XML-RPC cannot send it, so unset keys are left out. Tarball URLs must pass the rule
of :mod:`elasticslice.rspec.tarball`.
"""
from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from elasticslice.errors import RSpecError
from elasticslice.rspec.model import NodeSpec
from elasticslice.rspec.rules import (
    CLIENT_ID_RULE, IMAGE_URN_RULE, client_id_problem, command_problem, image_problem, shown,
)
from elasticslice.rspec.tarball import ADDNODES_INSTALL_PATH, tarball_problem

log = logging.getLogger(__name__)

#: The keys the CM accepts per node.
ADD_NODE_KEYS = frozenset({"diskimage", "startup", "tarballs", "lans", "hardware_type", "node"})


class BadAddNodesArgs(RSpecError):
    """``AddNodes`` arguments are malformed; ``key`` names the offending entry, e.g.
    ``nodes[node-3].startup``. A CM answers these with BADARGS."""

    def __init__(self, message: str, *, key: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


def _node_id(component_id: str) -> str:
    """``urn:publicid:IDN+emulab.net+node+pc17`` → ``pc17``; a bare id is kept."""
    if component_id.startswith("urn:publicid:IDN+"):
        return component_id.rsplit("+", 1)[-1]
    return component_id


def add_nodes_args(nodes: Sequence[NodeSpec],
                   lans: Sequence[str] | Mapping[str, Sequence[str]] = ()) -> dict[str, dict]:
    """The ``nodes`` argument of CM v2 ``AddNodes`` for ``nodes``.

    ``lans`` adds LAN memberships: a sequence applies to every node, a mapping gives them
    per client_id; they come after each node's own ``NodeSpec.lans``. A LAN that pairs with
    an interface carrying an ip (by position) is sent as ``{name, address, netmask, type}``.
    At most one execute per node is possible (``startup``); more raise ``BadAddNodesArgs``.
    """
    result: dict[str, dict] = {}
    for spec in nodes:
        cid = spec.client_id
        key = _checked_key(cid)
        if cid in result:
            raise BadAddNodesArgs("duplicate client_id", key=key)
        args: dict[str, Any] = {}
        if spec.disk_image:
            args["diskimage"] = spec.disk_image
        if spec.hardware_type:
            args["hardware_type"] = spec.hardware_type
        if spec.component_id:
            args["node"] = _node_id(spec.component_id)
        if len(spec.executes) > 1:
            raise BadAddNodesArgs("AddNodes takes one startup command; got "
                                  f"{len(spec.executes)} executes", key=f"{key}.startup")
        if spec.executes:
            shell, command = spec.executes[0]
            args["startup"] = [command, shell] if shell else command
        if spec.installs:
            args["tarballs"] = _tarball_args(spec.installs, f"{key}.tarballs")
        extra = lans.get(cid, ()) if isinstance(lans, Mapping) else lans
        names = list(spec.lans) + [name for name in extra if name not in spec.lans]
        if names:
            args["lans"] = _lans(names, spec)
        result[cid] = args
    return result


def _tarball_args(installs: Sequence[tuple[str, str]], key: str) -> list[str | list[str]]:
    """Bare URLs (CloudLab installs each at ``/``); a pair for another path, with a warning."""
    out: list[str | list[str]] = []
    for index, (url, path) in enumerate(installs):
        problem = tarball_problem(url)
        if problem:
            raise BadAddNodesArgs(problem, key=f"{key}[{index}]")
        if (path or ADDNODES_INSTALL_PATH) == ADDNODES_INSTALL_PATH:
            out.append(url)
        else:
            log.warning("%s[%d]: AddNodes installs tarballs at / on CloudLab; [url, %s] is "
                        "understood by the emulator only", key, index, path)
            out.append([url, path])
    return out


def _lans(names: list[str], spec: NodeSpec) -> list[str | dict[str, str]]:
    out: list[str | dict[str, str]] = []
    for index, name in enumerate(names):
        iface = spec.interfaces[index] if index < len(spec.interfaces) else None
        if iface and iface[1]:
            entry = {"name": name, "address": iface[1], "type": "ipv4"}
            if iface[2]:
                entry["netmask"] = iface[2]
            out.append(entry)
        else:
            out.append(name)
    return out


def _checked_key(cid: Any) -> str:
    """``nodes[<client_id>]`` for a valid client_id; BadAddNodesArgs otherwise (naming at
    most the first 32 characters: a hostile id must not flood the answer)."""
    if client_id_problem(cid) is None:
        return f"nodes[{cid}]"
    raise BadAddNodesArgs(CLIENT_ID_RULE, key=f"nodes[{shown(cid)}]")


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadAddNodesArgs(f"expected a non-empty string, got {_kind(value)}", key=key)
    return value


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def nodespecs_from_add_args(nodes: Any) -> list[NodeSpec]:
    """Check an ``AddNodes`` ``nodes`` struct and turn it into :class:`NodeSpec` records.

    The inverse of :func:`add_nodes_args`: ``node`` becomes ``component_id`` (as given, a
    bare id or a URN); LAN dicts become ``lans`` plus an interface ``<client_id>:if<i>``
    with their address. Raises :class:`BadAddNodesArgs` naming the first bad key.
    """
    if not isinstance(nodes, Mapping):
        raise BadAddNodesArgs(f"expected a struct of client_id -> node, got {_kind(nodes)}",
                              key="nodes")
    if not nodes:
        raise BadAddNodesArgs("no nodes given", key="nodes")
    specs = []
    for cid, args in nodes.items():
        key = _checked_key(cid)
        if not isinstance(args, Mapping):
            raise BadAddNodesArgs(f"expected a struct, got {_kind(args)}", key=key)
        unknown = sorted(set(args) - ADD_NODE_KEYS)
        if unknown:
            raise BadAddNodesArgs(f"unknown key (allowed: {', '.join(sorted(ADD_NODE_KEYS))})",
                                  key=f"{key}.{unknown[0]}")
        spec = NodeSpec(client_id=cid)
        if "diskimage" in args:
            spec.disk_image = _str(args["diskimage"], f"{key}.diskimage")
            if image_problem(spec.disk_image):
                raise BadAddNodesArgs(f"{shown(spec.disk_image, 80)!r} is {IMAGE_URN_RULE}",
                                      key=f"{key}.diskimage")
        if "hardware_type" in args:
            spec.hardware_type = _str(args["hardware_type"], f"{key}.hardware_type")
        if "node" in args:
            spec.component_id = _str(args["node"], f"{key}.node")
        if "startup" in args:
            spec.executes = [_startup(args["startup"], f"{key}.startup")]
        if "tarballs" in args:
            spec.installs = _tarballs(args["tarballs"], f"{key}.tarballs")
        if "lans" in args:
            _parse_lans(spec, args["lans"], f"{key}.lans")
        specs.append(spec)
    return specs


def _startup(value: Any, key: str) -> tuple[str, str]:
    if isinstance(value, str):
        return ("sh", _command(value, key))
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return (_str(value[1], f"{key}[1]"), _command(value[0], f"{key}[0]"))
    raise BadAddNodesArgs(f"expected a command string or [command, shell], got {_kind(value)}",
                          key=key)


def _command(value: Any, key: str) -> str:
    problem = command_problem(_str(value, key))
    if problem:
        raise BadAddNodesArgs(problem, key=key)
    return value


def _ip(value: Any, key: str, netmask: bool = False) -> str:
    text = _str(value, key)
    try:
        if netmask:
            ipaddress.IPv4Network(f"0.0.0.0/{text}")
        else:
            ipaddress.IPv4Address(text)
    except ValueError:
        raise BadAddNodesArgs(f"expected an IPv4 {'netmask' if netmask else 'address'}, "
                              f"got {_kind(value)}", key=key) from None
    return text


def _tarballs(value: Any, key: str) -> list[tuple[str, str]]:
    if not isinstance(value, (list, tuple)):
        raise BadAddNodesArgs(f"expected a list, got {_kind(value)}", key=key)
    out = []
    for index, item in enumerate(value):
        where = f"{key}[{index}]"
        if isinstance(item, str):
            out.append((_str(item, where), "/"))
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            out.append((_str(item[0], f"{where}[0]"), _str(item[1], f"{where}[1]")))
        else:
            raise BadAddNodesArgs(f"expected a URL or [url, path], got {_kind(item)}", key=where)
    return out


def _parse_lans(spec: NodeSpec, value: Any, key: str) -> None:
    if not isinstance(value, (list, tuple)):
        raise BadAddNodesArgs(f"expected a list, got {_kind(value)}", key=key)
    for index, item in enumerate(value):
        where = f"{key}[{index}]"
        if isinstance(item, str):
            spec.lans.append(_str(item, where))
            spec.interfaces.append((f"{spec.client_id}:if{index}", None, None))
        elif isinstance(item, Mapping):
            bad = sorted(set(item) - {"name", "address", "netmask", "type"})
            if bad:
                raise BadAddNodesArgs("unknown key", key=f"{where}.{bad[0]}")
            spec.lans.append(_str(item.get("name"), f"{where}.name"))
            address = item.get("address")
            netmask = item.get("netmask")
            spec.interfaces.append((
                f"{spec.client_id}:if{index}",
                _ip(address, f"{where}.address") if address is not None else None,
                _ip(netmask, f"{where}.netmask", True) if netmask is not None else None))
        else:
            raise BadAddNodesArgs(f"expected a LAN name or struct, got {_kind(item)}", key=where)
