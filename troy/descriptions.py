"""Typed descriptions: what the seeds call property bags, as validated dataclasses.

Every API that takes a description takes a dict too (``workload.add_task({"executable":
"/bin/date"})``; explicitly ``TaskDescription.coerce(d)``), the way the seeds' ``Properties``
did, but unknown keys and wrong types are refused with ``BadParameter`` naming the field.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from troy.errors import BadParameter
from troy.limits import MAX_TASKS, is_finite_number

D = TypeVar("D", bound="Description")


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: a message quoting a huge or deeply
    nested value stays one short line."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<a too deeply nested {type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}..."


def _word(value: Any) -> bool:
    """Whether ``value`` can become one argument or environment string: a string without
    NUL, or a finite number (a struct, a list or None cannot)."""
    if isinstance(value, str):
        return "\0" not in value
    return isinstance(value, (int, float)) and not _non_finite(value)


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """A description class's field names, in order (``dataclasses.fields`` walks them at
    every call: this once per class)."""
    return tuple(f.name for f in fields(cls))


class Description:
    """Mixin for description dataclasses: dict coercion and per-field validation."""

    _kind: ClassVar[str] = "description"

    @classmethod
    def coerce(cls: type[D], value: D | Mapping[str, Any] | None = None, **kwargs: Any) -> D:
        """Return ``value`` if it already is a ``cls``, else build one from a mapping."""
        if isinstance(value, cls) and not kwargs:
            return value
        data: dict[str, Any] = {}
        if isinstance(value, Description):
            data.update(value.to_dict())
        elif isinstance(value, Mapping):
            data.update(value)
        elif value is not None:
            raise BadParameter(f"{cls._kind}: expected a mapping or {cls.__name__}, "
                               f"got {type(value).__name__}")
        data.update(kwargs)
        names = set(_field_names(cls))
        unknown = sorted(set(data) - names)
        if unknown:
            raise BadParameter(f"{cls._kind}: unknown field(s) {', '.join(unknown)}; "
                               f"known: {', '.join(sorted(names))}")
        return cls(**data)

    def to_dict(self, deep: bool = True, *, defaults: bool = True) -> dict[str, Any]:
        """A plain dict (JSON-friendly except for callables) of every field (``deep``:
        nested descriptions, a bundle's members, as dicts too; ``defaults=False``: only
        the fields that differ from their defaults, which building the description again
        from the dict gives back: what goes over the wire and into the store, where a
        bundle of 250 ``/bin/true`` members is 250 one-field dicts instead of 250 of 22)."""
        d = self.__dict__   # a dataclass's fields are its instance attributes
        if defaults:
            out = {name: d[name] for name in _field_names(type(self))}
        else:
            out = _sparse_of(type(self))(d)
        if deep:
            for name, v in out.items():
                if isinstance(v, list) and v and isinstance(v[0], Description):
                    out[name] = [x.to_dict(defaults=defaults) for x in v]
        return out

    def replace(self: D, **changes: Any) -> D:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    # -- validation helpers -------------------------------------------------------------
    def _check_str(self, name: str, optional: bool = True) -> None:
        v = getattr(self, name)
        if v is None and optional:
            return
        if not isinstance(v, str) or (not optional and not v):
            raise BadParameter(f"{self._kind}.{name}: expected a string, got {short_repr(v)}")
        if "\0" in v:  # exec and open refuse these; say so now, not when the unit runs
            raise BadParameter(f"{self._kind}.{name}: contains a NUL character: "
                               f"{short_repr(v)}")

    def _check_int(self, name: str, minimum: int, optional: bool = False,
                   maximum: int | None = None) -> None:
        v = getattr(self, name)
        if v is None and optional:
            return
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise BadParameter(f"{self._kind}.{name}: expected an integer >= {minimum}, "
                               f"got {short_repr(v)}")
        if maximum is not None and v > maximum:
            raise BadParameter(f"{self._kind}.{name}: {v} is more than the limit of {maximum}")

    def _check_number(self, name: str, optional: bool = True) -> None:
        v = getattr(self, name)
        if v is None and optional:
            return
        if not is_finite_number(v) or v < 0:
            raise BadParameter(f"{self._kind}.{name}: expected a finite number >= 0, "
                               f"got {short_repr(v)}")

    def _check_str_list(self, name: str) -> None:
        v = getattr(self, name)
        if isinstance(v, tuple):
            v = list(v)
            object.__setattr__(self, name, v)
        if not isinstance(v, list) or not all(_word(x) for x in v):
            raise BadParameter(f"{self._kind}.{name}: expected a list of strings, "
                               f"got {short_repr(v)}")
        object.__setattr__(self, name, [str(x) for x in v])

    def _check_env(self, name: str) -> None:
        v = getattr(self, name)
        if not isinstance(v, Mapping) or not all(
                isinstance(k, str) and k and "=" not in k and _word(k) and _word(x)
                for k, x in v.items()):
            raise BadParameter(f"{self._kind}.{name}: expected a mapping of strings, "
                               f"got {short_repr(v)}")
        object.__setattr__(self, name, {k: str(x) for k, x in v.items()})


@dataclass
class _WorkFields(Description):
    """Fields shared by tasks and compute units: what to run, and with what resources.

    A unit runs either ``executable`` (a real process: ``arguments``, ``environment``,
    ``working_directory``, ``stdin``/``stdout``/``stderr`` file names) or ``function`` (a
    Python callable with ``args``/``kwargs``; only frameworks that can ship code run these).
    ``inputs``/``outputs`` are staging directives ``"src > dst"`` (or just ``"path"``),
    copied into and out of the working directory. ``cores`` are reserved on the pilot for the
    unit's lifetime; ``memory`` is in MB; ``walltime`` in seconds kills the unit when exceeded.
    ``runtime`` is a hint (seconds the work is expected to take; nothing enforces it): the
    workload manager bundles tasks whose hint is short (see docs/troy.md, "Bundling").
    """

    executable: str | None = None
    arguments: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    working_directory: str | None = None
    stdin: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    cores: int = 1
    memory: int | None = None
    walltime: float | None = None
    tag: str | None = None
    function: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    runtime: float | None = None

    def __post_init__(self) -> None:
        for name in ("executable", "working_directory", "stdin", "stdout", "stderr", "tag"):
            self._check_str(name)
        for name in ("arguments", "inputs", "outputs"):
            self._check_str_list(name)
        self._check_env("environment")
        self._check_int("cores", 1)
        self._check_int("memory", 0, optional=True)
        self._check_number("walltime")
        self._check_number("runtime")
        if self.function is not None and not callable(self.function):
            raise BadParameter(f"{self._kind}.function: expected a callable, got {self.function!r}")
        if self.function is not None and self.executable is not None:
            raise BadParameter(f"{self._kind}: give executable or function, not both")
        self.args = tuple(self.args)


@dataclass
class TaskDescription(_WorkFields):
    """A task of a workload (seed 001). ``cardinality`` > 1 makes the planner expand the
    task into that many tasks, with ``%(cardinal)s`` in string fields replaced by 0..N-1."""

    _kind: ClassVar[str] = "task"
    cardinality: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_int("cardinality", 1, maximum=MAX_TASKS)


@dataclass
class ComputeUnitDescription(_WorkFields):
    """What a pilot framework runs. ``bundle`` holds member descriptions when translation
    packed several short tasks into one unit: they run one after another in one unit and
    each gets its own result. ``name`` names the task(s) the unit came from (for reports)."""

    _kind: ClassVar[str] = "unit"
    name: str | None = None
    bundle: list[ComputeUnitDescription] = field(default_factory=list)

    @classmethod
    def checked(cls, fields_: Mapping[str, Any]) -> ComputeUnitDescription:
        """A unit of fields taken from a description already checked (a task's, which
        :class:`TaskDescription` checked when it was made), without checking them again:
        the workload manager makes one per task it translates. Fields not given keep their
        defaults."""
        unit = cls.__new__(cls)
        unit.__dict__.update(_defaults(), **fields_)
        return unit

    @classmethod
    def of_task(cls, task: TaskDescription, name: str) -> ComputeUnitDescription:
        """The unit of one task: the task's work fields as they are (checked when the task
        was made; its values shared, as :meth:`checked` shares them), named ``name``: a copy
        of its fields where :meth:`checked` builds every default first and then replaces
        all but two (the workload manager makes one per task it translates)."""
        unit = cls.__new__(cls)
        d = unit.__dict__
        d.update(task.__dict__)
        del d["cardinality"]
        d["name"], d["bundle"] = name, []
        return unit

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_str("name")
        self.bundle = [ComputeUnitDescription.coerce(b) for b in self.bundle]
        if self.bundle and (self.executable or self.function):
            raise BadParameter("unit: a bundle unit has members, not its own executable")
        if not self.bundle and self.executable is None and self.function is None:
            raise BadParameter("unit: needs an executable, a function, or a bundle")


@functools.cache
def _defaults_of(cls: type) -> tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]:
    """A description class's plain defaults, and its fields made by a factory."""
    plain = {f.name: f.default for f in fields(cls) if f.default is not dataclasses.MISSING}
    made = tuple((f.name, f.default_factory) for f in fields(cls)
                 if f.default_factory is not dataclasses.MISSING)
    return plain, made


