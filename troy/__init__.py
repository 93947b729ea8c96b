"""Troy: the P* pilot model. Workloads of tasks, overlays of pilots, pilot frameworks.

The Python contract::

    s = troy.Session()
    fw = s.add_framework("local", name="big")           # or "dask"
    p = fw.submit_pilot(troy.PilotDescription(size=32))
    us = s.unit_service(scheduler="first_fit")
    u = us.submit_unit(troy.ComputeUnitDescription(executable="/bin/true", cores=32))
    us.wait_units()                                      # u.state, u.framework, u.pilot
    s.close()

and ``troy.execute_workload(session, workload, overlay)`` for whole workloads
(``troy.WorkloadRun``: the same on a thread, with a future and progress events).
``troy.Pilot`` is the framework pilot ``submit_pilot`` returns; the overlay element of seed
000 is ``troy.overlay.Pilot`` (also ``troy.OverlayPilot``).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each name is imported when first used (PEP 562): the node's enrolment, its agent and the
# units' wrapper start as ``python -m troy.<module>``, which runs this file first, and need
# none of these (importing them all costs every such process ~0.07 s of CPU).
_WHERE = {
    "Demand": "troy.demand",
    "ComputeUnitDescription": "troy.descriptions", "PilotDescription": "troy.descriptions",
    "TaskDescription": "troy.descriptions",
    "BadParameter": "troy.errors", "DoesNotExist": "troy.errors",
    "IncorrectState": "troy.errors", "NoSuccess": "troy.errors", "TroyError": "troy.errors",
    "execute_workload": "troy.execute",
    "Pilot": "troy.frameworks.base", "PilotFramework": "troy.frameworks.base",
    "DrainPlan": "troy.frameworks.drain", "UnitStats": "troy.frameworks.drain",
    "Overlay": "troy.overlay", "OverlayManager": "troy.overlay",
    "OverlayPilot": "troy.overlay:Pilot",
    "Planner": "troy.planner",
    "RunProgress": "troy.runs", "TaskEvent": "troy.runs", "WorkloadRun": "troy.runs",
    "BaseScheduler": "troy.schedulers", "register_scheduler": "troy.schedulers",
    "Session": "troy.session",
    "State": "troy.states",
    "ComputeUnit": "troy.unit", "UnitResult": "troy.unit",
    "UnitService": "troy.unit_service",
    "Relation": "troy.workload", "Task": "troy.workload", "Workload": "troy.workload",
    "WorkloadManager": "troy.workload",
}

__all__ = ["State", "TaskDescription", "ComputeUnitDescription", "PilotDescription",
           "ComputeUnit", "UnitResult", "TroyError", "BadParameter", "NoSuccess",
           "IncorrectState", "DoesNotExist", "Session", "UnitService", "PilotFramework",
           "Pilot", "OverlayPilot", "Overlay", "OverlayManager", "Planner", "Task",
           "Relation", "Workload", "WorkloadManager", "BaseScheduler", "register_scheduler",
           "execute_workload", "Demand", "DrainPlan", "UnitStats", "WorkloadRun",
           "TaskEvent", "RunProgress"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'troy' has no attribute {name!r}")
    module, _, attr = where.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and editors see
    from troy.demand import Demand
    from troy.descriptions import ComputeUnitDescription, PilotDescription, TaskDescription
    from troy.errors import BadParameter, DoesNotExist, IncorrectState, NoSuccess, TroyError
    from troy.execute import execute_workload
    from troy.frameworks.base import Pilot, PilotFramework
    from troy.frameworks.drain import DrainPlan, UnitStats
    from troy.overlay import Overlay, OverlayManager
    from troy.overlay import Pilot as OverlayPilot
    from troy.planner import Planner
    from troy.runs import RunProgress, TaskEvent, WorkloadRun
    from troy.schedulers import BaseScheduler, register_scheduler
    from troy.session import Session
    from troy.states import State
    from troy.unit import ComputeUnit, UnitResult
    from troy.unit_service import UnitService
    from troy.workload import Relation, Task, Workload, WorkloadManager
