"""Typed records for RSpecs: what a parsed request, manifest or advertisement contains, and
the specifications the builders take.

Parsed records (:class:`RSpec`, :class:`Node`, :class:`Link`, ...) carry ``None`` for what
the document did not say. Specifications (:class:`NodeSpec`, :class:`LinkSpec`) describe
what a user asks for; the builders turn them into XML or CM v2 ``AddNodes`` arguments.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from elasticslice.errors import RSpecError

#: GENI RSpec v3 namespace, and the ProtoGENI v2 one (still the CM's default output).
NS_V3 = "http://www.geni.net/resources/rspec/3"
NS_V2 = "http://www.protogeni.net/resources/rspec/2"
NS_EMULAB = "http://www.protogeni.net/resources/rspec/ext/emulab/1"
NS_XSI = "http://www.w3.org/2001/XMLSchema-instance"

#: The sliver type CloudLab gives a whole physical machine. geni-lib writes "raw".
RAW_PC = "raw-pc"
SLIVER_TYPE_ALIASES = {"raw": RAW_PC}


class RSpecType(str, Enum):
    """The ``type`` attribute of an RSpec root. Compares equal to its string value."""

    REQUEST = "request"
    MANIFEST = "manifest"
    ADVERTISEMENT = "advertisement"

    def __str__(self) -> str:
        return self.value


def rspec_type_problem(value: str | None) -> str:
    """What is wrong with the ``type`` of an RSpec root (parse and validate say the same)."""
    if value is None:
        return ("the rspec element has no type attribute (want type=\"request\", "
                "\"manifest\" or \"advertisement\")")
    return f"unknown rspec type {value!r} (expected request, manifest or advertisement)"


@dataclass(slots=True)
class Login:
    """A ``services/login`` entry: how to ssh into a node."""

    username: str | None = None
    hostname: str | None = None
    port: int | None = None
    authentication: str | None = "ssh-keys"

    def to_json_dict(self) -> dict[str, Any]:
        return {"username": self.username, "hostname": self.hostname, "port": self.port}


@dataclass(slots=True)
class Interface:
    """A node's interface. In advertisements only ``component_id`` is usually set."""

    client_id: str | None = None
    ip: str | None = None
    netmask: str | None = None
    mac: str | None = None
    sliver_id: str | None = None
    component_id: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "ip": self.ip, "mac": self.mac}


@dataclass(slots=True)
class Node:
    """A node of a request, manifest or advertisement.

    ``hardware_type`` is the first (requests, manifests) hardware type; advertisements list
    every type a node can serve as in ``hardware_types``, and every image after
    ``disk_image`` it boots in ``disk_images``. ``installs`` are ``(url, path)``
    and ``executes`` ``(shell, command)`` pairs. ``available`` is ``available@now`` of an
    advertisement, ``None`` elsewhere.
    """

    client_id: str | None = None
    component_id: str | None = None
    component_manager_id: str | None = None
    component_name: str | None = None
    sliver_id: str | None = None
    exclusive: bool | None = None
    hardware_type: str | None = None
    sliver_type: str | None = None
    disk_image: str | None = None
    hostname: str | None = None
    ipv4: str | None = None
    logins: list[Login] = field(default_factory=list)
    interfaces: list[Interface] = field(default_factory=list)
    available: bool | None = None
    installs: list[tuple[str, str]] = field(default_factory=list)
    executes: list[tuple[str, str]] = field(default_factory=list)
    routable_control_ip: bool = False
    hardware_types: list[str] = field(default_factory=list)
    disk_images: list[str] = field(default_factory=list)  # an advertisement's other images

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "component_id": self.component_id,
            "component_manager_id": self.component_manager_id,
            "sliver_id": self.sliver_id,
            "hardware_type": self.hardware_type,
            "sliver_type": self.sliver_type,
            "disk_image": self.disk_image,
            "hostname": self.hostname,
            "ipv4": self.ipv4,
            "logins": [login.to_json_dict() for login in self.logins],
            "interfaces": [iface.to_json_dict() for iface in self.interfaces],
            "available": self.available,
        }


@dataclass(slots=True)
class Link:
    """A link or LAN. ``interfaces`` are the client_ids of its interface_refs."""

    client_id: str | None = None
    sliver_id: str | None = None
    interfaces: list[str] = field(default_factory=list)
    link_type: str | None = None
    vlan_tagging: bool | None = None
    link_multiplexing: bool | None = None
    best_effort: bool | None = None
    vlantag: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "interfaces": list(self.interfaces),
            "vlan_tagging": self.vlan_tagging,
            "link_multiplexing": self.link_multiplexing,
        }


@dataclass(slots=True)
class RSpec:
    """A parsed RSpec. ``available_by_type`` / ``total_by_type`` count advertised nodes per
    hardware type (a node counts once for each type it lists); empty for other types."""

    type: RSpecType
    expires: datetime | None = None
    nodes: list[Node] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    available_by_type: dict[str, int] = field(default_factory=dict)
    total_by_type: dict[str, int] = field(default_factory=dict)
    version: str = "3"

    def node(self, client_id: str) -> Node:
        """The node with this client_id; ``KeyError`` if there is none."""
        for node in self.nodes:
            if node.client_id == client_id:
                return node
        raise KeyError(client_id)

    def check_request(self, fail: Callable[[str], Exception] | None = None) -> None:
        """Raise ``fail(problem)`` (default: ``RSpecError``) when this is a request with a
        node client_id that ``AddNodes`` would refuse, or one given twice: the one rule of
        :mod:`elasticslice.rspec.rules`, which the emulator's CreateSliver applies too."""
        from elasticslice.rspec.rules import request_problem  # (rules imports this module)
        problem = request_problem(self)
        if problem:
            raise fail(problem) if fail is not None else RSpecError(problem)

    def to_json_dict(self) -> dict[str, Any]:
        """The shape ``elasticslice rspec show --json`` prints."""
        return {
            "type": self.type.value,
            "expires": format_datetime(self.expires) if self.expires else None,
            "nodes": [node.to_json_dict() for node in self.nodes],
            "links": [link.to_json_dict() for link in self.links],
            "available_by_type": dict(self.available_by_type),
            "total_by_type": dict(self.total_by_type),
        }


@dataclass(slots=True)
class NodeSpec:
    """A node to request (in an RSpec) or to add (with CM v2 ``AddNodes``).

    ``interfaces`` are ``(client_id, ip, netmask)`` with ip/netmask optional (``None``);
    ``lans`` names the links this node joins when added with ``AddNodes`` (in a request
    RSpec, links are given as :class:`LinkSpec`). ``component_id`` pins a physical node.
    """

    client_id: str
    hardware_type: str | None = None
    sliver_type: str = RAW_PC
    disk_image: str | None = None
    exclusive: bool = True
    component_id: str | None = None
    component_manager_id: str | None = None
    interfaces: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    installs: list[tuple[str, str]] = field(default_factory=list)
    executes: list[tuple[str, str]] = field(default_factory=list)
    routable_control_ip: bool = False
    lans: list[str] = field(default_factory=list)


@dataclass(slots=True)
class LinkSpec:
    """A link or LAN to request; ``interfaces`` are interface client_ids of the nodes."""

    client_id: str
    interfaces: list[str] = field(default_factory=list)
    link_type: str | None = "lan"
    vlan_tagging: bool | None = None
    link_multiplexing: bool | None = None
    best_effort: bool | None = None


def format_datetime(value: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ`` in UTC, as RSpecs and credentials write it."""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")
