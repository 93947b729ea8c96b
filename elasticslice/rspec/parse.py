"""One parser for requests, manifests and advertisements, v3 and ProtoGENI v2.

Schema validity is not required: real CloudLab manifests carry attributes the XSDs lack
(``host@ipv4``, ``emulab:vnode@hardware_type``), and we read them. The walk is a single pass
over each node's children with precomputed Clark names (no XPath per node), which keeps a
5,000-node advertisement well inside the 100 ms budget.
"""
from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timezone

from lxml import etree

from elasticslice.errors import RSpecError
from elasticslice.rspec.model import (
    NS_EMULAB, NS_V2, NS_V3, SLIVER_TYPE_ALIASES, Interface, Link, Login, Node, RSpec, RSpecType,
)
from elasticslice.rspec.safexml import DEFAULT_MAX_BYTES, parse_xml

log = logging.getLogger(__name__)

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_TYPE_NAMES = {"request": RSpecType.REQUEST, "manifest": RSpecType.MANIFEST,
               "advertisement": RSpecType.ADVERTISEMENT, "ad": RSpecType.ADVERTISEMENT}


class _Tags:
    """Clark names of the elements we read, for one RSpec namespace."""

    def __init__(self, ns: str) -> None:
        q = "{%s}%s".__mod__
        self.rspec = q((ns, "rspec"))
        self.node = q((ns, "node"))
        self.link = q((ns, "link"))
        self.sliver_type = q((ns, "sliver_type"))
        self.disk_image = q((ns, "disk_image"))
        self.hardware_type = q((ns, "hardware_type"))
        self.interface = q((ns, "interface"))
        self.ip = q((ns, "ip"))
        self.services = q((ns, "services"))
        self.login = q((ns, "login"))
        self.install = q((ns, "install"))
        self.execute = q((ns, "execute"))
        self.host = q((ns, "host"))
        self.available = q((ns, "available"))
        self.interface_ref = q((ns, "interface_ref"))
        self.link_type = q((ns, "link_type"))


_TAGS = {NS_V3: _Tags(NS_V3), NS_V2: _Tags(NS_V2)}
_E_ROUTABLE = f"{{{NS_EMULAB}}}routable_control_ip"
_E_VNODE = f"{{{NS_EMULAB}}}vnode"
_E_VLAN_TAGGING = f"{{{NS_EMULAB}}}vlan_tagging"
_E_MULTIPLEXING = f"{{{NS_EMULAB}}}link_multiplexing"
_E_BEST_EFFORT = f"{{{NS_EMULAB}}}best_effort"


def _bool(value: str | None) -> bool | None:
    if value is None:
        return None
    value = value.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return None


def _datetime(value: str | None, source: str | None, line: int | None) -> datetime | None:
    if not value:
        return None
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as err:
        raise RSpecError(f"expires={value!r} is not an ISO-8601 date and time",
                         source=source, line=line) from err
    if parsed.tzinfo is None:  # RSpec times are UTC unless they say otherwise
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed


def parse(xml: str | bytes, source: str | None = None, *,
          max_bytes: int = DEFAULT_MAX_BYTES) -> RSpec:
    """Parse a request, manifest or advertisement (GENI v3 or ProtoGENI v2) into an RSpec.

    Raises :class:`~elasticslice.errors.HostileXMLError` for hostile input and
    :class:`~elasticslice.errors.RSpecError` for anything that is not an RSpec.
    """
    root = parse_xml(xml, source, max_bytes=max_bytes)
    return parse_element(root, source)


def parse_element(root: etree._Element, source: str | None = None) -> RSpec:
    """Parse an already (safely) parsed root element."""
    tag = root.tag if isinstance(root.tag, str) else ""
    ns, _, local = tag[1:].partition("}") if tag.startswith("{") else ("", "", tag)
    tags = _TAGS.get(ns)
    if local != "rspec" or tags is None:
        raise RSpecError(f"not an RSpec: root element is {tag!r} (expected rspec in the GENI "
                         f"v3 or ProtoGENI v2 namespace)", source=source, line=root.sourceline)
    type_attr = (root.get("type") or "").strip().lower()
    rtype = _TYPE_NAMES.get(type_attr)
    if rtype is None:
        raise RSpecError(f"unknown rspec type {root.get('type')!r} (expected request, manifest "
                         "or advertisement)", source=source, line=root.sourceline)
    rspec = RSpec(type=rtype, version="3" if ns == NS_V3 else "2",
                  expires=_datetime(root.get("expires"), source, root.sourceline))
    is_ad = rtype is RSpecType.ADVERTISEMENT
    for child in root:
        ctag = child.tag
        if ctag == tags.node:
            rspec.nodes.append(_node(child, tags))
        elif ctag == tags.link:
            rspec.links.append(_link(child, tags))
    if rtype is RSpecType.REQUEST and any(n.sliver_id for n in rspec.nodes):
        # ProtoGENI's own v2 manifest example still says type="request".
        log.debug("%s: rspec says request but carries sliver_ids; reading it as a manifest",
                  source or "rspec")
        rspec.type = RSpecType.MANIFEST
    if is_ad:
        _count(rspec)
    return rspec


