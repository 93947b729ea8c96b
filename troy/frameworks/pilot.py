"""``Pilot``: a framework's pilot (seed 000's ``Pilot``), its state and its cores.

A pilot is made and driven by its framework (:mod:`troy.frameworks.base`); everything that
changes its shape (state, cores in use, draining, backlog) is counted in the framework's
:class:`~troy.frameworks.shapes.ShapeIndex`.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from troy.frameworks.shapes import Shape, ShapeIndex, shape_of
from troy.states import FINAL_STATES, State

if TYPE_CHECKING:
    from troy.frameworks.base import PilotFramework
    from troy.descriptions import PilotDescription

log = logging.getLogger(__name__)

PilotCallback = Callable[["Pilot", State], Any]
_pilot_seq = itertools.count()


class Pilot:
    """A pilot of some framework (seed 000's ``Pilot``).

    ``state``: PENDING (submitted) → RUNNING (accepting units) → DONE / CANCELED / FAILED.
    ``draining`` pilots run what they have but accept nothing new. ``free_cores`` is
    ``description.size`` less the cores of the units handed to it and not yet final
    (started or not). ``backlog`` is how many cores' worth of units beyond its size the
    pilot accepts to queue (frameworks with a costly hand-off keep their queue fed with it);
    ``room`` is what it accepts now: ``size + backlog`` less those units' cores.
    Every change of these is counted in the framework's :class:`ShapeIndex` (what the
    built-in schedulers ask instead of looking at every pilot).

    For elastic clusters: ``value`` (the resource owner's value of it, 0..1, lower is
    reclaimed sooner; None: unknown; see ``PilotFramework.set_pilot_values``), ``busy``
    (units not final are handed to it), ``idle_since`` (``time.time()`` it last became empty
    or RUNNING; None while busy or not yet running), ``worker_name`` (a Dask pilot that
    joined on its own: the worker's name, e.g. the node agent's NAME).
    """

    def __init__(self, description: PilotDescription, framework: PilotFramework,
                 uid: str | None = None) -> None:
        self.id = uid or f"pilot.{next(_pilot_seq):04d}"
        self.description = description
        self.framework = framework
        self.native_id: str | None = None  # e.g. the Dask worker address
        self._state = State.PENDING
        self._used = 0
        self._draining = False
        self._backlog = 0
        self._lock = threading.Lock()
        self._callbacks: list[PilotCallback] = []
        self.value: float | None = None
        self.worker_name: str | None = None
        self.idle_since: float | None = None
        index = getattr(framework, "_shapes", None)
        self._index: ShapeIndex | None = index if isinstance(index, ShapeIndex) else None
        self._shape: Shape | None = None
        with self._lock:
            self._reshape()

    def __repr__(self) -> str:
        return (f"<Pilot {self.id} {self._state.value} size={self.description.size} "
                f"free={self.free_cores}>")

    @property
    def state(self) -> State:
        return self._state

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        with self._lock:
            self._draining = bool(value)
            self._reshape()

    @property
    def backlog(self) -> int:
        return self._backlog

    @backlog.setter
    def backlog(self, value: int) -> None:
        with self._lock:
            self._backlog = int(value)
            self._reshape()

    def _reshape(self) -> None:
        """Count the pilot's current shape in its framework's index (own lock held)."""
        if self._index is not None:
            new = shape_of(self)
            self._index.move(self._shape, new)
            self._shape = new

    @property
    def size(self) -> int:
        return self.description.size

    @property
    def free_cores(self) -> int:
        if self._state is not State.RUNNING or self.draining:
            return 0
        return max(0, self.description.size - self._used)

    @property
    def room(self) -> int:
        if self._state is not State.RUNNING or self.draining:
            return 0
        return max(0, self.description.size + self.backlog - self._used)

    @property
    def busy(self) -> bool:
        return self._used > 0

    def _reserve(self, cores: int) -> None:
        with self._lock:
            self._used += cores
            self.idle_since = None
            self._reshape()

    def _release(self, cores: int) -> None:
        with self._lock:
            self._used = max(0, self._used - cores)
            if self._used == 0 and self.idle_since is None:
                self.idle_since = time.time()
            self._reshape()

    def add_callback(self, cb: PilotCallback) -> None:
        self._callbacks.append(cb)

    def _set_state(self, state: State) -> None:
        with self._lock:
            if self._state in FINAL_STATES or self._state is state:
                return
            self._state = state
            if state is State.RUNNING and self._used == 0:
                self.idle_since = time.time()
            self._reshape()
        watchers = list(getattr(self.framework, "_pilot_watchers", ()))
        for cb in list(self._callbacks) + watchers:
            try:
                cb(self, state)
            except Exception:
                log.exception("pilot callback %r on %s failed", cb, self.id)

    def cancel(self) -> None:
        """Cancel the pilot; its unfinished units are handed back to the framework's queue
        (or fail, if the framework has nowhere else to put them)."""
        self.framework.cancel_pilot(self.id)

    def wait_running(self, timeout: float | None = None) -> State:
        return self.framework.wait_pilot(self, timeout)