@functools.cache
def _sparse_defaults(cls: type) -> dict[str, Any]:
    """Each field of a description class and its default (a factory's empty value), for
    ``to_dict(defaults=False)``."""
    plain, made = _defaults_of(cls)
    empty = {name: factory() for name, factory in made}
    return {name: plain[name] if name in plain else empty.get(name, _NO_DEFAULT)
            for name in _field_names(cls)}


_NO_DEFAULT = object()   # a field without one: always written


@functools.cache
def _sparse_of(cls: type) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``to_dict(defaults=False)`` of ``cls``'s instances, from their ``__dict__``: each
    field whose value differs from its default (:func:`_sparse_defaults`: a value of
    another type, or unequal), in field order. Made once per class as one function with a
    test per field (as :mod:`dataclasses` makes ``__init__``), the values taken in one
    C-level ``itemgetter``: the workload manager writes every task, every unit and every
    bundle member so, 4 us each as a loop over the fields, about 1 us so. An instance
    missing a field (made without ``__init__``) goes through the loop, which skips it.
    ``tests/troy/test_descriptions.py`` holds both to the same answers."""
    given = _sparse_defaults(cls)

    def by_loop(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k in given and (
            (dv := given[k]) is not v and (type(v) is not type(dv) or v != dv))}

    if not given:
        return by_loop
    names: dict[str, Any] = {"_values": operator.itemgetter(*given), "_by_loop": by_loop}
    variables = [f"v{i}" for i in range(len(given))]
    lines = ["def sparse(d):", "    try:",   # (one name: itemgetter gives the value itself)
             f"        {', '.join(variables)} = _values(d)",
             "    except KeyError:", "        return _by_loop(d)", "    out = {}"]
    for i, (name, default) in enumerate(given.items()):
        v = variables[i]
        if default is _NO_DEFAULT:
            lines.append(f"    out[{name!r}] = {v}")
            continue
        if default is None:
            test = f"{v} is not None"
        elif type(default) in (list, dict) and not default:   # a factory's empty value
            test = f"type({v}) is not {type(default).__name__} or {v}"
        else:
            names[f"_d{i}"], names[f"_t{i}"] = default, type(default)
            test = f"{v} is not _d{i} and (type({v}) is not _t{i} or {v} != _d{i})"
        lines += [f"    if {test}:", f"        out[{name!r}] = {v}"]
    lines.append("    return out")
    exec("\n".join(lines), names)   # noqa: S102 - our own field names and defaults only
    return names["sparse"]


def _defaults() -> dict[str, Any]:
    """A fresh dict of :class:`ComputeUnitDescription`'s defaults (new lists and dicts)."""
    plain, made = _defaults_of(ComputeUnitDescription)
    out = dict(plain)
    for name, factory in made:
        out[name] = factory()
    return out


@dataclass
class PilotDescription(Description):
    """A pilot: ``size`` cores on some ``resource`` for ``walltime`` seconds (None: until
    canceled), run by the pilot framework named ``framework`` (a registered kind or the
    name given to a framework instance; None lets the overlay manager choose). ``site``:
    where the resource is (a cluster of a testbed, e.g. ``utah``; None: unknown or one
    site), for placement and drains that care, and for reports."""

    _kind: ClassVar[str] = "pilot"
    size: int = 1
    framework: str | None = None
    walltime: float | None = None
    resource: str | None = None
    memory: int | None = None
    tag: str | None = None
    site: str | None = None

    def __post_init__(self) -> None:
        self._check_int("size", 1)
        self._check_str("framework")
        self._check_str("resource")
        self._check_str("tag")
        self._check_str("site")
        self._check_number("walltime")
        self._check_int("memory", 0, optional=True)
