"""CM v2 ``AddNodes`` arguments, as CloudLab's CM reads them, from node specifications and back.

Source: Emulab's ``protogeni/lib/GeniCMV2.pm.in``, ``AddNodes``. The ``nodes`` struct maps
each new node's client_id to a struct of (all optional) exactly five keys, which the CM
pastes into a request node's XML (single-quoted attributes) and maps as any request:

- ``diskimage``: an image URN (``<disk_image name='...'/>``);
- ``startup``: ONE command string (``<execute shell='/bin/bash' command='...'/>``; a list
  would arrive in Perl as an array reference and become the command ``ARRAY(0x...)``); it
  runs with ``/bin/sh -c`` (one execute service) and must pass the startup rule of
  :func:`~elasticslice.rspec.rules.startup_problem` (printable ASCII, at most 255
  characters);
- ``tarballs``: a list of URL strings, each installed at ``/`` (a ``[url, path]`` pair is
  not understood);
- ``lans``: names of the sliver's existing links (the CM gives the address);
- ``node``: a physical node name such as ``pc17``, which becomes the ``component_id``.

Nothing else is read (CloudLab silently ignores any other key: the box refuses it), and in
particular no hardware type: to get a node of a type, name a free node of that type from the
CM's advertisement as ``node`` (:func:`pin_add_args`). A ``'``, ``<`` or ``&`` in a value
breaks the CM's XML: ERROR "Could not parse XML for <client_id>" (:class:`AddNodesXMLError`).

Two shapes of the struct exist here. The *wire* struct holds the five keys only (what
:func:`nodespecs_from_add_args` accepts, the box and the client alike). The *helper's*
struct (the seed's ``get_add_args`` API, :func:`add_nodes_args`) may also hold
``hardware_type``, a wish that :func:`pin_add_args` turns into ``node`` before the call.
Values are never ``None``: XML-RPC cannot send it, so unset keys are left out.
"""
from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from elasticslice.errors import RSpecError
from elasticslice.rspec.model import NodeSpec
from elasticslice.rspec.rules import (
    CLIENT_ID_RULE, IMAGE_URN_RULE, client_id_problem, image_problem, shown, startup_problem,
)
from elasticslice.rspec.tarball import ADDNODES_INSTALL_PATH, tarball_problem

log = logging.getLogger(__name__)

#: The keys CloudLab's CM reads per node (GeniCMV2.pm.in ``AddNodes``): the wire struct.
ADD_NODE_KEYS = frozenset({"diskimage", "startup", "tarballs", "lans", "node"})
#: The helper's struct may also wish for a hardware type; it is never sent.
WISH_KEY = "hardware_type"
#: Characters that break the single-quoted XML attributes the CM pastes values into.
XML_BREAKERS = ("'", "<", "&")
#: The shells a single startup command may ask for: the CM runs it with /bin/sh -c.
SH = frozenset({"", "sh", "/bin/sh"})
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
KEYS_READ = "diskimage, startup, tarballs, lans and node"


