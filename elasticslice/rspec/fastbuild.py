"""Build the C RSpec reader (``_fastrspec.c``) next to its source: ``python -m
elasticslice.rspec.fastbuild`` (``make`` runs it as part of the set-up; ``--check``,
``--force`` as :mod:`troy.native`, which builds it).

The reader needs a C compiler, this Python's headers, and the libxml2 headers lxml ships in
its wheel (``lxml/includes``): nothing else, and no libxml2 of the system (it runs lxml's
own, looked up in lxml's module). Without a compiler :func:`elasticslice.rspec.parse` reads
RSpecs in Python, the same records about three times slower (docs/rspec.md).
"""
from __future__ import annotations

from pathlib import Path

from troy.native import Module, main as _main


def _lxml_includes() -> list[Path]:
    import lxml
    return [Path(lxml.__file__).parent / "includes"]


def _lxml_module() -> list[Path]:
    import lxml
    return [Path(lxml.__file__)]


def _problem() -> str | None:
    from elasticslice.rspec import fast
    return fast.problem()


READER = Module(Path(__file__).resolve().parent / "_fastrspec.c", "elasticslice.rspec._fastrspec",
                "RSpecs read", _problem, _lxml_includes, _lxml_module, ("dl",))


def main(argv: list[str] | None = None) -> int:
    return _main(argv, (READER,))


if __name__ == "__main__":
    raise SystemExit(main())
