"""The built-in schedulers: ``round_robin``, ``first_fit`` and ``backfill``.

All three return ``pilot=None`` (late binding: the framework picks the pilot) unless the
UnitService was created with ``early_binding=True``; then they name the pilot they found.
With late binding they decide from the frameworks' pilot shape counts
(:mod:`troy.frameworks.shapes`): a placement costs the same with 10 pilots as with 10,000.
Early binding looks at every pilot (it must name one).
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from troy.descriptions import ComputeUnitDescription
from troy.frameworks.shapes import tightest_free, widest_accepting
from troy.schedulers.base import (BaseScheduler, backlog_framework, backlog_pilot,
                                  running_pilots)

if TYPE_CHECKING:
    from troy.frameworks.base import Pilot, PilotFramework
    from troy.unit_service import UnitService



class RoundRobinScheduler(BaseScheduler):
    """Frameworks in turn, among those with a running pilot wide enough for the unit.

    It does not look at free cores: the unit waits in the chosen framework's own queue.
    This spreads load evenly and hands units to the frameworks fastest (no per-unit wait
    for free cores in Troy), which suits many small units on homogeneous frameworks.
    """

    name = "round_robin"
    monotone = True

    def __init__(self) -> None:
        self._turn = itertools.count()

    def schedule(self, unit_service: UnitService, cud: ComputeUnitDescription
                 ) -> tuple[PilotFramework, Pilot | None] | None:
        frameworks = unit_service.list_pilot_frameworks()
        if not unit_service.early_binding:
            able = [fw for fw in frameworks if widest_accepting(fw) >= cud.cores]
            return (able[next(self._turn) % len(able)], None) if able else None
        candidates = []
        for fw in frameworks:
            wide = [p for p in running_pilots(fw) if p.description.size >= cud.cores]
            if wide:
                candidates.append((fw, wide))
        if not candidates:
            return None
        fw, wide = candidates[next(self._turn) % len(candidates)]
        return fw, max(wide, key=lambda p: p.free_cores)


class FirstFitScheduler(BaseScheduler):
    """The first framework (in the session's order) with a running pilot whose free cores
    fit the unit. Units are placed in the unit service's order (:mod:`troy.order`): while
    the first queued unit waits for room, later ones wait behind it (unless no pilot could
    ever hold it).
    When no pilot has free cores, the first one with room in its backlog takes it."""

    name = "first_fit"
    in_order = True
    monotone = True

    def schedule(self, unit_service: UnitService, cud: ComputeUnitDescription
                 ) -> tuple[PilotFramework, Pilot | None] | None:
        if not unit_service.early_binding:
            for fw in unit_service.list_pilot_frameworks():
                if tightest_free(fw, cud.cores) is not None:
                    return fw, None
            found_fw = backlog_framework(unit_service, cud.cores, first=True)
            return None if found_fw is None else (found_fw, None)
        for fw in unit_service.list_pilot_frameworks():
            for p in running_pilots(fw):
                if p.free_cores >= cud.cores:
                    return fw, (p if unit_service.early_binding else None)
        found = backlog_pilot(unit_service, cud.cores, first=True)
        if found is None:
            return None
        return found[0], (found[1] if unit_service.early_binding else None)


class BackfillScheduler(BaseScheduler):
    """Best fit across every framework: the pilot whose free cores fit the unit most
    tightly, which keeps wide holes open for wide units. Later, smaller units run in the
    holes while a wide unit waits (backfilling); nothing waits behind a unit that does not
    fit. When no pilot has free cores, the pilot with the most room in its backlog takes it
    (never past a unit still waiting)."""

    name = "backfill"
    monotone = True

    def schedule(self, unit_service: UnitService, cud: ComputeUnitDescription
                 ) -> tuple[PilotFramework, Pilot | None] | None:
        if not unit_service.early_binding:
            tight = None
            for fw in unit_service.list_pilot_frameworks():
                free = tightest_free(fw, cud.cores)
                if free is not None and (tight is None or free < tight[0]):
                    tight = (free, fw)
            if tight is None:
                found_fw = backlog_framework(unit_service, cud.cores)
                return None if found_fw is None else (found_fw, None)
            return tight[1], None
        best = None
        for fw in unit_service.list_pilot_frameworks():
            for p in running_pilots(fw):
                free = p.free_cores
                if free >= cud.cores and (best is None or free < best[0]):
                    best = (free, fw, p)
        if best is None:
            found = backlog_pilot(unit_service, cud.cores)
            if found is None:
                return None
            best = (0, *found)
        return best[1], (best[2] if unit_service.early_binding else None)
