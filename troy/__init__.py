"""Troy: the P* pilot model. Workloads of tasks, overlays of pilots, pilot frameworks."""
from __future__ import annotations

from troy.descriptions import ComputeUnitDescription, PilotDescription, TaskDescription
from troy.errors import BadParameter, DoesNotExist, IncorrectState, NoSuccess, TroyError
from troy.states import State
from troy.unit import ComputeUnit, UnitResult

__all__ = ["State", "TaskDescription", "ComputeUnitDescription", "PilotDescription",
           "ComputeUnit", "UnitResult", "TroyError", "BadParameter", "NoSuccess",
           "IncorrectState", "DoesNotExist"]
