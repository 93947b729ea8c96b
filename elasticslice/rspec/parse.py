"""One parser for requests, manifests and advertisements, GENI v3 and ProtoGENI v2.

Schema validity is not required: real CloudLab manifests carry attributes the XSDs lack
(``host@ipv4``, ``emulab:vnode@hardware_type``), and we read them.

For speed the parser builds no tree: lxml reports elements to :class:`_RSpecTarget` as they
are parsed (tag and attribute dict, made in C), and the target fills the records by depth
(root 1, node/link 2, their children 3, grandchildren 4) with precomputed Clark names. A
5,000-node advertisement then costs about as much as lxml's own parse plus one small Python
call per element.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from elasticslice.errors import RSpecError
from elasticslice.isotime import parse_iso
from elasticslice.rspec.model import (
    NS_EMULAB, NS_V2, NS_V3, SLIVER_TYPE_ALIASES, Interface, Link, Login, Node, RSpec, RSpecType,
    rspec_type_problem,
)
from elasticslice.rspec.safexml import (
    DEFAULT_MAX_BYTES, SafeTarget, checked_bytes, parse_events,
)
from troy.collector import collector_paused

log = logging.getLogger(__name__)

_BOOL = {"true": True, "false": False, "1": True, "0": False, "True": True, "False": False,
         "yes": True, "no": False}
_TYPE_NAMES = {"request": RSpecType.REQUEST, "manifest": RSpecType.MANIFEST,
               "advertisement": RSpecType.ADVERTISEMENT, "ad": RSpecType.ADVERTISEMENT}
_E_ROUTABLE = f"{{{NS_EMULAB}}}routable_control_ip"
_E_VNODE = f"{{{NS_EMULAB}}}vnode"
_E_LINK_FLAGS = {f"{{{NS_EMULAB}}}vlan_tagging": "vlan_tagging",
                 f"{{{NS_EMULAB}}}link_multiplexing": "link_multiplexing",
                 f"{{{NS_EMULAB}}}best_effort": "best_effort"}

# Kinds of a node's children, in order of frequency in a large advertisement.
(_K_HW, _K_IFACE, _K_SLIVER, _K_AVAILABLE, _K_SERVICES, _K_HOST, _K_ROUTABLE,
 _K_VNODE) = range(8)


class _Tags:
    """Clark names of the elements we read, for one RSpec namespace."""

    def __init__(self, ns: str) -> None:
        def q(local: str) -> str:
            return f"{{{ns}}}{local}"
        self.rspec, self.node, self.link = q("rspec"), q("node"), q("link")
        self.disk_image, self.ip = q("disk_image"), q("ip")
        self.login, self.install, self.execute = q("login"), q("install"), q("execute")
        self.interface_ref, self.link_type = q("interface_ref"), q("link_type")
        self.node_children = {
            q("hardware_type"): _K_HW, q("interface"): _K_IFACE, q("sliver_type"): _K_SLIVER,
            q("available"): _K_AVAILABLE, q("services"): _K_SERVICES, q("host"): _K_HOST,
            _E_ROUTABLE: _K_ROUTABLE, _E_VNODE: _K_VNODE}


_TAGS = {NS_V3: _Tags(NS_V3), NS_V2: _Tags(NS_V2)}


class _RootProblem(Exception):
    """The root element is wrong; :func:`parse` adds source and line."""


def _bool(value: str | None) -> bool | None:
    return None if value is None else _BOOL.get(value.strip())


def _datetime(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parse_iso(value)
    except ValueError as err:
        raise _RootProblem(f"expires={value!r} is not an ISO-8601 date and time") from err
    if parsed.tzinfo is None:  # RSpec times are UTC unless they say otherwise
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed


class _RSpecTarget(SafeTarget):
    """lxml parser target that fills an :class:`RSpec` (see the module docstring).

    The callbacks are closures over local state rather than methods over ``self``: lxml
    calls them once or twice per element, and cell variables are cheaper than attributes.
    ``end`` only counts depth; a node's last touches happen when the next top-level element
    starts, or at ``close``.
    """

    start: Callable[[str, dict[str, str]], None]
    end: Callable[[str], None]
    close: Callable[[], RSpec | None]

    def __init__(self) -> None:  # noqa: C901 (one flat state machine, kept in one place)
        depth = 0
        rspec: RSpec | None = None
        tags = _TAGS[NS_V3]
        kinds_get = tags.node_children.get
        node: Node | None = None
        link: Link | None = None
        kind3: int | None = None  # kind of the node child we are inside
        iface: Interface | None = None
        default_image = False
        vnode: tuple[str | None, str | None, str | None] | None = None

        def finish_node(node: Node) -> None:
            if node.hardware_types:
                node.hardware_type = node.hardware_types[0]
            if vnode is not None:
                name, hardware_type, image = vnode
                node.component_name = node.component_name or name
                node.hardware_type = node.hardware_type or hardware_type
                node.disk_image = node.disk_image or image

        def start(tag: str, a: dict[str, str]) -> None:
            nonlocal depth, rspec, tags, kinds_get, node, link, kind3, iface, default_image
            nonlocal vnode
            depth += 1
            if depth == 3:
                if node is not None:
                    kind = kind3 = kinds_get(tag)
                    if kind is None:
                        return
                    if kind == _K_HW:
                        name = a.get("name")
                        if name:
                            node.hardware_types.append(name)
                    elif kind == _K_IFACE:
                        get = a.get
                        iface = Interface(get("client_id"), None, None, get("mac_address"),
                                          get("sliver_id"), get("component_id"))
                        node.interfaces.append(iface)
                    elif kind == _K_SLIVER:
                        name = a.get("name")
                        node.sliver_type = SLIVER_TYPE_ALIASES.get(name, name)  # type: ignore
                        default_image = False
                    elif kind == _K_SERVICES:  # read at depth 4
                        pass
                    elif kind == _K_AVAILABLE:
                        now = a.get("now")
                        node.available = None if now is None else _BOOL.get(now.strip())
                    elif kind == _K_HOST:
                        node.hostname = a.get("name")
                        node.ipv4 = a.get("ipv4")
                    elif kind == _K_ROUTABLE:
                        node.routable_control_ip = True
                    elif kind == _K_VNODE:  # emulab's record of the physical node behind it
                        vnode = (a.get("name"), a.get("hardware_type"), a.get("disk_image"))
                elif link is not None:
                    if tag == tags.interface_ref:
                        ref = a.get("client_id") or a.get("component_id")
                        if ref:
                            link.interfaces.append(ref)
                    else:
                        _link_child(tags, link, tag, a)
            elif depth == 4:
                if node is None:
                    return
                kind = kind3
                if kind == _K_SLIVER:
                    if tag == tags.disk_image:
                        is_default = _BOOL.get(a.get("default", "")) is True
                        if node.disk_image is None or (is_default and not default_image):
                            node.disk_image = a.get("name") or a.get("url")
                            default_image = is_default
                elif kind == _K_IFACE:
                    if tag == tags.ip and iface is not None and iface.ip is None:
                        iface.ip = a.get("address")
                        iface.netmask = a.get("netmask")
                elif kind == _K_SERVICES:
                    if tag == tags.login:
                        get = a.get
                        port = get("port")
                        node.logins.append(Login(
                            get("username"), get("hostname"),
                            int(port) if port and port.strip().isdigit() else None,
                            get("authentication")))
                    elif tag == tags.execute:
                        node.executes.append((a.get("shell") or "", a.get("command") or ""))
                    elif tag == tags.install:
                        node.installs.append((a.get("url") or "", a.get("install_path") or ""))
            elif depth == 2:
                if node is not None:
                    finish_node(node)
                    node = None
                link = None
                if tag == tags.node:
                    get = a.get
                    exclusive = get("exclusive")
                    # Every field positionally (fresh lists as literals): a third cheaper
                    # than keywords and default factories; test_parse_fastpath checks it.
                    node = Node(get("client_id"), get("component_id"),
                                get("component_manager_id"), get("component_name"),
                                get("sliver_id"),
                                None if exclusive is None else _BOOL.get(exclusive.strip()),
                                None, None, None, None, None, [], [], None, [], [], False, [])
                    vnode = None
                    rspec.nodes.append(node)  # type: ignore[union-attr]
                elif tag == tags.link:
                    link = Link(a.get("client_id"), a.get("sliver_id"), vlantag=a.get("vlantag"))
                    rspec.links.append(link)  # type: ignore[union-attr]
            elif depth == 1:
                rspec, tags = _root(tag, a)
                kinds_get = tags.node_children.get

        def end(tag: str) -> None:
            nonlocal depth
            depth -= 1

        def close() -> RSpec | None:
            # lxml calls close() even after an error; raising here would hide the real one.
            nonlocal node
            if node is not None:
                finish_node(node)
                node = None
            return rspec

        self.start, self.end, self.close = start, end, close


def _root(tag: str, attrib: dict[str, str]) -> tuple[RSpec, _Tags]:
    ns, _, local = tag[1:].partition("}") if tag.startswith("{") else ("", "", tag)
    if local != "rspec" or ns not in _TAGS:
        raise _RootProblem(f"not an RSpec: root element is {tag!r} (expected rspec in the "
                           "GENI v3 or ProtoGENI v2 namespace)")
    rtype = _TYPE_NAMES.get((attrib.get("type") or "").strip().lower())
    if rtype is None:
        raise _RootProblem(rspec_type_problem(attrib.get("type")))
    return (RSpec(type=rtype, expires=_datetime(attrib.get("expires")),
                  version="3" if ns == NS_V3 else "2"), _TAGS[ns])


def _link_child(tags: _Tags, link: Link, tag: str, a: dict[str, str]) -> None:
    """A link's child other than interface_ref (handled inline: by far the most common)."""
    if tag == tags.link_type:
        link.link_type = a.get("name")
    elif tag in _E_LINK_FLAGS:
        value = _bool(a.get("enabled"))  # a bare <emulab:vlan_tagging/> means enabled
        setattr(link, _E_LINK_FLAGS[tag], True if value is None else value)


