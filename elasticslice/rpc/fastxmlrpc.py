"""A faster reader of XML-RPC answers, with ``xmlrpc.client.loads`` as the one authority.

The manager's cycle reads SliverStatus from every CM each pass: at 1,000 nodes the answer is
about 900 KiB of XML-RPC (some 40,000 elements), and the standard library's reader (a Python
call per element, tag and text, from expat) was two thirds of the cycle's CPU. Here the
same expat builds an ``xml.etree`` tree in C (its elements are plain objects: reading a tag
costs nothing, unlike lxml's proxies) and one small Python function turns the usual shapes
(struct, array, string, int, boolean, double, nil) into values, with the cyclic garbage
collector paused meanwhile: about half the CPU (1,000 nodes: 27 -> 13 ms; 5,000: 140 ->
69 ms).

Anything else (a fault, a DOCTYPE, a type this reader leaves alone such as base64 or
dateTime, a namespaced tag, elements where text belongs, a document expat refuses) goes to
``xmlrpc.client.loads(data, use_builtin_types=True)`` unchanged, so what the answer means
and every error it raises are the standard library's. tests/elasticslice/rpc/
test_fastxmlrpc.py checks the two agree.

Before both, where it is built (:mod:`elasticslice.rpc.fastxmlbuild`), a C reader
(``_fastxmlrpc.c``: lxml's libxml2, SAX callbacks making the values in one pass) reads the
same usual shapes about three times faster again (a 1,000-node SliverStatus: 17 -> 5 ms;
5,000: ~100 -> 25 ms), and hands anything it has the least doubt about (an error or warning
of libxml2's, a DOCTYPE, an attribute, a number Python's int() refuses...) to the Python
reader above, unchanged. The C reader first tries a plainer one of its own that needs no
parser: an answer with only whitespace between its elements and ASCII text (what CloudLab's
and the emulator's SliverStatus are) is read byte by byte, about three times faster again
(a 1,000-node SliverStatus: 5.8 -> 2.0 ms), base64 included; at the least doubt libxml2 reads
it. ``ELASTICSLICE_XMLRPC_READER=python`` turns both off.
tests/elasticslice/rpc/test_fast_xmlrpc_c.py checks the readers agree.
"""
from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
import xmlrpc.client
from collections.abc import Callable
from typing import Any

from troy.collector import collector_paused

_BOOLEANS = {"0": False, "1": True}


class _Unusual(Exception):
    """A shape this reader leaves to the standard library."""


_problem: str | None = None
#: The C reader runs lxml's libxml2: it is loaded once lxml.etree is (the RSpec library, the
#: credentials), or for an answer this long; importing lxml for less (~40 ms of CPU) would
#: cost a short command (getversion) more than it saves (tests/test_cli_imports.py).
_LOAD_LXML_FROM = 256 * 1024
_c_loads: Callable[[bytes], Any] | None = None
_C_UNUSUAL: Any = object()   # the C reader's "the Python reader decides" (its UNUSUAL)


def _load() -> None:
    global _problem, _c_loads, _C_UNUSUAL
    if os.environ.get("ELASTICSLICE_XMLRPC_READER") == "python":
        _problem = "turned off (ELASTICSLICE_XMLRPC_READER=python)"
        return
    try:
        from lxml import etree

        from elasticslice.rpc import _fastxmlrpc  # type: ignore[attr-defined]
        version = etree.LIBXML_VERSION
        _fastxmlrpc.setup(etree.__file__, version[0] * 10000 + version[1] * 100 + version[2])
    except ImportError as err:
        _problem = f"not built or not loadable ({err}): make, or python -m " \
                   "elasticslice.rpc.fastxmlbuild"
        return
    _C_UNUSUAL = _fastxmlrpc.UNUSUAL
    _c_loads = _fastxmlrpc.loads


def problem() -> str | None:
    """Why the C reader is not used (None: it is)."""
    if _c_loads is None and _problem is None:
        _load()
    return _problem


def _value(v: Any) -> Any:  # noqa: C901 (one dispatch, kept flat for speed)
    """A ``<value>`` element as Python (as ``xmlrpc.client``'s Unmarshaller makes it)."""
    if not len(v):
        return v.text or ""
    if len(v) != 1:
        raise _Unusual
    c = v[0]
    tag = c.tag
    if tag == "string":
        if len(c):
            raise _Unusual
        return c.text or ""
    if tag == "struct":
        out = {}
        for m in c:
            # not exactly two children: ValueError, and the standard library decides
            name, val = m
            if name.tag != "name" or val.tag != "value" or len(name):
                raise _Unusual
            if len(val) == 1:  # the common case inline: a string member
                s = val[0]
                if s.tag == "string" and not len(s):
                    out[name.text or ""] = s.text or ""
                    continue
            out[name.text or ""] = _value(val)
        return out
    if tag == "array":
        if len(c) != 1 or c[0].tag != "data":
            raise _Unusual
        items = []
        for x in c[0]:
            if x.tag != "value":
                raise _Unusual
            items.append(_value(x))
        return items
    if len(c):
        raise _Unusual
    if tag in ("int", "i4", "i8"):
        return int(c.text)   # None or junk: ValueError/TypeError -> the standard library
    if tag == "boolean":
        return _BOOLEANS[c.text]  # KeyError -> the standard library says "bad boolean"
    if tag == "double":
        return float(c.text)
    if tag == "nil":
        return None
    raise _Unusual


def loads_result(data: bytes) -> Any:
    """The one value of an XML-RPC ``methodResponse``: what ``(result,), _ =
    xmlrpc.client.loads(data, use_builtin_types=True)`` gives, with the same exceptions
    (``xmlrpc.client.Fault``, ``ResponseError``, ``ExpatError``, ``ValueError``...)."""
    # The tree's elements are many and short-lived (freed as soon as the values are made,
    # by reference counting): the cyclic collector's passes over them while they are being
    # made find nothing, and cost a third of a 5,000-node SliverStatus. Paused, as
    # elasticslice.rspec.parse and Troy's dispatch do; it runs as usual afterwards.
    try:
        with collector_paused():
            c = _c_loads
            if c is None and _problem is None and (len(data) >= _LOAD_LXML_FROM or
                                                   "lxml.etree" in sys.modules):
                problem()
                c = _c_loads
            if c is not None:
                got = c(data)
                if got is not _C_UNUSUAL:
                    return got
            return _fast(data)
    except Exception:  # noqa: BLE001 (anything unusual: the standard library decides)
        pass
    (result,), _ = xmlrpc.client.loads(data, use_builtin_types=True)
    return result


def _fast(data: bytes) -> Any:
    if b"<!DOCTYPE" in data:  # entities: as the standard library treats them
        raise _Unusual
    root = ET.fromstring(data)  # expat, like xmlrpc.client; comments and PIs left out
    if root.tag != "methodResponse" or len(root) != 1:
        raise _Unusual
    params = root[0]
    if params.tag != "params" or len(params) != 1:
        raise _Unusual
    param = params[0]
    if param.tag != "param" or len(param) != 1 or param[0].tag != "value":
        raise _Unusual
    return _value(param[0])
