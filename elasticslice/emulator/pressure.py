"""A slow or busy CM on demand: some methods take long, or answer BUSY, as CloudLab's do.

    elasticslice emulator serve --dir D --slow AddNodes=30 --busy AddNodes=0.5

``--slow METHOD=SECONDS``: every call of METHOD waits that long before it is carried out (the
real CM maps and allocates inside CreateSliver and AddNodes, which takes tens of seconds).
``--busy METHOD=FRACTION``: that share of METHOD's calls answer BUSY (code 14) at once, as
a CM does while the slice is locked; a client retries with back-off. Both repeat, one
method each; ``cm.RenewSlice`` names a method of one module only (sa, cm, dynslice), a bare
name the method wherever it is; ``wisc/AddNodes`` (or ``wisc/cm.AddNodes``) the method at
one cluster of a box of several (clusters.py), whose other clusters are not slowed. The
same seed gives the same BUSY answers.

Unlike ``--fault-rate`` (random faults on any call), this is aimed: tests, benches and users
reproduce "AddNodes takes 30 s" or "the client is in BUSY back-off" and watch the callbacks.
:meth:`Pressure.in_flight` and :meth:`Pressure.busy_answers` say what is going on now;
:meth:`Pressure.relieve` ends the pressure (calls sleeping go on at once).
"""
from __future__ import annotations

import math
import random
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from elasticslice.errors import ConfigError

MAX_SLOW = 3600.0   # seconds: longer is a hung CM, not a slow one
MODULES = ("sa", "cm", "dynslice")
CLUSTER = re.compile(r"[a-z][a-z0-9]{0,15}")  # a cluster's name (clusters.py)


def _known_methods() -> frozenset[str]:
    from elasticslice.emulator.cm import ComponentManager
    from elasticslice.emulator.dynamic import DynamicSliceService
    from elasticslice.emulator.sa import SliceAuthority
    names = set()
    for service, module in ((SliceAuthority, "sa"), (ComponentManager, "cm"),
                            (DynamicSliceService, "dynslice")):
        names |= set(service.METHODS) | {f"{module}.{m}" for m in service.METHODS}
    return frozenset(names)


def parse_items(items: Iterable[str], option: str) -> dict[str, float]:
    """``["AddNodes=30", ...]`` (the repeatable ``--slow`` / ``--busy``) as a dict; one line
    naming the option and the item when an item is malformed."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, raw = str(item).partition("=")
        name = name.strip()
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not sep or not name or not math.isfinite(value):
            raise ConfigError(f"{option} {item!r}: expected METHOD=NUMBER (e.g. AddNodes=30)")
        out[name] = value
    return out


class Pressure:
    """Which methods are slow (seconds) or busy (a fraction of their calls); thread-safe."""

    def __init__(self, slow: Mapping[str, float] | None = None,
                 busy: Mapping[str, float] | None = None, seed: int | None = None) -> None:
        self.slow = self._check(slow or {}, "slow", 0.0, MAX_SLOW)
        self.busy = self._check(busy or {}, "busy", 0.0, 1.0)
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._relieved = threading.Event()
        self._flying: dict[str, int] = {}
        self._busy_answers: dict[str, int] = {}
        self.closed = False

    @staticmethod
    def _check(values: Mapping[str, float], option: str, low: float, high: float
               ) -> dict[str, float]:
        known = _known_methods() if values else frozenset()
        for name, value in values.items():
            cluster, slash, bare = name.rpartition("/")
            if bare not in known or (slash and not CLUSTER.fullmatch(cluster)):
                raise ConfigError(f"--{option} {name}: not a method of the emulator's SA, CM "
                                  f"or dynslice server (e.g. AddNodes, cm.RenewSlice, "
                                  f"wisc/AddNodes)")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not low <= value <= high:
                raise ConfigError(f"--{option} {name}={value}: expected a number from "
                                  f"{low:g} to {high:g}")
        return {k: float(v) for k, v in values.items()}

    def clusters(self) -> set[str]:
        """The clusters the settings name (``wisc/AddNodes``: wisc)."""
        with self._lock:
            return {k.rpartition("/")[0] for k in (*self.slow, *self.busy)} - {""}

    @staticmethod
    def _setting(table: Mapping[str, float], module: str, method: str,
                 cluster: str = "") -> float:
        for key in ((f"{cluster}/{module}.{method}", f"{cluster}/{method}") if cluster else ()):
            if key in table:
                return table[key]
        return table.get(f"{module}.{method}", table.get(method, 0.0))

    def apply(self, module: str, method: str, cluster: str = "") -> bool:
        """Before a call of ``module.method`` (at ``cluster``, of a box of several): True
        when it must answer BUSY now; otherwise it first waits out the method's slowness
        (ended early by :meth:`relieve`)."""
        fraction = self._setting(self.busy, module, method, cluster)
        if fraction > 0.0:
            with self._lock:
                hit = self._random.random() < fraction
                if hit:
                    self._busy_answers[method] = self._busy_answers.get(method, 0) + 1
            if hit:
                return True
        seconds = self._setting(self.slow, module, method, cluster)
        if seconds <= 0.0 or self._relieved.is_set():
            return False
        with self._lock:
            self._flying[method] = self._flying.get(method, 0) + 1
        try:
            self._relieved.wait(seconds)
        finally:
            with self._lock:
                self._flying[method] -= 1
        return self.closed  # a server stopping answers BUSY: its state is going away

    def in_flight(self, method: str) -> int:
        """Calls of ``method`` waiting out their slowness now (not yet carried out)."""
        with self._lock:
            return self._flying.get(method, 0)

    def busy_answers(self, method: str) -> int:
        """Calls of ``method`` answered BUSY so far."""
        with self._lock:
            return self._busy_answers.get(method, 0)

    def set(self, slow: Mapping[str, float] | None = None,
            busy: Mapping[str, float] | None = None) -> None:
        """Change the pressure of a running server (None: leave it as it is)."""
        slow = self._check(slow, "slow", 0.0, MAX_SLOW) if slow is not None else None
        busy = self._check(busy, "busy", 0.0, 1.0) if busy is not None else None
        with self._lock:
            self.slow = self.slow if slow is None else slow
            self.busy = self.busy if busy is None else busy
            self._relieved.clear()

    def relieve(self) -> None:
        """No more pressure: calls waiting go on at once, later ones are neither slow nor
        busy."""
        with self._lock:
            self.slow, self.busy = {}, {}
        self._relieved.set()

    def close(self) -> None:
        """The server stops: calls waiting answer BUSY at once."""
        self.closed = True
        self.relieve()

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"slow": dict(self.slow), "busy": dict(self.busy),
                    "in_flight": {k: v for k, v in self._flying.items() if v},
                    "busy_answers": dict(self._busy_answers)}
