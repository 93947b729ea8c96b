"""ComputeUnit: the live handle of one unit of work submitted to a pilot framework.

State changes are pushed by the framework (``_set_state``), never polled on attribute read.
Callbacks registered with ``add_callback`` run on every change, in the pushing thread;
``wait`` blocks until a final state.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from troy.descriptions import ComputeUnitDescription
from troy.states import FINAL_STATES, Observable, State

if TYPE_CHECKING:
    from troy.frameworks.base import PilotFramework

UnitCallback = Callable[["ComputeUnit", State], Any]

_seq = itertools.count()


def _new_token() -> str:
    return os.urandom(4).hex()


# unit ids are "unit.<counter>.<token>": the token is random per process (and renewed in a
# forked child), the counter makes ids unique within it; no uuid4 (an os.urandom call) per unit
_token = _new_token()


def _renew_token() -> None:
    global _token
    _token = _new_token()


os.register_at_fork(after_in_child=_renew_token)


@dataclass
class OutputTail:
    """The end of one output stream of a unit's process: ``data``, its last bytes (at most
    ``troy.execution.TAIL_BYTES``), of ``size`` bytes written in all."""

    data: bytes
    size: int

    @property
    def dropped(self) -> int:
        """Bytes written before ``data`` (not kept)."""
        return max(0, self.size - len(self.data))


@dataclass
class UnitResult:
    """What running a unit produced. ``members`` holds one result per bundle member;
    ``stdout``/``stderr``: the end of a process's output streams (None for a callable, a
    stream the description sends to a file of its own, or once the output was written
    out and dropped)."""

    exit_code: int | None = None
    value: Any = None
    error: str | None = None
    start: float | None = None
    end: float | None = None
    members: list[UnitResult] = field(default_factory=list)
    stdout: OutputTail | None = None
    stderr: OutputTail | None = None

    @property
    def ok(self) -> bool:
        if self.members:
            return all(m.ok for m in self.members)
        return self.error is None and (self.exit_code in (None, 0))


class ComputeUnit(Observable):
    """One unit of work (seed 001's ``ComputeUnit``).

    Attributes the user reads: ``id``, ``description``, ``state``, ``framework`` (name of the
    framework it went to), ``pilot`` (pilot id once bound), ``result`` (``UnitResult`` once
    final), ``start``/``end`` (epoch seconds). ``task_ids`` names the tasks it serves.
    ``attempts``: times it was dispatched (a requeue dispatches it again); ``completions``:
    times its work ran to the end (more than one: a duplicate, e.g. an attempt on a pilot
    being drained that ended after the unit had been requeued).
    """

    def __init__(self, description: ComputeUnitDescription | dict[str, Any],
                 uid: str | None = None, task_ids: list[str] | None = None) -> None:
        self.id = uid or f"unit.{next(_seq):06d}.{_token}"
        self.description = ComputeUnitDescription.coerce(description)
        self.task_ids: list[str] = list(task_ids or [])
        self.framework: str | None = None
        self.pilot: str | None = None
        self.result: UnitResult | None = None
        self.start: float | None = None
        self.end: float | None = None
        self.attempts = 0       # times dispatched to a framework
        self.completions = 0    # times its work ran to the end (> 1: duplicates)
        self._state = State.DESCRIBED
        # a lock, and an Event made for the first waiter only: a Condition a unit (with its
        # RLock, deque and five bound methods) was 8 of the 19 objects and about 1 KB of
        # the 2.9 KB a session kept per unbundled unit (bench_troy, tracemalloc)
        self._lock = threading.Lock()
        self._final: threading.Event | None = None
        # copied on write (a state change reads it without a copy); () once final
        self._callbacks: tuple[UnitCallback, ...] = ()
        self._framework_obj: PilotFramework | None = None

    def __repr__(self) -> str:
        return f"<ComputeUnit {self.id} {self._state.value} pilot={self.pilot}>"

    def member_index(self, task_id: str) -> int | None:
        """Where task ``task_id`` is among the members of this (bundle) unit, or None."""
        cached = self.__dict__.get("_member_index")
        if cached is None or cached[0] != len(self.task_ids):
            index = {t: i for i, t in reversed(list(enumerate(self.task_ids)))}  # the first
            cached = self._member_index = (len(self.task_ids), index)
        return cached[1].get(task_id)

    def add_callback(self, cb: UnitCallback, *, first: bool = False) -> None:
        """Call ``cb(unit, state)`` on every state change; ``first``: before the callbacks
        added so far (the store's record goes first, so that whoever a final state wakes
        finds it queued for the store)."""
        with self._lock:
            self._callbacks = (cb, *self._callbacks) if first else (*self._callbacks, cb)

    def _set_state(self, state: State, *, pilot: str | None = None,
                   result: UnitResult | None = None) -> bool:
        """Move to ``state`` (frameworks call this). A final state is never left (the
        frameworks ``_requeue`` only units not final). Returns whether the state changed."""
        with self._lock:
            if self._state in FINAL_STATES or self._state is state and pilot is None:
                return False
            self._state = state
            if pilot is not None:
                self.pilot = pilot
            if state is State.RUNNING and self.start is None:
                self.start = time.time()
            if result is not None:
                self.result = result
                self.start = result.start or self.start
                self.end = result.end
            if state in FINAL_STATES:
                if self.end is None:
                    self.end = time.time()
                # a final unit changes no more (``_requeue`` moves only units not final):
                # its callbacks go with this last call, and with them what they hold (its
                # tasks, their workload), which the unit service's list of every unit
                # kept alive for the session's life
                callbacks, self._callbacks = self._callbacks, ()
                if self._final is not None:
                    self._final.set()
            else:
                callbacks = self._callbacks
        self._run_callbacks(callbacks, state)   # (a user's failing callback is logged)
        return True

    def _requeue(self) -> None:
        """Forget the binding so the unit can be dispatched again (pilot lost or drained)."""
        with self._lock:
            self._state = State.DISPATCHED
            self.pilot = None
            self.start = self.end = None
            self.result = None
            callbacks = self._callbacks
        self._run_callbacks(callbacks, State.DISPATCHED)   # its tasks, the store: it went back

    def wait(self, timeout: float | None = None) -> State:
        """Block until the unit is final (or ``timeout`` seconds pass); return its state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._state in FINAL_STATES:
                    return self._state
                if self._final is None:
                    self._final = threading.Event()
                final = self._final
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return self._state
            final.wait(remaining)

    def cancel(self) -> None:
        """Cancel the unit: a queued unit never starts; a running one is killed."""
        fw = self._framework_obj
        if fw is not None and self._state not in FINAL_STATES:
            fw.cancel_unit(self)
        else:
            self._set_state(State.CANCELED)
