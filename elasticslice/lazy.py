"""A package's public names, each imported from its module when first asked for (PEP 562).

    __getattr__, __dir__ = lazy.exports(__name__, {"Name": "module", ...})

A process that needs one module of the package does not load the others (what they import
costs every start its CPU). ``troy.frameworks.dask`` does the same with its own lines:
Troy never imports elasticslice.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, where: Mapping[str, str]
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__``, while its
    ``__init__`` runs): ``where`` maps each public name to the submodule that defines it."""
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:  # noqa: N807
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        setattr(module, name, value)   # asked once
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*vars(module), *where})

    return __getattr__, __dir__
