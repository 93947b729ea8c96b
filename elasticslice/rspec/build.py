"""Write RSpecs: requests from specifications, manifests and advertisements from records.

Every builder validates its output against the packaged GENI v3 schema of its type (unless
``validate=False``) and raises :class:`~elasticslice.errors.RSpecError` naming the problem,
so a bad specification is caught where it is made, not at the CM.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from lxml import etree

from elasticslice.errors import RSpecError
from elasticslice.rspec.model import (
    NS_EMULAB, NS_V2, NS_V3, NS_XSI, Link, LinkSpec, Node, NodeSpec, RSpecType, format_datetime,
)
from elasticslice.rspec.rules import image_problem
from elasticslice.rspec.validate import validate_element

_SCHEMA_URL = {
    RSpecType.REQUEST: "http://www.geni.net/resources/rspec/3/request.xsd",
    RSpecType.MANIFEST: "http://www.geni.net/resources/rspec/3/manifest.xsd",
    RSpecType.ADVERTISEMENT: "http://www.geni.net/resources/rspec/3/ad.xsd",
}
_V2_SCHEMA_URL = "http://www.protogeni.net/resources/rspec/2/ad.xsd"


def _root(rtype: RSpecType, ns: str = NS_V3) -> etree._Element:
    root = etree.Element(f"{{{ns}}}rspec", nsmap={None: ns, "emulab": NS_EMULAB, "xsi": NS_XSI})
    url = _SCHEMA_URL[rtype] if ns == NS_V3 else _V2_SCHEMA_URL
    root.set(f"{{{NS_XSI}}}schemaLocation", f"{ns} {url}")
    root.set("type", rtype.value)
    return root


def _sub(parent: etree._Element, ns: str, tag: str, **attrs: str | None) -> etree._Element:
    return etree.SubElement(parent, f"{{{ns}}}{tag}",
                            {k: v for k, v in attrs.items() if v is not None})


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _finish(root: etree._Element, rtype: RSpecType, validate: bool) -> str:
    if validate and root.tag == f"{{{NS_V3}}}rspec":
        problems = validate_element(root)
        if problems:
            detail = "; ".join(f"line {p.line}: {p.message}" for p in problems[:5])
            raise RSpecError(f"built {rtype.value} rspec does not validate: {detail}")
    return etree.tostring(root, encoding="unicode", pretty_print=True)


def _sliver_type(parent: etree._Element, ns: str, sliver_type: str | None,
                 disk_image: str | None, more: Sequence[str] = ()) -> None:
    if sliver_type is None and disk_image is None:
        return
    sliver = _sub(parent, ns, "sliver_type", name=sliver_type or "raw-pc")
    for image in dict.fromkeys([disk_image, *more] if disk_image else []):
        _sub(sliver, ns, "disk_image", name=image)


def _services(parent: etree._Element, ns: str, installs: Iterable[tuple[str, str]],
              executes: Iterable[tuple[str, str]], logins: Iterable = ()) -> None:
    installs, executes, logins = list(installs), list(executes), list(logins)
    if not (installs or executes or logins):
        return
    services = _sub(parent, ns, "services")
    for login in logins:
        _sub(services, ns, "login", authentication=login.authentication or "ssh-keys",
             hostname=login.hostname, username=login.username,
             port=str(login.port) if login.port is not None else None)
    for url, path in installs:
        _sub(services, ns, "install", url=url, install_path=path or "/")
    for shell, command in executes:
        _sub(services, ns, "execute", shell=shell or "sh", command=command)


def _check_ids(kind: str, ids: Sequence[str | None]) -> None:
    seen: set[str] = set()
    for cid in ids:
        if not cid:
            raise RSpecError(f"every {kind} needs a client_id")
        if cid in seen:
            raise RSpecError(f"duplicate {kind} client_id {cid!r}")
        seen.add(cid)


def build_request(nodes: Sequence[NodeSpec], links: Sequence[LinkSpec] = (), *,
                  validate: bool = True) -> str:
    """A GENI v3 request RSpec for ``nodes`` and ``links`` (validated against request.xsd)."""
    if not nodes:
        raise RSpecError("a request needs at least one node")
    _check_ids("node", [n.client_id for n in nodes])
    _check_ids("link", [link.client_id for link in links])
    for spec in nodes:
        problem = image_problem(spec.disk_image, spec.client_id) if spec.disk_image else None
        if problem:
            raise RSpecError(problem)
    known_ifaces = {iface[0] for n in nodes for iface in n.interfaces}
    ns = NS_V3
    root = _root(RSpecType.REQUEST)
    for spec in nodes:
        node = _sub(root, ns, "node", client_id=spec.client_id,
                    exclusive=_bool(spec.exclusive), component_id=spec.component_id,
                    component_manager_id=spec.component_manager_id)
        _sliver_type(node, ns, spec.sliver_type, spec.disk_image)
        if spec.hardware_type:
            _sub(node, ns, "hardware_type", name=spec.hardware_type)
        for client_id, ip, netmask in spec.interfaces:
            iface = _sub(node, ns, "interface", client_id=client_id)
            if ip:
                _sub(iface, ns, "ip", address=ip, netmask=netmask, type="ipv4")
        _services(node, ns, spec.installs, spec.executes)
        if spec.routable_control_ip:
            _sub(node, NS_EMULAB, "routable_control_ip")
    for spec in links:
        link = _sub(root, ns, "link", client_id=spec.client_id)
        for ref in spec.interfaces:
            if ref not in known_ifaces:
                raise RSpecError(f"link {spec.client_id!r} refers to unknown interface {ref!r}")
            _sub(link, ns, "interface_ref", client_id=ref)
        if spec.link_type:
            _sub(link, ns, "link_type", name=spec.link_type)
        _link_extensions(link, spec.vlan_tagging, spec.link_multiplexing, spec.best_effort)
    return _finish(root, RSpecType.REQUEST, validate)


def _link_extensions(link: etree._Element, vlan_tagging: bool | None,
                     link_multiplexing: bool | None, best_effort: bool | None) -> None:
    for tag, value in (("vlan_tagging", vlan_tagging), ("link_multiplexing", link_multiplexing),
                       ("best_effort", best_effort)):
        if value is not None:
            _sub(link, NS_EMULAB, tag, enabled=_bool(value))


def build_manifest(nodes: Sequence[Node], links: Sequence[Link] = (),
                   expires: datetime | None = None, *, validate: bool = True) -> str:
    """A GENI v3 manifest from filled :class:`Node` / :class:`Link` records.

    Writes, per node, sliver_id, component_id/manager, ``host@name`` and ``host@ipv4`` (as
    CloudLab does; see :mod:`elasticslice.rspec.validate` about the latter), logins,
    installs/executes, interfaces with sliver_id, mac and ip; per link, sliver_id and
    ``vlantag`` (required by manifest.xsd; ``"0"`` when none was assigned).
    """
    _check_ids("node", [n.client_id for n in nodes])
    ns = NS_V3
    root = _root(RSpecType.MANIFEST)
    if expires is not None:
        root.set("expires", format_datetime(expires))
    for rec in nodes:
        node = _sub(root, ns, "node", client_id=rec.client_id, component_id=rec.component_id,
                    component_manager_id=rec.component_manager_id,
                    component_name=rec.component_name, sliver_id=rec.sliver_id,
                    exclusive=_bool(rec.exclusive) if rec.exclusive is not None else None)
        _sliver_type(node, ns, rec.sliver_type, rec.disk_image)
        if rec.hardware_type:
            _sub(node, ns, "hardware_type", name=rec.hardware_type)
        for iface in rec.interfaces:
            elem = _sub(node, ns, "interface", client_id=iface.client_id,
                        component_id=iface.component_id, sliver_id=iface.sliver_id,
                        mac_address=iface.mac)
            if iface.ip:
                _sub(elem, ns, "ip", address=iface.ip, netmask=iface.netmask, type="ipv4")
        _services(node, ns, rec.installs, rec.executes, rec.logins)
        if rec.routable_control_ip:
            _sub(node, NS_EMULAB, "routable_control_ip")
        if rec.component_name:
            _sub(node, NS_EMULAB, "vnode", name=rec.component_name)
        if rec.hostname:
            _sub(node, ns, "host", name=rec.hostname, ipv4=rec.ipv4)
    for rec in links:
        link = _sub(root, ns, "link", client_id=rec.client_id, sliver_id=rec.sliver_id,
                    vlantag=str(rec.vlantag) if rec.vlantag is not None else "0")
        for ref in rec.interfaces:
            _sub(link, ns, "interface_ref", client_id=ref)
        if rec.link_type:
            _sub(link, ns, "link_type", name=rec.link_type)
        _link_extensions(link, rec.vlan_tagging, rec.link_multiplexing, rec.best_effort)
    return _finish(root, RSpecType.MANIFEST, validate)


def build_advertisement(nodes: Sequence[Node], component_manager_id: str, *,
                        version: str = "3", expires: datetime | None = None,
                        validate: bool = True) -> str:
    """An advertisement of ``nodes`` (component_id, component_name, hardware types,
    sliver_type/disk_image, exclusive, ``available@now``).

    ``version="3"`` writes GENI v3 (validated against ad.xsd). ``version="2"`` writes the
    same elements in the ProtoGENI v2 namespace, the CM's default ``rspec_version``; there is
    no v2 schema in the package, so v2 output is not validated.
    """
    if version not in ("2", "3"):
        raise RSpecError(f"unsupported advertisement version {version!r} (use '2' or '3')")
    ns = NS_V3 if version == "3" else NS_V2
    root = _root(RSpecType.ADVERTISEMENT, ns)
    if expires is not None:
        root.set("expires", format_datetime(expires))
    for rec in nodes:
        if not rec.component_id:
            raise RSpecError("every advertised node needs a component_id")
        node = _sub(root, ns, "node", component_id=rec.component_id,
                    component_manager_id=rec.component_manager_id or component_manager_id,
                    component_name=rec.component_name,
                    exclusive=_bool(rec.exclusive if rec.exclusive is not None else True))
        types = rec.hardware_types or ([rec.hardware_type] if rec.hardware_type else [])
        for name in types:
            _sub(node, ns, "hardware_type", name=name)
        _sliver_type(node, ns, rec.sliver_type or "raw-pc", rec.disk_image, rec.disk_images)
        _sub(node, ns, "available", now=_bool(bool(rec.available)))
        for iface in rec.interfaces:
            if iface.component_id:
                _sub(node, ns, "interface", component_id=iface.component_id)
    return _finish(root, RSpecType.ADVERTISEMENT, validate)


def bind_to_cm(request: str, cm_urn: str) -> str:
    """``request`` with every node that names no CM bound to ``cm_urn``
    (``component_manager_id``): the convention of a slice across several CMs, where each CM
    takes the nodes bound to it and lets the others pass (``GeniXML::IsLocalNode`` in
    Emulab's CM). A node bound to another CM is left as it is. Raises what
    :func:`~elasticslice.rspec.safexml.parse_xml` raises for a bad request."""
    from elasticslice.rspec.safexml import parse_xml
    root = parse_xml(request, "the request RSpec")
    changed = False
    for node in root:
        if isinstance(node.tag, str) and etree.QName(node).localname == "node" \
                and not node.get("component_manager_id"):
            node.set("component_manager_id", cm_urn)
            changed = True
    if not changed:
        return request
    return etree.tostring(root, encoding="unicode")
