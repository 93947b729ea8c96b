"""WorkUnit and WorkUnitService (seed 002): units placed on the pilot jobs' frameworks."""
from __future__ import annotations

import itertools
import threading
import time
import uuid

from troy.errors import BadParameter, IncorrectState, NoSuccess
from troy.frameworks.base import PilotFramework
from troy.pilotjob.descriptions import WorkUnitDescription
from troy.pilotjob.observable import Observable
from troy.pilotjob.pilots import PilotJobService, _registry_lock, _resolve
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit


class WorkUnit(Observable):
    """A submitted work unit: state, state_detail, cancel, callbacks (seed 002)."""

    def __init__(self, description: WorkUnitDescription, unit: ComputeUnit) -> None:
        super().__init__()
        self.id = unit.id
        self.description = description
        self.unit = unit
        self._values["state"] = unit.state
        unit.add_callback(self._follow)

    def __repr__(self) -> str:
        return f"<WorkUnit {self.id} {self.state.value}>"

    def _follow(self, unit: ComputeUnit, state: State) -> None:
        detail = None
        if state is State.RUNNING:
            detail = f"running on {unit.pilot}"
        elif state in FINAL_STATES and unit.result is not None:
            r = unit.result
            detail = r.error.splitlines()[0] if r.error else f"exit status {r.exit_code}"
        elif state in FINAL_STATES:
            detail = state.value.lower()
        self._update(state, detail)

    @property
    def result(self):
        return self.unit.result

    def cancel(self) -> None:
        self.unit.cancel()

    def wait(self, timeout: float | None = None) -> State:
        return self.unit.wait(timeout)


_unit_services: dict[str, WorkUnitService] = {}


class WorkUnitService:
    """Submits work units to the pilot jobs of the pilot job services added to it."""

    def __new__(cls, id: str | None = None) -> WorkUnitService:  # noqa: A002
        existing = _resolve(cls, _unit_services, id)
        return existing if existing is not None else super().__new__(cls)

    def __init__(self, id: str | None = None) -> None:  # noqa: A002
        if getattr(self, "_ready", False):
            return
        self.id = f"wus.{uuid.uuid4().hex[:8]}"
        self.state = State.RUNNING
        self.pilotjob_services: list[PilotJobService] = []
        self.work_units: list[WorkUnit] = []
        self._lock = threading.RLock()
        self._turn = itertools.count()
        self._ready = True
        with _registry_lock:
            _unit_services[self.id] = self

    def __repr__(self) -> str:
        return f"<WorkUnitService {self.id} {self.state.value} work_units={len(self.work_units)}>"

    def add(self, pjs: PilotJobService | list[PilotJobService]) -> None:
        for s in pjs if isinstance(pjs, list) else [pjs]:
            if not isinstance(s, PilotJobService):
                raise BadParameter(f"add: expected a PilotJobService, got {s!r}")
            with self._lock:
                if s not in self.pilotjob_services:
                    self.pilotjob_services.append(s)

    def remove(self, pjs: PilotJobService | list[PilotJobService]) -> None:
        """Disconnect (not cancel) pilot job services; their running units go on."""
        with self._lock:
            for s in pjs if isinstance(pjs, list) else [pjs]:
                if s in self.pilotjob_services:
                    self.pilotjob_services.remove(s)

    def submit(self, wud: WorkUnitDescription | dict) -> WorkUnit:
        """Place a work unit on a framework of the connected pilot job services."""
        if self.state is not State.RUNNING:
            raise IncorrectState(f"work unit service {self.id} is {self.state.value}")
        desc = WorkUnitDescription.coerce(wud)
        cud = desc.to_unit_description()
        fw = self._choose(cud.cores)
        wu = WorkUnit(desc, ComputeUnit(cud))
        fw.submit_unit(wu.unit)
        with self._lock:
            self.work_units.append(wu)
        return wu

    def _choose(self, cores: int) -> PilotFramework:
        with self._lock:
            frameworks = [fw for s in self.pilotjob_services if s.state is State.RUNNING
                          for fw in s.frameworks]
        if not frameworks:
            raise IncorrectState(f"work unit service {self.id} has no pilot job service")
        for fw in frameworks:  # first fit on free cores
            if any(p.state is State.RUNNING and p.free_cores >= cores for p in fw.list_pilots()):
                return fw
        wide = [fw for fw in frameworks
                if any(p.state in (State.PENDING, State.RUNNING) and p.size >= cores
                       for p in fw.list_pilots())]
        if not wide:
            raise NoSuccess(f"no suitable pilot found to run a work unit of {cores} core(s)")
        return wide[next(self._turn) % len(wide)]

    def cancel(self) -> None:
        """Cancel every work unit submitted here."""
        with self._lock:
            self.state = State.CANCELED
            units = list(self.work_units)
        for wu in units:
            if wu.state not in FINAL_STATES:
                wu.cancel()
        with _registry_lock:
            _unit_services.pop(self.id, None)

    def wait(self, timeout: float | None = None) -> None:
        """Block until every work unit is final, or ``timeout`` seconds pass in all (not
        per unit); a convenience beyond the seed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for wu in list(self.work_units):
            wu.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
