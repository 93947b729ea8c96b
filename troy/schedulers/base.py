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
from troy.states import State

if TYPE_CHECKING:
    from troy.frameworks.base import Pilot, PilotFramework
    from troy.unit_service import UnitService



class BaseScheduler(ABC):
    """Base of every scheduler. Subclasses provide ``schedule``; class attributes tune how
    the UnitService walks its queue:

    ``in_order``: when a queued unit cannot be placed (but some pilot could hold it one day),
    later units wait behind it (first come, first served). False lets later units pass.
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
    return any(p.state in (State.PENDING, State.RUNNING) and not p.draining
               and p.description.size >= cores
               for fw in unit_service.list_pilot_frameworks() for p in fw.list_pilots())
