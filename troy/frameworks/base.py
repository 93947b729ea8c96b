"""The pilot framework contract (seed 003): a handful of methods, no more.

A framework owns pilots (resource placeholders of ``size`` cores) and runs compute units on
them. ``submit_unit(cud)`` without a pilot leaves the binding to the framework (late binding);
with a pilot it binds early. Application-level schedulers inspect ``list_pilots()`` (state,
``description.size``, ``free_cores``) and pick a framework through the public API alone.

A subclass must provide: ``kind`` (the registry name), ``start``, ``close``,
``_launch_pilot``, ``_cancel_pilot``, ``_submit``, ``cancel_unit``. It must push every unit
state change through ``unit._set_state`` and every pilot change through ``pilot._set_state``.
Constructors do no I/O; ``start`` does.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from troy.descriptions import ComputeUnitDescription, PilotDescription
from troy.errors import BadParameter, DoesNotExist, IncorrectState
from troy.frameworks.drain import DrainPlan, StatCounter, UnitStats
from troy.frameworks.shapes import Shape, ShapeIndex, shape_of
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit

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


class PilotFramework(ABC):
    """Base of every pilot framework (``local``, ``dask``, ...).

    Options every framework takes: ``long_unit`` (seconds: units with a runtime hint at
    least this long are *long*, default 30) and ``low_value`` (pilots valued below it,
    default 0.5, get no long unit while another live pilot could take it; see
    ``set_pilot_values``)."""

    kind: ClassVar[str] = ""

    def __init__(self, name: str | None = None, *, long_unit: float = 30.0,
                 low_value: float = 0.5, **options: Any) -> None:
        self.name = name or self.kind
        self.options = options
        self._pilots: dict[str, Pilot] = {}
        self._shapes = ShapeIndex()  # pilots per shape: what the schedulers ask
        self._lock = threading.RLock()
        for opt, v in (("long_unit", long_unit), ("low_value", low_value)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise BadParameter(f"framework {self.name!r}: {opt}: expected a number "
                                   f">= 0, got {v!r}")
        self.long_unit = float(long_unit)
        self.low_value = float(low_value)
        self._stats = StatCounter()
        self._values: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} pilots={len(self._pilots)}>"

    # -- lifecycle --------------------------------------------------------------------
    @abstractmethod
    def start(self) -> None:
        """Acquire what the framework needs (processes, a scheduler...). Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Cancel every pilot and release everything; units not final become CANCELED."""

    # -- pilots -----------------------------------------------------------------------
    def submit_pilot(self, description: PilotDescription | dict[str, Any]) -> Pilot:
        """Start a pilot of ``description.size`` cores; returns at once (state PENDING)."""
        pd = PilotDescription.coerce(description)
        pilot = Pilot(pd, self)
        with self._lock:
            self._pilots[pilot.id] = pilot
        self._launch_pilot(pilot)
        return pilot

    def add_pilot_callback(self, cb: PilotCallback) -> None:
        """Call ``cb(pilot, state)`` on every state change of every pilot of this framework,
        present and future, however created (a UnitService uses it to re-check the units
        it queues). ``Pilot._set_state`` calls these after the pilot's own callbacks."""
        with self._lock:
            if not hasattr(self, "_pilot_watchers"):
                self._pilot_watchers: list[PilotCallback] = []
            self._pilot_watchers.append(cb)

    def list_pilots(self) -> list[Pilot]:
        with self._lock:
            return list(self._pilots.values())

    def get_pilot(self, pilot_id: str) -> Pilot:
        with self._lock:
            try:
                return self._pilots[pilot_id]
            except KeyError:
                raise DoesNotExist(f"framework {self.name!r} has no pilot {pilot_id!r}") from None

    def cancel_pilot(self, pilot_id: str) -> None:
        pilot = self.get_pilot(pilot_id)
        if pilot.state not in FINAL_STATES:
            self._cancel_pilot(pilot)
            pilot._set_state(State.CANCELED)

    def wait_pilot(self, pilot: Pilot, timeout: float | None = None) -> State:
        """Block until ``pilot`` leaves PENDING (frameworks may override to wait better)."""
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while pilot.state is State.PENDING:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return pilot.state

    def find_pilot(self, key: str) -> Pilot | None:
        """The pilot whose id, ``native_id`` or ``worker_name`` is ``key`` (live pilots
        first: a worker name may come back after its pilot ended), or None."""
        found = [p for p in self.list_pilots() if key in (p.id, p.native_id, p.worker_name)]
        live = [p for p in found if p.state not in FINAL_STATES]
        return (live or found or [None])[-1]

    def set_pilot_values(self, values: Mapping[str, float]) -> None:
        """Record the resource owner's value of pilots (keys: pilot id, ``native_id`` or
        ``worker_name``; values 0..1, lower is reclaimed sooner); a pilot that appears later
        under a known key gets its value then. Long units (runtime hint >= ``long_unit``)
        go to no pilot valued below ``low_value`` while another RUNNING pilot that is not
        draining could take them."""
        with self._lock:
            for key, v in values.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise BadParameter(f"framework {self.name!r}: value of {key!r}: "
                                       f"expected a number, got {v!r}")
                self._values[str(key)] = float(v)
            for p in self._pilots.values():
                self._apply_value(p)
        self._values_changed()

    def _apply_value(self, pilot: Pilot) -> None:
        for key in (pilot.id, pilot.native_id, pilot.worker_name):
            if key is not None and key in self._values:
                pilot.value = self._values[key]

    def _values_changed(self) -> None:
        """Pilot values or the set of live pilots changed (frameworks re-place long units)."""

    def is_long(self, cud: ComputeUnitDescription) -> bool:
        return bool(cud.runtime) and float(cud.runtime) >= self.long_unit

    def long_pilots(self) -> list[Pilot]:
        """The pilots that may take long units now: RUNNING, not draining, valued at least
        ``low_value`` (or not valued); if there is none, every RUNNING pilot that is not
        draining. A long unit no such pilot is wide enough for may go to any pilot."""
        live = [p for p in self.list_pilots() if p.state is State.RUNNING and not p.draining]
        return [p for p in live if p.value is None or p.value >= self.low_value] or live

    def drain_pilot(self, pilot: Pilot, deadline: float | None = None, *, margin: float = 5.0,
                    on_empty: Callable[[Pilot], None] | None = None) -> DrainPlan:
        """Empty ``pilot`` before ``deadline`` (epoch seconds; None: let everything finish).

        Within a second nothing new goes to it. Units not expected to end by ``deadline -
        margin`` (runtime hint less elapsed time; without a hint, expected to end if at
        least ``max(long_unit, 30)`` s are left) are requeued at once and run elsewhere; the
        others run on. At ``deadline - margin`` whatever is still there is requeued (killed
        on the pilot). ``on_empty(pilot)`` is called once, on a thread of its own, when the
        pilot holds no unit (at once if it is empty already). Calling again may only bring
        the deadline closer. The pilot stays RUNNING (draining) until it goes away."""
        raise IncorrectState(f"framework {self.name!r} ({self.kind}) cannot drain pilots")

    def lose_pilot(self, pilot: Pilot, reason: str = "lost") -> list[ComputeUnit]:
        """``pilot``'s machine is gone (forced revocation, crash): requeue at once every
        unit it had (returned), the pilot goes FAILED. Idempotent; nothing waits for the
        machine."""
        raise IncorrectState(f"framework {self.name!r} ({self.kind}) cannot lose pilots")

    def unit_stats(self) -> UnitStats:
        """Requeues, duplicate completions and lost units so far (see ``UnitStats``)."""
        return self._stats.snapshot()

    def live_units(self) -> list[ComputeUnit]:
        """The units this framework holds that are not final (queued or running)."""
        return []

    @property
    def free_cores(self) -> int:
        return sum(p.free_cores for p in self.list_pilots())

    @property
    def total_cores(self) -> int:
        return sum(p.size for p in self.list_pilots() if p.state is State.RUNNING)

    # -- units ------------------------------------------------------------------------
    def submit_unit(self, unit: ComputeUnit | ComputeUnitDescription | dict[str, Any],
                    pilot: Pilot | str | None = None) -> ComputeUnit:
        """Run a unit. ``pilot`` binds it early; None leaves the choice to the framework.

        A unit wider than every pilot of this framework waits until one appears.
        """
        if not isinstance(unit, ComputeUnit):
            unit = ComputeUnit(ComputeUnitDescription.coerce(unit))
        target = self.get_pilot(pilot) if isinstance(pilot, str) else pilot
        if target is not None and target.state in FINAL_STATES:
            raise IncorrectState(f"pilot {target.id} is {target.state.value}")
        unit.framework = self.name
        unit._framework_obj = self
        unit.attempts += 1
        unit._set_state(State.DISPATCHED)
        self._submit(unit, target)
        return unit

    @abstractmethod
    def cancel_unit(self, unit: ComputeUnit) -> None:
        """Cancel ``unit``: never starts if queued; killed if running; state CANCELED."""

    # -- for subclasses ---------------------------------------------------------------
    @abstractmethod
    def _launch_pilot(self, pilot: Pilot) -> None:
        """Start the pilot's resources; push RUNNING when it can take units."""

    @abstractmethod
    def _cancel_pilot(self, pilot: Pilot) -> None:
        """Stop the pilot's resources and requeue or cancel its unfinished units."""

    @abstractmethod
    def _submit(self, unit: ComputeUnit, pilot: Pilot | None) -> None:
        """Queue ``unit`` (bound to ``pilot`` if given); push PENDING/RUNNING/final states."""