def _node(elem: etree._Element, tags: _Tags) -> Node:
    get = elem.get
    node = Node(
        client_id=get("client_id"),
        component_id=get("component_id"),
        component_manager_id=get("component_manager_id"),
        component_name=get("component_name"),
        sliver_id=get("sliver_id"),
        exclusive=_bool(get("exclusive")),
    )
    vnode_type = None
    for child in elem:
        ctag = child.tag
        if ctag == tags.sliver_type:
            name = child.get("name")
            node.sliver_type = SLIVER_TYPE_ALIASES.get(name, name)
            _disk_image(node, child, tags)
        elif ctag == tags.hardware_type:
            name = child.get("name")
            if name:
                node.hardware_types.append(name)
        elif ctag == tags.interface:
            node.interfaces.append(_interface(child, tags))
        elif ctag == tags.services:
            _services(node, child, tags)
        elif ctag == tags.host:
            node.hostname = child.get("name")
            node.ipv4 = child.get("ipv4")
        elif ctag == tags.available:
            now = child.get("now")
            node.available = _bool(now if now is not None else child.text)
        elif ctag == _E_ROUTABLE:
            node.routable_control_ip = True
        elif ctag == _E_VNODE:
            vnode_type = child.get("hardware_type")
            if node.component_name is None:
                node.component_name = child.get("name")
            if node.disk_image is None:
                node.disk_image = child.get("disk_image")
    if node.hardware_types:
        node.hardware_type = node.hardware_types[0]
    elif vnode_type:
        node.hardware_type = vnode_type
    return node


def _disk_image(node: Node, sliver: etree._Element, tags: _Tags) -> None:
    chosen = None
    for image in sliver:
        if image.tag != tags.disk_image:
            continue
        name = image.get("name") or image.get("url")
        if chosen is None or _bool(image.get("default")):
            chosen = name
    if chosen is not None:
        node.disk_image = chosen


def _interface(elem: etree._Element, tags: _Tags) -> Interface:
    get = elem.get
    iface = Interface(client_id=get("client_id"), mac=get("mac_address"),
                      sliver_id=get("sliver_id"), component_id=get("component_id"))
    for child in elem:
        if child.tag == tags.ip and iface.ip is None:
            iface.ip = child.get("address")
            iface.netmask = child.get("netmask")
    return iface


def _services(node: Node, elem: etree._Element, tags: _Tags) -> None:
    for child in elem:
        ctag = child.tag
        if ctag == tags.login:
            port = child.get("port")
            node.logins.append(Login(
                username=child.get("username"), hostname=child.get("hostname"),
                port=int(port) if port and port.strip().isdigit() else None,
                authentication=child.get("authentication")))
        elif ctag == tags.install:
            node.installs.append((child.get("url") or "", child.get("install_path") or ""))
        elif ctag == tags.execute:
            node.executes.append((child.get("shell") or "", child.get("command") or ""))


def _link(elem: etree._Element, tags: _Tags) -> Link:
    link = Link(client_id=elem.get("client_id"), sliver_id=elem.get("sliver_id"),
                vlantag=elem.get("vlantag"))
    for child in elem:
        ctag = child.tag
        if ctag == tags.interface_ref:
            ref = child.get("client_id") or child.get("component_id")
            if ref:
                link.interfaces.append(ref)
        elif ctag == tags.link_type:
            link.link_type = child.get("name")
        elif ctag == _E_VLAN_TAGGING:
            link.vlan_tagging = _enabled(child)
        elif ctag == _E_MULTIPLEXING:
            link.link_multiplexing = _enabled(child)
        elif ctag == _E_BEST_EFFORT:
            link.best_effort = _enabled(child)
    return link


def _enabled(elem: etree._Element) -> bool:
    """``<emulab:vlan_tagging enabled="true"/>``; a bare element means enabled."""
    value = _bool(elem.get("enabled"))
    return True if value is None else value


def _count(rspec: RSpec) -> None:
    total: Counter[str] = Counter()
    available: Counter[str] = Counter()
    for node in rspec.nodes:
        total.update(node.hardware_types)
        if node.available:
            available.update(node.hardware_types)
    rspec.total_by_type = dict(sorted(total.items()))
    rspec.available_by_type = {name: available.get(name, 0) for name in rspec.total_by_type}
