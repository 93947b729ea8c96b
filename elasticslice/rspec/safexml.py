"""Parse untrusted XML safely: no DTDs, no entities, no network, no local files, bounded size.

Every RSpec this package reads goes through :func:`parse_xml`. The lxml parser is configured
so that it cannot fetch anything (``no_network``, ``load_dtd=False``, no external entities)
and so that libxml2's own size limits stay on (``huge_tree=False``). On top of that, any
document that *declares* a DTD or entities is refused outright, even though such a
declaration would not be acted upon: an RSpec never needs one, so its presence is hostile.
"""
from __future__ import annotations

import re
import threading
from typing import Any

from lxml import etree

from elasticslice.errors import HostileXMLError, RSpecError

#: Default maximum size of an RSpec document, in bytes (64 MiB). A large site's compressed
#: advertisement inflates to a few MiB; anything near this limit is not an RSpec.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024

# A DOCTYPE or ENTITY declaration can only appear in the prolog, before the root element.
# Searching the first few KiB catches it before lxml even starts (encoding-agnostic checks
# on the parsed tree follow, for documents in UTF-16 and the like).
_PROLOG_SCAN = 4096
_HOSTILE_PROLOG = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)

_local = threading.local()

_PARSER_OPTIONS = dict(
    # XML's own five entities and character references only: a document declaring any
    # other is refused before parsing. (False made libxml2 hand a parser target attribute
    # values with "&amp;" as "&#38;": an execute command "a 2>&1" arrived as "a 2>&#38;1".)
    resolve_entities="internal",
    no_network=True,
    load_dtd=False,
    dtd_validation=False,
    huge_tree=False,
    remove_comments=True,
    remove_pis=True,
    remove_blank_text=True,  # fewer nodes to build and skip; RSpecs need none
    strip_cdata=True,
)


class _ExternalReference(Exception):
    """Raised by :class:`_RefuseAll` when libxml2 tries to load anything from outside."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


class _RefuseAll(etree.Resolver):
    """Belt and braces: whatever libxml2 decides to load (external DTD subset, external
    entity), nothing is opened. Some parser options (``collect_ids=False`` with libxml2 2.14)
    make libxml2 fetch an external DTD subset even with ``load_dtd=False``."""

    def resolve(self, system_url: str, public_id: str, context: object) -> object:
        raise _ExternalReference(system_url or public_id or "?")


class SafeTarget:
    """Base for lxml parser targets (event callbacks instead of a tree) used with
    :func:`parse_events`: refuses a DOCTYPE as soon as the parser reports one. Subclasses
    provide ``start(tag, attrib)``, optionally ``end(tag)``, and ``close()``."""

    source: str | None = None

    def doctype(self, name: str, public_id: str | None, system_url: str | None) -> None:
        raise HostileXMLError(
            "refusing XML with a DOCTYPE declaration (DTDs and entities are never processed)",
            source=self.source)


def _new_parser(target: SafeTarget | None = None) -> etree.XMLParser:
    parser = etree.XMLParser(target=target, **_PARSER_OPTIONS)
    parser.resolvers.add(_RefuseAll())
    return parser


def _parser() -> etree.XMLParser:
    """One hardened tree parser per thread (lxml parsers must not be shared across threads)."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = _new_parser()
    return parser


def _to_bytes(xml: str | bytes) -> bytes:
    if isinstance(xml, str):
        # lxml refuses str input that carries an encoding declaration; parse the UTF-8 bytes
        # instead and drop a declaration that would now lie about the encoding.
        text = xml.lstrip("\ufeff")
        if text.startswith("<?xml"):
            end = text.find("?>")
            if end != -1:
                text = text[end + 2:]
        return text.encode("utf-8")
    if isinstance(xml, (bytes, bytearray, memoryview)):
        return bytes(xml)
    raise RSpecError(f"expected XML as str or bytes, got {type(xml).__name__}")


