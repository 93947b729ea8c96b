"""Pilot frameworks by name: a registry checked against ``PilotFramework``.

Built-in kinds are ``local`` and ``dask``; third parties add theirs with an entry point in the
``troy.frameworks`` group (``kind = package.module:Class``) or ``register_framework``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from troy.frameworks.base import Pilot, PilotFramework

__all__ = ["Pilot", "PilotFramework", "register_framework", "framework_class", "known_kinds"]

_BUILTIN = {"local": "troy.frameworks.local:LocalFramework",
            "dask": "troy.frameworks.dask:DaskFramework"}
_registry: dict[str, type[PilotFramework]] = {}


def __getattr__(name: str) -> Any:
    """``Pilot`` and ``PilotFramework``, imported when first asked for: a process that
    needs only a module of a framework (a node's enrolment, ``python -m
    troy.frameworks.dask.enrol``, ~170 runs in the suite) does not pay for the base
    classes and what they import."""
    if name in ("Pilot", "PilotFramework"):
        from troy.frameworks import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_framework(kind: str, cls: type[PilotFramework]) -> None:
    from troy.errors import BadParameter
    from troy.frameworks.base import PilotFramework
    if not (isinstance(cls, type) and issubclass(cls, PilotFramework)):
        raise BadParameter(f"framework {kind!r}: {cls!r} is not a PilotFramework subclass")
    _registry[kind] = cls


def _load(spec: str) -> type[PilotFramework]:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def known_kinds() -> list[str]:
    kinds = set(_BUILTIN) | set(_registry)
    from importlib.metadata import entry_points  # (slow to import: only when asked)
    kinds |= {ep.name for ep in entry_points(group="troy.frameworks")}
    return sorted(kinds)


def framework_class(kind: str) -> type[PilotFramework]:
    """The framework class registered as ``kind``; BadParameter naming the known kinds."""
    if kind not in _registry:
        spec = _BUILTIN.get(kind)
        if spec is None:
            from importlib.metadata import entry_points

            from troy.errors import BadParameter
            eps = [ep for ep in entry_points(group="troy.frameworks") if ep.name == kind]
            if not eps:
                raise BadParameter(f"unknown pilot framework {kind!r}; known: "
                                   f"{', '.join(known_kinds())}")
            cls = eps[0].load()
        else:
            cls = _load(spec)
        register_framework(kind, cls)
    return _registry[kind]
