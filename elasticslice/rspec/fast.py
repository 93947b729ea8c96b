"""The C RSpec reader, when it is built (:mod:`elasticslice.rspec.fastbuild`).

:func:`read` gives the records :func:`elasticslice.rspec.parse` would, or None when the
Python reader must decide (anything libxml2 reports, a DOCTYPE, a value the C reader does
not read exactly as the Python one). ``ELASTICSLICE_RSPEC_READER=python`` turns it off.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from elasticslice.rspec.model import SLIVER_TYPE_ALIASES, Interface, Link, Login, Node, RSpec

_problem: str | None = None
_parse: Callable[[bytes], Any] | None = None


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _load() -> None:
    global _problem, _parse
    if os.environ.get("ELASTICSLICE_RSPEC_READER") == "python":
        _problem = "turned off (ELASTICSLICE_RSPEC_READER=python)"
        return
    try:
        from lxml import etree

        from elasticslice.rspec import _fastrspec  # type: ignore[attr-defined]
        from elasticslice.rspec.parse import _root
        version = etree.LIBXML_VERSION
        _fastrspec.setup(etree.__file__, version[0] * 10000 + version[1] * 100 + version[2],
                         lambda tag, attrib: _root(tag, attrib)[0], SLIVER_TYPE_ALIASES,
                         (Node, _fields(Node)), (Interface, _fields(Interface)),
                         (Login, _fields(Login)), (Link, _fields(Link)))
    except ImportError as err:
        _problem = f"not built or not loadable ({err}): make, or python -m " \
                   "elasticslice.rspec.fastbuild"
        return
    _parse = _fastrspec.parse


def problem() -> str | None:
    """Why the C reader is not used (None: it is)."""
    if _parse is None and _problem is None:
        _load()
    return _problem


def read(data: bytes, plain: bool = False) -> RSpec | None:
    """The RSpec in ``data`` read in C, or None: the Python reader decides. ``plain``: only
    a document without ``emulab:vnode`` elements (a vnode can name a node that does not
    name itself: the records no longer say which name was the node's own)."""
    if _parse is None and problem() is not None:
        return None
    if not plain:
        return _parse(data)  # type: ignore[misc]
    got = _parse(data, True)  # type: ignore[misc]
    return None if got is None or got[1] else got[0]