_WIDE_ENCODINGS = (
    (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\xfe\xff", "utf-16-be"), (b"\xff\xfe", "utf-16-le"),
    (b"\x00\x00\x00<", "utf-32-be"), (b"<\x00\x00\x00", "utf-32-le"),
    (b"\x00<", "utf-16-be"), (b"<\x00", "utf-16-le"),
)


def _prolog_as_utf8(data: bytes) -> bytes:
    """The start of the document as UTF-8, whatever its (byte-order-marked) encoding."""
    head = data[:_PROLOG_SCAN * 4]
    for mark, encoding in _WIDE_ENCODINGS:
        if head.startswith(mark):
            return head.decode(encoding, errors="replace").encode("utf-8")[:_PROLOG_SCAN]
    return head[:_PROLOG_SCAN]


def checked_bytes(xml: str | bytes, source: str | None = None, *,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The document as bytes, after the checks that need no parser: size, emptiness, and
    a DOCTYPE or ENTITY declaration in the prolog (in any byte-order-marked encoding)."""
    data = _to_bytes(xml)
    if len(data) > max_bytes:
        raise HostileXMLError(
            f"document is larger than the limit of {max_bytes} bytes (refusing to parse it)",
            source=source)
    if len(data) < 64 and not data.strip():
        raise RSpecError("document is empty", source=source)
    prolog = _prolog_as_utf8(data)
    match = _HOSTILE_PROLOG.search(prolog)
    if match:
        line = prolog.count(b"\n", 0, match.start()) + 1
        what = match.group(1).decode().upper()
        raise HostileXMLError(
            f"refusing XML with a {what} declaration (DTDs and entities are never processed)",
            source=source, line=line)
    return data


def _syntax_error(message: str, line: int | None, source: str | None) -> RSpecError:
    message = re.sub(r",\s*line \d+, column \d+$", "", message)
    lowered = message.lower()
    if "entity" in lowered or "doctype" in lowered or "dtd" in lowered:
        return HostileXMLError(f"refusing XML: {message}", source=source, line=line)
    return RSpecError(f"not well-formed XML: {message}", source=source, line=line)


def _run(data: bytes, parser: etree.XMLParser, source: str | None) -> Any:
    """Run lxml once, translating its exceptions into ours (the one place that does).

    With a parser target, lxml only logs the errors libxml2 recovers from (a namespaced
    attribute given twice, an undeclared prefix) where a tree parse raises them: they are
    raised here too, so every parse path has the same idea of well-formed."""
    try:
        result = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as err:
        raise _syntax_error(err.msg or str(err), err.lineno or None, source) from err
    except _ExternalReference as err:
        raise HostileXMLError(f"refusing XML that references {err.url!r} (external DTDs and "
                              "entities are never loaded)", source=source) from None
    except (ValueError, TypeError) as err:
        raise RSpecError(f"not XML: {err}", source=source) from err
    for entry in parser.error_log:
        if entry.level >= etree.ErrorLevels.ERROR:
            raise _syntax_error(entry.message, entry.line or None, source)
    return result


def parse_xml(xml: str | bytes, source: str | None = None, *,
              max_bytes: int = DEFAULT_MAX_BYTES) -> etree._Element:
    """Parse ``xml`` and return its root element, refusing anything hostile or broken.

    Raises :class:`HostileXMLError` for a DTD, entity declarations or references, or input
    larger than ``max_bytes``; :class:`RSpecError` for input that is not well-formed XML
    (truncated, empty, garbage). Both carry ``source`` and, when known, the line.
    """
    root = _run(checked_bytes(xml, source, max_bytes=max_bytes), _parser(), source)
    _refuse_dtd_and_entities(root, source)
    return root


def parse_events(xml: str | bytes, target: SafeTarget, source: str | None = None, *,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Parse ``xml`` into ``target``'s callbacks (no tree is built); returns
    ``target.close()``. Same refusals as :func:`parse_xml`; an ``RSpecError`` raised by a
    callback propagates unchanged."""
    target.source = source
    data = checked_bytes(xml, source, max_bytes=max_bytes)
    return _run(data, _new_parser(target), source)


def _refuse_dtd_and_entities(root: etree._Element, source: str | None) -> None:
    """Catch declarations the prolog scan could not see (e.g. UTF-16 documents)."""
    docinfo = root.getroottree().docinfo
    if docinfo.doctype or docinfo.internalDTD is not None or docinfo.system_url:
        raise HostileXMLError(
            "refusing XML with a DOCTYPE declaration (DTDs and entities are never processed)",
            source=source, line=1)
    # Entity references need declarations, which need a DOCTYPE (refused above); an
    # undeclared one is already a syntax error. So no tree walk for _Entity nodes here.
