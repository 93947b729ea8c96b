"""RSpecs: safe parsing, typed records, validation against the packaged GENI v3 schemas,
builders for requests, manifests and advertisements, and CM v2 ``AddNodes`` arguments.

Public API::

    parse(xml, source=None) -> RSpec
    validate(xml, source=None, strict=False) -> list[SchemaProblem]
    build_request(nodes: list[NodeSpec], links: list[LinkSpec] = ()) -> str
    bind_to_cm(request, cm_urn) -> str   (its nodes' component_manager_id, where unset)
    build_manifest(nodes: list[Node], links: list[Link], expires) -> str
    build_advertisement(nodes: list[Node], component_manager_id, version="3") -> str
    add_nodes_args(nodes: list[NodeSpec], lans=()) -> dict   (the helper's struct)
    pin_add_args(args, free, rng=None) -> (wire struct, client_ids left out)
    nodespecs_from_add_args(nodes: dict) -> list[NodeSpec]; check_add_args(nodes)
        (the wire struct, as CloudLab's CM reads it)
    client_id_problem(cid) -> str | None; request_problem(rspec) -> str | None   (rules.py)
    startup_problem(command) -> str | None; executes_problem(executes) -> str | None  (rules.py)
    image_problem(image, node=None) -> str | None   (an image URN, rules.py)
"""
from __future__ import annotations

from elasticslice.errors import HostileXMLError, RSpecError
from elasticslice.rspec.addnodes import (
    ADD_NODE_KEYS, AddNodesXMLError, BadAddNodesArgs, add_nodes_args, check_add_args,
    nodespecs_from_add_args, pin_add_args,
)
from elasticslice.rspec.build import (build_advertisement, build_manifest, build_request,
                                      bind_to_cm)
from elasticslice.rspec.model import (
    NS_EMULAB, NS_V2, NS_V3, RAW_PC, Interface, Link, LinkSpec, Login, Node, NodeSpec, RSpec,
    RSpecType, format_datetime,
)
from elasticslice.rspec.parse import parse
from elasticslice.rspec.rules import (
    client_id_problem, executes_problem, image_problem, request_problem, startup_problem,
)
from elasticslice.rspec.safexml import DEFAULT_MAX_BYTES, parse_xml
from elasticslice.rspec.validate import SchemaProblem, validate

__all__ = [
    "ADD_NODE_KEYS", "AddNodesXMLError", "BadAddNodesArgs", "DEFAULT_MAX_BYTES",
    "HostileXMLError", "Interface",
    "Link", "LinkSpec", "Login", "NS_EMULAB", "NS_V2", "NS_V3", "Node", "NodeSpec", "RAW_PC",
    "RSpec", "RSpecError", "RSpecType", "SchemaProblem", "add_nodes_args", "bind_to_cm",
    "build_advertisement",
    "build_manifest", "build_request", "check_add_args", "client_id_problem",
    "executes_problem", "format_datetime", "image_problem", "nodespecs_from_add_args", "parse",
    "parse_xml", "pin_add_args", "request_problem", "startup_problem", "validate",
]
