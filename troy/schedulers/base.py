"""The scheduler contract: pick a framework (and, on request, a pilot) for one unit.

A scheduler is an application-level policy written on Troy's public API only (seed 003):
``unit_service.list_pilot_frameworks()``, ``framework.list_pilots()``, and per pilot
``state``, ``description.size`` and ``free_cores``. It returns ``(framework, pilot)`` with
``pilot=None`` for late binding (the framework's own scheduler picks the pilot), or ``None``
when nothing can take the unit now: the UnitService then queues the unit and asks again on
the next pilot or unit event (or raises ``NoSuccess`` if it was created with ``wait=False``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from troy.descriptions import ComputeUnitDescription
from troy.frameworks.shapes import could_hold, most_room
from troy.states import State

if TYPE_CHECKING:
    from troy.frameworks.base import Pilot, PilotFramework
    from troy.unit_service import UnitService



class BaseScheduler(ABC):
    """Base of every scheduler. Subclasses provide ``schedule``; class attributes tune how
    the UnitService walks its queue:

    ``in_order``: when a queued unit cannot be placed (but some pilot could hold it one day),
    later units wait behind it (in the service's order, :mod:`troy.order`). False lets later
    units pass.
    ``monotone``: a unit of ``n`` cores that cannot be placed means no wider unit can be
    either, so the service skips those in the same pass (an optimisation only).
    """

    name: ClassVar[str] = ""
    in_order: ClassVar[bool] = False
    monotone: ClassVar[bool] = False

    @abstractmethod
    def schedule(self, unit_service: UnitService,
                 cud: ComputeUnitDescription) -> tuple[PilotFramework, Pilot | None] | None:
        """Where ``cud`` should go now, or None to keep it queued."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def running_pilots(framework: PilotFramework) -> list[Pilot]:
    """The framework's pilots that accept units now."""
    return [p for p in framework.list_pilots() if p.state is State.RUNNING and not p.draining]


def could_ever_fit(unit_service: UnitService, cores: int) -> bool:
    """Whether some live (pending or running) pilot is wide enough for ``cores``."""
    return any(could_hold(fw, cores) for fw in unit_service.list_pilot_frameworks())


def backlog_framework(unit_service: UnitService, cores: int, *, first: bool = False
                      ) -> PilotFramework | None:
    """:func:`backlog_pilot` for late binding: only the framework, from the frameworks'
    shape counts (the same choice, without looking at every pilot)."""
    if not getattr(unit_service, "backlog_ok", True):
        return None
    best = None
    for fw in unit_service.list_pilot_frameworks():
        room = most_room(fw, cores)
        if room is not None:
            if first:
                return fw
            if best is None or room > best[0]:
                best = (room, fw)
    return None if best is None else best[1]


def backlog_pilot(unit_service: UnitService, cores: int, *, first: bool = False
                  ) -> tuple[PilotFramework, Pilot] | None:
    """For a unit no pilot has free cores for now: a running pilot whose backlog has room
    for it (``first``: the first in the session's order; otherwise the roomiest), or None.
    None too while an earlier unit of the same dispatch pass waits (``unit_service.
    backlog_ok`` is false): later units must not jump ahead of it into a pilot's queue."""
    if not getattr(unit_service, "backlog_ok", True):
        return None
    best = None
    for fw in unit_service.list_pilot_frameworks():
        for p in running_pilots(fw):
            room = p.room
            if room >= cores and p.description.size >= cores:
                if first:
                    return fw, p
                if best is None or room > best[0]:
                    best = (room, fw, p)
    return None if best is None else (best[1], best[2])
