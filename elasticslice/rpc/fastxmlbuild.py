"""Build the C XML-RPC answer reader (``_fastxmlrpc.c``) next to its source: ``python -m
elasticslice.rpc.fastxmlbuild`` (``make`` runs it as part of the set-up; ``--check``,
``--force`` as :mod:`troy.native`, which builds it).

Like the C RSpec reader (:mod:`elasticslice.rspec.fastbuild`) it needs a C compiler, this
Python's headers and the libxml2 headers lxml ships in its wheel (``lxml/includes``), and
runs lxml's own libxml2. Without a compiler :func:`elasticslice.rpc.fastxmlrpc.loads_result`
reads answers in Python: the same values, about three times slower.
"""
from __future__ import annotations

from pathlib import Path

from elasticslice.rspec.fastbuild import _lxml_includes, _lxml_module
from troy.native import Module, main as _main


def _problem() -> str | None:
    from elasticslice.rpc import fastxmlrpc
    return fastxmlrpc.problem()


READER = Module(Path(__file__).resolve().parent / "_fastxmlrpc.c",
                "elasticslice.rpc._fastxmlrpc",
                "XML-RPC answers read", _problem, _lxml_includes, _lxml_module, ("dl",))


def main(argv: list[str] | None = None) -> int:
    return _main(argv, (READER,))


if __name__ == "__main__":
    raise SystemExit(main())