_ROOT_START = re.compile(rb"<(?![?!])")


def _fast_read(data: bytes, plain: bool = False) -> RSpec | None:
    """The C reader's records (:mod:`elasticslice.rspec.fast`), or None."""
    from elasticslice.rspec import fast
    return fast.read(data, plain)


def _request_with_slivers(rspec: RSpec) -> None:
    """ProtoGENI's own v2 manifest example still says type="request": one with sliver_ids
    is read as a manifest."""
    if rspec.type is RSpecType.REQUEST and any(n.sliver_id for n in rspec.nodes):
        rspec.type = RSpecType.MANIFEST


def parse(xml: str | bytes, source: str | None = None, *,
          max_bytes: int = DEFAULT_MAX_BYTES) -> RSpec:
    """Parse a request, manifest or advertisement (GENI v3 or ProtoGENI v2) into an RSpec.

    Raises :class:`~elasticslice.errors.HostileXMLError` for hostile input and
    :class:`~elasticslice.errors.RSpecError` for anything that is not an RSpec.
    """
    return _parse(xml, source, max_bytes, use_c=True)


def _parse(xml: str | bytes, source: str | None, max_bytes: int, *, use_c: bool) -> RSpec:
    """:func:`parse`; ``use_c=False``: the Python reader alone (the C reader's tests compare
    the two)."""
    data = checked_bytes(xml, source, max_bytes=max_bytes)
    try:
        with collector_paused():   # (every record survives the parse)
            rspec: RSpec | None = _fast_read(data) if use_c else None
            if rspec is None:   # not built, or something only the Python reader says right
                rspec = parse_events(data, _RSpecTarget(), source, max_bytes=max_bytes)
        if rspec is None:
            raise _RootProblem("no root element")
    except _RootProblem as err:
        match = _ROOT_START.search(data)
        line = data.count(b"\n", 0, match.start()) + 1 if match else None
        raise RSpecError(str(err), source=source, line=line) from None
    said = rspec.type
    _request_with_slivers(rspec)
    if rspec.type is not said:
        log.debug("%s: rspec says request but carries sliver_ids; reading it as a manifest",
                  source or "rspec")
    if rspec.type is RSpecType.ADVERTISEMENT:
        _count(rspec)
    return rspec


