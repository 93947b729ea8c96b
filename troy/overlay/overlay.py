"""Overlay and its Pilots (seed 000): the resources a workload runs on.

An overlay is a set of pilot descriptions that the OverlayManager turns into real pilots:
DESCRIBED → TRANSLATED → SCHEDULED (a framework chosen per pilot) → PROVISIONED (every
pilot RUNNING) → COMPLETED (every pilot ended: canceled, walltime over, or its framework
closed) or FAILED (a pilot failed). Transitions are irreversible, as the seed says.
``State.SCHEDULED`` is ``State.BOUND`` under its seed name (its value prints "BOUND").
"""
from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from troy.descriptions import PilotDescription
from troy.errors import IncorrectState
from troy.frameworks.base import Pilot as FrameworkPilot
from troy.states import FINAL_STATES, Lockable, Observable, State


OverlayCallback = Callable[["Overlay", State], Any]
PilotLike = PilotDescription | Mapping[str, Any]


class Pilot:
    """An overlay element (seed 000): a pilot description, and once provisioned the
    framework pilot that realises it (``pilot``), on framework ``framework`` (its name).

    ``state`` is the overlay step (DESCRIBED, TRANSLATED, SCHEDULED) until provisioning,
    then the framework pilot's state (PENDING, RUNNING, DONE, CANCELED, FAILED)."""

    def __init__(self, uid: str, description: PilotDescription, overlay: Overlay) -> None:
        self.id = uid
        self.description = description
        self.framework: str | None = None
        self.pilot: FrameworkPilot | None = None
        self._overlay = overlay
        self._state = State.DESCRIBED

    def __repr__(self) -> str:
        return f"<overlay.Pilot {self.id} {self.state.value} size={self.description.size}>"

    @property
    def state(self) -> State:
        return self.pilot.state if self.pilot is not None else self._state

    @property
    def size(self) -> int:
        return self.description.size

    @property
    def free_cores(self) -> int:
        return self.pilot.free_cores if self.pilot is not None else 0

    def cancel(self) -> None:
        """Cancel the pilot (its framework requeues its unfinished units elsewhere)."""
        if self.pilot is not None:
            self.pilot.cancel()
        else:
            self._state = State.CANCELED
            self._overlay._pilot_changed()


class Overlay(Lockable, Observable):
    """A set of pilots managed by Troy (seed 000). ``pilots`` maps ids to Pilots."""

    def __init__(self, pilots: Iterable[PilotLike] | None = None,
                 uid: str | None = None) -> None:
        self.id = uid or f"overlay.{uuid.uuid4().hex[:8]}"
        self.pilots: dict[str, Pilot] = {}
        self._seq = itertools.count()
        self._state = State.DESCRIBED
        self._locked = False
        self._lock = threading.RLock()
        self._callbacks: tuple[OverlayCallback, ...] = ()
        self._cancelling = False
        for pd in pilots or ():
            self.add_pilot(pd)

    def __repr__(self) -> str:
        return f"<Overlay {self.id} {self._state.value} pilots={len(self.pilots)}>"

    @property
    def size(self) -> int:
        """Total cores of the overlay's pilots."""
        return sum(p.description.size for p in self.pilots.values())

    def add_pilot(self, descr: PilotLike) -> str:
        """Add a pilot (PilotDescription or dict); returns its id (``overlay.pilots[id]``).
        Only while the overlay is DESCRIBED and not locked."""
        pd = PilotDescription.coerce(descr)
        with self._lock:
            if self._locked:
                raise IncorrectState(f"overlay {self.id} is locked")
            if self._state is not State.DESCRIBED:
                raise IncorrectState(f"overlay {self.id} is {self._state.value}: pilots can "
                                     f"only be added before translation")
            uid = f"opilot.{next(self._seq):04d}"
            self.pilots[uid] = Pilot(uid, pd, self)
            return uid

    @classmethod
    def following(cls, framework: Any) -> Overlay:
        """An overlay that is whatever pilots ``framework`` has, now and later (elastic;
        see ``troy.overlay.following``)."""
        from troy.overlay.following import FollowingOverlay
        return FollowingOverlay(framework)

    def cancel(self) -> None:
        """Cancel all pilots; the overlay ends COMPLETED."""
        self._cancelling = True  # one look at every pilot at the end, not one per pilot
        try:
            for p in list(self.pilots.values()):
                if p.state not in FINAL_STATES:
                    p.cancel()
        finally:
            self._cancelling = False
        self._pilot_changed()

    # -- for the OverlayManager ---------------------------------------------------------
    def _set_state(self, state: State) -> None:
        with self._lock:
            if self._state is state or self._state in (State.COMPLETED, State.FAILED):
                return
            self._state = state
            callbacks = self._callbacks
        self._run_callbacks(callbacks, state)

    def _pilot_changed(self, *args: Any) -> None:
        """A pilot changed: derive FAILED / COMPLETED once pilots end. A framework pilot's
        callback passes ``(pilot, state)``: a state that is not final changes nothing here."""
        if len(args) == 2 and isinstance(args[1], State) and args[1] not in FINAL_STATES:
            return
        if self._cancelling and not (len(args) == 2 and args[1] is State.FAILED):
            return
        states = [p.state for p in self.pilots.values()]
        if State.FAILED in states:
            self._set_state(State.FAILED)
        elif states and all(s in FINAL_STATES for s in states):
            self._set_state(State.COMPLETED)
