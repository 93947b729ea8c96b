"""The seed-003 scheduler: an application-level scheduler on the public API alone.

This is the pseudo code of seed 003 ("Example for (B)"), made real. It is deliberately
written only against what any Troy user can call: ``list_pilot_frameworks()`` on the unit
service, ``list_pilots()`` on a framework, and ``state``, ``description.size`` and
``free_cores`` on a pilot. It does not bind the unit to the pilot it found: it only checks
that the framework *can* run the unit, and leaves the binding to that framework's own
scheduler (late binding), which may know better (data locality, faster hosts).

Use case B: with 32 one-core pilots in framework "small" and one 32-core pilot in "big", a
32-core unit can only go to "big"; a one-core unit submitted next finds "big" without free
cores and goes to "small". Write your own the same way::

    class MyScheduler(troy.schedulers.BaseScheduler):
        name = "mine"
        def schedule(self, unit_service, cud):
            for fw in unit_service.list_pilot_frameworks():
                ...
            return None      # queue the unit (or NoSuccess when wait=False)

    us = session.unit_service(scheduler=MyScheduler)   # or register_scheduler("mine", ...)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from troy.descriptions import ComputeUnitDescription
from troy.schedulers.base import BaseScheduler
from troy.states import State

if TYPE_CHECKING:
    from troy.frameworks.base import Pilot, PilotFramework
    from troy.unit_service import UnitService


class Seed003Scheduler(BaseScheduler):
    """Seed 003's scheduler: the first framework with a suitable running pilot."""

    name = "seed003"

    def schedule(self, unit_service: UnitService, cud: ComputeUnitDescription
                 ) -> tuple[PilotFramework, Pilot | None] | None:
        # the cud property relevant for this scheduler: how many cores the unit needs
        cores = cud.cores
        # for the given cud, find a framework with a suitable pilot which can run it
        for pf in unit_service.list_pilot_frameworks():
            for p in pf.list_pilots():
                if p.state is State.RUNNING and p.description.size >= cores \
                        and p.free_cores >= cores:
                    # this pilot can run the unit, ergo this framework can: submit there,
                    # and leave the binding to the framework
                    return pf, None
        # no suitable pilot: the unit service queues the unit, or raises NoSuccess
        return None