def _count(rspec: RSpec) -> None:
    """An advertisement's nodes by hardware type, in all and available. The C reader
    counts them as it reads (the two dicts, in the order the types came); else here."""
    total, available = rspec.total_by_type, rspec.available_by_type
    if not total:
        for node in rspec.nodes:
            for name in node.hardware_types:
                total[name] = total.get(name, 0) + 1
                if node.available:
                    available[name] = available.get(name, 0) + 1
    rspec.total_by_type = dict(sorted(total.items()))
    rspec.available_by_type = {name: available.get(name, 0) for name in rspec.total_by_type}


@dataclass(frozen=True, slots=True)
class NodeCounts:
    """What :func:`count_nodes` reads from an advertisement: how many nodes, how many say
    ``available now="true"`` and how many do not say false; per hardware type (an
    advertisement's only: empty for other RSpec types, as :func:`parse` leaves them), the
    nodes and the available ones (a node of two types counts in each), and the available
    ones' names."""

    type: RSpecType
    nodes: int
    available: int
    not_unavailable: int
    total_by_type: dict[str, int]
    available_by_type: dict[str, int]
    #: per hardware type, the names of the nodes that say ``available now="true"``
    #: (``component_name``, else the last part of ``component_id``): what AddNodes' ``node``
    #: takes to get a node of a type
    free_by_type: dict[str, list[str]] = field(default_factory=dict)


