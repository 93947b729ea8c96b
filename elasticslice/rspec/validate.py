"""Validate RSpecs against the GENI v3 schemas shipped as package data (never the network).

The schema for a document is chosen by its ``type``: request.xsd, manifest.xsd or ad.xsd,
each combined with the emulab extension schema (vtop for requests and manifests, ptop for
advertisements) and, for manifests, the user extension. Extension elements the schemas do
not declare are checked laxly, as the GENI ``AnyExtension`` group says.

Real CloudLab manifests carry two things the published XSDs lack: ``host@ipv4`` and extra
attributes on ``emulab:vnode`` (``hardware_type``, ``disk_image``). By default (``strict=False``)
these are allowed, by patching the in-memory copy of the schema; ``strict=True`` uses the
XSDs exactly as published.

Requests are also held to the node client_id and image URN rules of
:mod:`elasticslice.rspec.rules` (the ones ``AddNodes`` and ``CreateSliver`` apply) and to the
tarball rule of :mod:`elasticslice.rspec.tarball` (``services/install@url``), reported as
problems like the schema's.
"""
from __future__ import annotations

import functools
import importlib.resources
import logging
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from lxml import etree

from elasticslice.errors import RSpecError
from elasticslice.rspec.model import NS_EMULAB, NS_V3, RSpecType, rspec_type_problem
from elasticslice.rspec.rules import client_id_problems, command_problem, image_problem, shown
from elasticslice.rspec.safexml import DEFAULT_MAX_BYTES, parse_xml
from elasticslice.rspec.tarball import tarball_problem

log = logging.getLogger(__name__)

NS_XS = "http://www.w3.org/2001/XMLSchema"
NS_USER = "http://www.protogeni.net/resources/rspec/ext/user/1"

_MAIN = {RSpecType.REQUEST: "3/request.xsd", RSpecType.MANIFEST: "3/manifest.xsd",
         RSpecType.ADVERTISEMENT: "3/ad.xsd"}
_EMULAB = {RSpecType.REQUEST: "ext/emulab/1/vtop_extension.xsd",
           RSpecType.MANIFEST: "ext/emulab/1/vtop_extension.xsd",
           RSpecType.ADVERTISEMENT: "ext/emulab/1/ptop_extension.xsd"}

_validation_lock = threading.Lock()
_resources = ExitStack()  # keeps an extracted copy alive if the package is zipped


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """One validation error: the line in the document (0 if unknown) and what is wrong."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@functools.cache
def schema_dir() -> Path:
    """The directory holding the packaged XSDs (``3/``, ``ext/emulab/1/``, ``ext/user/1/``)."""
    ref = importlib.resources.files("elasticslice.rspec") / "schemas"
    return Path(_resources.enter_context(importlib.resources.as_file(ref)))


def _local_parser() -> etree.XMLParser:
    # Schema files are our own package data; still, nothing may reach the network.
    return etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False)


def _load(relpath: str, strict: bool) -> etree._ElementTree:
    path = schema_dir() / relpath
    tree = etree.parse(str(path), _local_parser())
    if not strict:
        _allow_real_world(tree, relpath)
    return tree


def _allow_real_world(tree: etree._ElementTree, relpath: str) -> None:
    """Patch CloudLab's known additions into an in-memory schema (see module docstring)."""
    xs = f"{{{NS_XS}}}"
    for element in tree.getroot().iter(f"{xs}element"):
        name = element.get("name")
        if relpath == "3/manifest-common.xsd" and name == "host":
            ctype = element.find(f"{xs}complexType")
            if ctype is not None:
                etree.SubElement(ctype, f"{xs}attribute", name="ipv4")
        elif relpath.endswith("vtop_extension.xsd") and name == "vnode":
            ctype = element.find(f"{xs}complexType")
            if ctype is not None:
                etree.SubElement(ctype, f"{xs}anyAttribute", processContents="skip")


class _PackageResolver(etree.Resolver):
    """Serve ``xs:include`` / ``xs:import`` targets from the (patched) package copies."""

    def __init__(self, strict: bool) -> None:
        super().__init__()
        self.strict = strict
        self.root = schema_dir().resolve()

    def resolve(self, system_url: str, public_id: str, context: object) -> object:
        path = Path(system_url.removeprefix("file://")).resolve()
        try:
            rel = path.relative_to(self.root).as_posix()
        except ValueError:
            raise RSpecError(f"schema tried to load {system_url!r} outside the package") from None
        tree = _load(rel, self.strict)
        return self.resolve_string(etree.tostring(tree), context, base_url=str(path))