class BadAddNodesArgs(RSpecError):
    """``AddNodes`` arguments are malformed; ``key`` names the offending entry, e.g.
    ``nodes[node-3].startup``. A CM answers these with BADARGS."""

    def __init__(self, message: str, *, key: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


class AddNodesXMLError(BadAddNodesArgs):
    """A value holds ``'``, ``<`` or ``&``: CloudLab's CM cannot parse the XML it pastes the
    value into and answers ERROR (2) "Could not parse XML for <client_id>: ..."."""

    def __init__(self, client_id: str, key: str, char: str) -> None:
        self.client_id = client_id
        self.key = key
        RSpecError.__init__(self, f"Could not parse XML for {shown(client_id)}: {key} holds "
                                  f"{char!r} (the CM pastes it into a single-quoted XML "
                                  "attribute)")


def _node_name(component_id: str) -> str:
    """``urn:publicid:IDN+emulab.net+node+pc17`` → ``pc17``; a bare name is kept."""
    if component_id.startswith("urn:publicid:IDN+"):
        return component_id.rsplit("+", 1)[-1]
    return component_id


def add_nodes_args(nodes: Sequence[NodeSpec],
                   lans: Sequence[str] | Mapping[str, Sequence[str]] = ()) -> dict[str, dict]:
    """The helper's ``AddNodes`` struct for ``nodes``: the five keys, plus ``hardware_type``
    for a node that wants a type and pins no node (:func:`pin_add_args` turns it into
    ``node``).

    ``lans`` adds LAN memberships by name: a sequence applies to every node, a mapping gives
    them per client_id; they come after each node's own ``NodeSpec.lans``. What the CM cannot
    take raises :class:`BadAddNodesArgs` naming the key, before any call: more than one
    execute, a shell other than sh, a command that fails the startup rule, a tarball path
    other than ``/``, a LAN interface with an address (the CM gives it).
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
        if spec.component_id:
            args["node"] = _node_name(spec.component_id)
        elif spec.hardware_type:
            args[WISH_KEY] = spec.hardware_type
        if spec.executes:
            args["startup"] = _startup_of(spec.executes, f"{key}.startup")
        if spec.installs:
            args["tarballs"] = _tarball_args(spec.installs, f"{key}.tarballs")
        extra = lans.get(cid, ()) if isinstance(lans, Mapping) else lans
        names = list(spec.lans) + [name for name in extra if name not in spec.lans]
        for index, iface in enumerate(spec.interfaces[:len(names)]):
            if iface[1]:
                raise BadAddNodesArgs(
                    f"AddNodes takes LAN names only and the CM gives the address ({iface[1]} "
                    f"asked for {names[index]})", key=f"{key}.lans[{index}]")
        if names:
            args["lans"] = names
        result[cid] = args
    if result:  # what the CM would refuse in the values too (the startup rule, XML)
        check_add_args({cid: {k: v for k, v in a.items() if k != WISH_KEY}
                        for cid, a in result.items()})
    return result


def _startup_of(executes: Sequence[tuple[str, str]], key: str) -> str:
    if len(executes) > 1:
        raise BadAddNodesArgs(f"AddNodes takes one startup command; got {len(executes)} "
                              "executes", key=key)
    shell, command = executes[0]
    if (shell or "") not in SH:
        raise BadAddNodesArgs(f"AddNodes has no shell choice: CloudLab runs the startup "
                              f"command with /bin/sh (asked for {shown(shell)!r})", key=key)
    return command


def _tarball_args(installs: Sequence[tuple[str, str]], key: str) -> list[str]:
    """Bare URLs: CloudLab installs each AddNodes tarball at ``/``."""
    out: list[str] = []
    for index, (url, path) in enumerate(installs):
        problem = tarball_problem(url)
        if problem:
            raise BadAddNodesArgs(problem, key=f"{key}[{index}]")
        if (path or ADDNODES_INSTALL_PATH) != ADDNODES_INSTALL_PATH:
            raise BadAddNodesArgs(f"AddNodes installs tarballs at / (asked for {shown(path)!r})"
                                  ": root the tarball's files at / instead",
                                  key=f"{key}[{index}]")
        out.append(url)
    return out


def pin_add_args(args: Mapping[str, Mapping[str, Any]], free: Mapping[str, Sequence[str]],
                 *, rng: random.Random | None = None) -> tuple[dict[str, dict], list[str]]:
    """The wire struct of a helper's struct, and the client_ids left out.

    A node wishing for a ``hardware_type`` without a ``node`` gets ``node`` = a free node of
    that type from ``free`` (hardware type -> free node names, from the CM's advertisement
    with ``available``), chosen at random (two clients picking from one advertisement
    rarely collide), each node a different one and none a node another entry names. A node
    with no free node of its type left is left out (its client_id returned). A node naming
    ``node`` keeps it; ``hardware_type`` is dropped everywhere.
    """
    rng = rng or random.Random()
    used = {str(a["node"]) for a in args.values() if isinstance(a, Mapping) and "node" in a}
    wire: dict[str, dict] = {}
    left_out: list[str] = []
    for cid, node_args in args.items():
        if not isinstance(node_args, Mapping):
            wire[cid] = node_args  # type: ignore[assignment]  (refused by the check)
            continue
        out = {k: v for k, v in node_args.items() if k != WISH_KEY}
        wish = node_args.get(WISH_KEY)
        if wish and "node" not in out:
            choices = [n for n in free.get(str(wish), ()) if n not in used]
            if not choices:
                left_out.append(cid)
                continue
            out["node"] = rng.choice(choices)
            used.add(out["node"])
        wire[cid] = out
    return wire, left_out


def _checked_key(cid: Any) -> str:
    """``nodes[<client_id>]`` for a valid client_id; BadAddNodesArgs otherwise (naming at
    most the first 32 characters: a hostile id must not flood the answer), or
    AddNodesXMLError when it would break the CM's XML."""
    if client_id_problem(cid) is None:
        return f"nodes[{cid}]"
    if isinstance(cid, str):
        _xml_safe(cid, cid, f"nodes[{shown(cid)}] (its client_id)")
    raise BadAddNodesArgs(CLIENT_ID_RULE, key=f"nodes[{shown(cid)}]")


def _xml_safe(cid: str, value: str, key: str) -> None:
    for char in XML_BREAKERS:
        if char in value:
            raise AddNodesXMLError(cid, key, char)


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadAddNodesArgs(f"expected a non-empty string, got {_kind(value)}", key=key)
    return value


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def check_add_args(nodes: Any) -> None:
    """Raise :class:`BadAddNodesArgs` (or :class:`AddNodesXMLError`) naming the first key
    CloudLab's CM would refuse or misread in a wire ``nodes`` struct: what the client checks
    before it calls AddNodes (the box's CM applies the same rules)."""
    nodespecs_from_add_args(nodes)


def nodespecs_from_add_args(nodes: Any) -> list[NodeSpec]:
    """Check a wire ``AddNodes`` ``nodes`` struct as CloudLab's CM reads it and turn it into
    :class:`NodeSpec` records.

    ``node`` becomes ``component_id`` (the bare name); each LAN name becomes ``lans`` plus
    an interface ``<client_id>:<lan>`` (the CM's name for it); the startup command becomes
    one ``("sh", command)`` execute and each tarball a ``(url, "/")`` install. Raises
    :class:`BadAddNodesArgs` naming the first bad key (an unknown key too, which CloudLab
    would silently ignore: the box refuses it), :class:`AddNodesXMLError` for a value that
    breaks the CM's XML.
    """
    if not isinstance(nodes, Mapping):
        raise BadAddNodesArgs(f"nodes is not a hash (a struct of client_id -> node), got "
                              f"{_kind(nodes)}", key="nodes")
    if not nodes:
        raise BadAddNodesArgs("no nodes given", key="nodes")
    return [_nodespec(cid, args) for cid, args in nodes.items()]


def _nodespec(cid: Any, args: Any) -> NodeSpec:
    key = _checked_key(cid)
    if not isinstance(args, Mapping):
        raise BadAddNodesArgs(f"{shown(cid)} is not a hash, got {_kind(args)}", key=key)
    unknown = sorted(set(args) - ADD_NODE_KEYS)
    if unknown:
        raise BadAddNodesArgs(_unknown_key(unknown[0]), key=f"{key}.{shown(unknown[0])}")
    spec = NodeSpec(client_id=cid)
    if "node" in args:
        spec.component_id = _physical_node(args["node"], f"{key}.node")
    if "lans" in args:
        spec.lans = _lan_names(cid, args["lans"], f"{key}.lans")
        spec.interfaces = [(f"{cid}:{lan}", None, None) for lan in spec.lans]
    urls = _tarball_urls(cid, args["tarballs"], f"{key}.tarballs") if "tarballs" in args else []
    if "diskimage" in args:
        spec.disk_image = _str(args["diskimage"], f"{key}.diskimage")
        _xml_safe(cid, spec.disk_image, f"{key}.diskimage")
    for index, url in enumerate(urls):
        _xml_safe(cid, url, f"{key}.tarballs[{index}]")
    for index, lan in enumerate(spec.lans):
        _xml_safe(cid, lan, f"{key}.lans[{index}]")
    if "startup" in args:
        spec.executes = [("sh", _startup(cid, args["startup"], f"{key}.startup"))]
    if spec.disk_image and image_problem(spec.disk_image):
        raise BadAddNodesArgs(f"{shown(spec.disk_image, 80)!r} is {IMAGE_URN_RULE}",
                              key=f"{key}.diskimage")
    spec.installs = [(url, ADDNODES_INSTALL_PATH) for url in urls]
    return spec


def _unknown_key(name: Any) -> str:
    why = (f"unknown key: CloudLab's CM reads only {KEYS_READ} and would silently ignore it "
           "(the box refuses it)")
    if name == WISH_KEY:
        why += ("; AddNodes has no hardware type: name a free node of that type from the "
                "advertisement as node")
    return why


def _physical_node(value: Any, key: str) -> str:
    name = _str(value, key)
    if not NODE_NAME.fullmatch(name):
        raise BadAddNodesArgs(f"Physical node {shown(name, 80)} does not exist (want a bare "
                              "physical node name such as pc17: the CM makes the node's URN "
                              "of it)", key=key)
    return name


def _startup(cid: str, value: Any, key: str) -> str:
    if isinstance(value, (list, tuple)):
        raise BadAddNodesArgs("a list: CloudLab's CM would paste it as the command "
                              "ARRAY(0x...) (one command string, run with /bin/sh)", key=key)
    if not isinstance(value, str):
        raise BadAddNodesArgs(f"expected one command string, got {_kind(value)}", key=key)
    _xml_safe(cid, value, key)
    if not value:
        raise BadAddNodesArgs("Invalid service command: no command provided", key=key)
    problem = startup_problem(value)
    if problem:
        raise BadAddNodesArgs(problem, key=key)
    return value


def _tarball_urls(cid: str, value: Any, key: str) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise BadAddNodesArgs(f"tarballs for {shown(cid)} is not a list (got {_kind(value)})",
                              key=key)
    out = []
    for index, item in enumerate(value):
        where = f"{key}[{index}]"
        if isinstance(item, (list, tuple)):
            raise BadAddNodesArgs("a list, such as a [url, path] pair: CloudLab's CM installs "
                                  "AddNodes tarballs at / and would paste it as the URL "
                                  "ARRAY(0x...) (send the URL)", key=where)
        out.append(_str(item, where))
    return out


def _lan_names(cid: str, value: Any, key: str) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise BadAddNodesArgs(f"lans for {shown(cid)} is not a list (got {_kind(value)})",
                              key=key)
    out = []
    for index, item in enumerate(value):
        where = f"{key}[{index}]"
        if isinstance(item, Mapping):
            raise BadAddNodesArgs("a LAN struct: CloudLab's CM takes LAN names only (it would "
                                  "look for a LAN named HASH(0x...)); the CM gives the "
                                  "address", key=where)
        out.append(_str(item, where))
    return out