def _counts_in_c(xml: str | bytes, source: str | None, max_bytes: int) -> NodeCounts | None:
    """:func:`count_nodes` from the C reader's records (twice as fast as the Python count,
    which builds none), or None: no C reader, or a document it leaves to Python."""
    data = checked_bytes(xml, source, max_bytes=max_bytes)
    with collector_paused():   # (every record survives the parse)
        rspec = _fast_read(data, plain=True)
    if rspec is None:
        return None
    nodes = rspec.nodes
    _request_with_slivers(rspec)
    up = [n for n in nodes if n.available]
    not_unavailable = len(nodes) - sum(1 for n in nodes if n.available is False)
    if rspec.type is not RSpecType.ADVERTISEMENT:
        return NodeCounts(rspec.type, len(nodes), len(up), not_unavailable, {}, {}, {})
    _count(rspec)
    names: dict[str, list[str]] = {}
    for node in up:
        name = node.component_name or (node.component_id or "").rsplit("+", 1)[-1]
        if name:
            for kind in node.hardware_types:
                names.setdefault(kind, []).append(name)
    return NodeCounts(rspec.type, len(nodes), len(up), not_unavailable, rspec.total_by_type,
                      rspec.available_by_type,
                      {kind: names[kind] for kind in rspec.total_by_type if kind in names})


class _CountTarget(SafeTarget):
    """The nodes' hardware types and availability only (a node's other children and links
    skipped, nothing built): :func:`count_nodes`."""

    start: Callable[[str, dict[str, str]], None]
    end: Callable[[str], None]
    close: Callable[[], NodeCounts | None]

    def __init__(self) -> None:
        depth = 0
        rtype: RSpecType | None = None
        node_tag = hw_tag = avail_tag = ""
        in_node = False
        types: list[str] = []
        available: bool | None = None
        total: dict[str, int] = {}
        free: dict[str, int] = {}
        names: dict[str, list[str]] = {}
        name = ""
        counts = [0, 0, 0, 0]  # nodes, available, not unavailable, sliver_ids seen

        def finish() -> None:
            nonlocal in_node
            in_node = False
            counts[0] += 1
            if available:
                counts[1] += 1
            if available is not False:
                counts[2] += 1
            for kind in types:
                total[kind] = total.get(kind, 0) + 1
                if available:
                    free[kind] = free.get(kind, 0) + 1
                    if name:
                        names.setdefault(kind, []).append(name)

        def start(tag: str, a: dict[str, str]) -> None:
            nonlocal depth, rtype, node_tag, hw_tag, avail_tag, in_node, types, available, name
            depth += 1
            if depth == 3:
                if in_node:
                    if tag == hw_tag:
                        kind = a.get("name")
                        if kind:
                            types.append(kind)
                    elif tag == avail_tag:
                        now = a.get("now")
                        available = None if now is None else _BOOL.get(now.strip())
            elif depth == 2:
                if in_node:
                    finish()
                if tag == node_tag:
                    in_node, types, available = True, [], None
                    name = a.get("component_name") or \
                        (a.get("component_id") or "").rsplit("+", 1)[-1]
                    if a.get("sliver_id"):
                        counts[3] = 1
            elif depth == 1:
                rspec, tags = _root(tag, a)
                rtype = rspec.type
                node_tag = tags.node
                hw_tag, avail_tag = (t for t, k in tags.node_children.items()
                                     if k in (_K_HW, _K_AVAILABLE))

        def end(tag: str) -> None:
            nonlocal depth
            depth -= 1

        def close() -> NodeCounts | None:
            nonlocal rtype
            if in_node:
                finish()
            if rtype is None:
                return None
            if rtype is RSpecType.REQUEST and counts[3]:  # as parse() reads it
                rtype = RSpecType.MANIFEST
            ad = rtype is RSpecType.ADVERTISEMENT
            by_type = dict(sorted(total.items())) if ad else {}
            return NodeCounts(rtype, counts[0], counts[1], counts[2], by_type,
                              {kind: free.get(kind, 0) for kind in by_type},
                              {kind: names[kind] for kind in by_type if kind in names})

        self.start, self.end, self.close = start, end, close


def count_nodes(xml: str | bytes, source: str | None = None, *,
                max_bytes: int = DEFAULT_MAX_BYTES) -> NodeCounts:
    """Count an advertisement's nodes by hardware type and availability without building
    its records: what the manager reads each cycle, at a fraction of :func:`parse`'s cost
    on a large site. The same refusals and errors as :func:`parse` (hostile XML, not
    well-formed, not an RSpec: one line each)."""
    return _count_nodes(xml, source, max_bytes, use_c=True)


def _count_nodes(xml: str | bytes, source: str | None, max_bytes: int, *,
                 use_c: bool) -> NodeCounts:
    """:func:`count_nodes`; ``use_c=False``: the Python count alone."""
    counted = _counts_in_c(xml, source, max_bytes) if use_c else None
    if counted is not None:
        return counted
    try:
        counts: NodeCounts | None = parse_events(xml, _CountTarget(), source,
                                                 max_bytes=max_bytes)
        if counts is None:
            raise _RootProblem("no root element")
    except _RootProblem as err:
        data = checked_bytes(xml, source, max_bytes=max_bytes)
        match = _ROOT_START.search(data)
        line = data.count(b"\n", 0, match.start()) + 1 if match else None
        raise RSpecError(str(err), source=source, line=line) from None
    return counts