@functools.cache
def schema_for(rtype: RSpecType, strict: bool = False) -> etree.XMLSchema:
    """The compiled (and cached) schema for an RSpec type."""
    root = schema_dir().resolve()
    imports = [(NS_V3, _MAIN[rtype]), (NS_EMULAB, _EMULAB[rtype])]
    if rtype is RSpecType.MANIFEST:
        imports.append((NS_USER, "ext/user/1/manifest.xsd"))
    wrapper = etree.Element(f"{{{NS_XS}}}schema", nsmap={"xs": NS_XS})
    for namespace, rel in imports:
        etree.SubElement(wrapper, f"{{{NS_XS}}}import", namespace=namespace,
                         schemaLocation=str(root / rel))
    parser = _local_parser()
    parser.resolvers.add(_PackageResolver(strict))
    doc = etree.fromstring(etree.tostring(wrapper), parser,
                           base_url=str(root / "wrapper.xsd"))
    try:
        return etree.XMLSchema(doc)
    except etree.XMLSchemaParseError as err:  # a broken package, not bad input
        raise RSpecError(f"cannot load the packaged {rtype.value} schema: {err}") from err


def validate(xml: str | bytes, source: str | None = None, *, strict: bool = False,
             max_bytes: int = DEFAULT_MAX_BYTES) -> list[SchemaProblem]:
    """Validate an RSpec against the GENI v3 schema of its ``type``.

    Returns the problems found (empty when valid). Raises
    :class:`~elasticslice.errors.HostileXMLError` or :class:`~elasticslice.errors.RSpecError`
    when the input is hostile or not XML at all.
    """
    root = parse_xml(xml, source, max_bytes=max_bytes)
    return validate_element(root, strict=strict)


def validate_element(root: etree._Element, *, strict: bool = False) -> list[SchemaProblem]:
    """Validate an already (safely) parsed root element."""
    line = root.sourceline or 0
    if root.tag != f"{{{NS_V3}}}rspec":
        return [SchemaProblem(line, f"not a GENI v3 RSpec: root element is {root.tag!r}, "
                                    f"expected {{{NS_V3}}}rspec")]
    try:
        rtype = RSpecType(root.get("type", ""))
    except ValueError:
        return [SchemaProblem(line, rspec_type_problem(root.get("type")))]
    schema = schema_for(rtype, strict)
    # A compiled schema keeps its error_log on itself: one validation at a time per process
    # (the emulator validates from several server threads).
    with _validation_lock:
        problems = [] if schema.validate(root) else \
            [SchemaProblem(err.line or 0, err.message) for err in schema.error_log]
    if rtype is RSpecType.REQUEST:  # the rule AddNodes and CreateSliver apply (rules.py)
        ids = ((n.get("client_id"), n.sourceline or 0)  # (a missing one: the schema says)
               for n in root.iterchildren(f"{{{NS_V3}}}node") if n.get("client_id") is not None)
        problems += [SchemaProblem(line, message) for line, message in client_id_problems(ids)]
        for execute in root.iterfind(f"{{{NS_V3}}}node/{{{NS_V3}}}services/{{{NS_V3}}}execute"):
            problem = command_problem(execute.get("command") or "")
            if problem:
                node = shown(execute.getparent().getparent().get("client_id"))
                problems.append(SchemaProblem(execute.sourceline or 0,
                                              f"node {node}: execute: {problem}"))
        for image in root.iterfind(f"{{{NS_V3}}}node/{{{NS_V3}}}sliver_type/"
                                   f"{{{NS_V3}}}disk_image[@name]"):
            problem = image_problem(image.get("name"),
                                    image.getparent().getparent().get("client_id"))
            if problem:
                problems.append(SchemaProblem(image.sourceline or 0, problem))
        for install in root.iterfind(f"{{{NS_V3}}}node/{{{NS_V3}}}services/{{{NS_V3}}}install"):
            problem = tarball_problem(install.get("url") or "")
            if problem:
                node = shown(install.getparent().getparent().get("client_id"))
                problems.append(SchemaProblem(install.sourceline or 0, f"node {node}: {problem}"))
        problems.sort(key=lambda p: p.line)
    return problems
