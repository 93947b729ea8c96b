"""The classic P* API (seed 002) as a thin layer over Troy's frameworks.

``PilotJobService().create(rm, PilotJobDescription)`` starts a pilot; the resource manager
URL's scheme picks the framework: ``local://localhost`` (pilots are core budgets on this
machine), ``dask://localhost`` (start a Dask scheduler here) or ``dask://host:port`` (attach
to that scheduler). A ``WorkUnitService`` spans the pilot job services ``add``-ed to it and
places each submitted ``WorkUnitDescription`` with a small application-level scheduler written
on the public framework API (seed 003): the first framework with a running pilot whose free
cores fit the unit, else one with a pilot (running or starting) wide enough to hold it, where
the unit waits; binding to a pilot is left to the framework. ``NoSuccess`` if no pilot could
ever hold it.

Descriptions keep the seed's (SAGA) slot names; what Troy uses:

=====================  ============================================================
``total_cpu_count``    pilot size / unit cores (else ``number_of_processes``; 1)
``wall_time_limit``    minutes, as in SAGA: pilot walltime / unit walltime (killed)
``executable``, ``arguments``, ``environment``, ``working_directory``: the unit's process
``input``/``output``/``error``   the unit's stdin / stdout / stderr files
``file_transfer``      ``"src > dst"`` stages in, ``"local < remote"`` stages out
=====================  ============================================================

The other slots (``queue``, ``project``, ``candidate_hosts``, ``spmd_variation``...) are
accepted and kept but mean nothing on local or Dask pilots. ``state`` is a ``troy.State``;
``state_detail`` a short backend string (the Dask worker address, a unit's exit status).
Callbacks: ``set_callback("state" | "state_detail", cb)`` where ``cb`` is a ``Callback``
(its ``cb(obj, member, value)``) or any callable of those three arguments; returning
``False`` removes it, anything else keeps it. One callback per member; they run in
framework threads.
"""
from __future__ import annotations

import itertools
import logging
import threading
import uuid
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Callable
from urllib.parse import urlsplit

from troy.descriptions import ComputeUnitDescription, PilotDescription
from troy.errors import BadParameter, DoesNotExist, IncorrectState, NoSuccess
from troy.frameworks.base import Pilot, PilotFramework
from troy.session import Session
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit

log = logging.getLogger(__name__)

MEMBERS = ("state", "state_detail")


class PilotJobType(Enum):
    """Seed 002's ``PILOTJOB_TYPE``, for the backends Troy has."""

    UNKNOWN = "unknown"
    LOCAL = "local"
    DASK = "dask"


PILOTJOB_TYPE = PilotJobType  # the seed's name


class Callback:
    """Base for callbacks: override ``cb``; return False to be removed."""

    def cb(self, obj: Any, member: str, value: Any) -> bool | None:
        raise NotImplementedError


@dataclass(slots=True)
class _SagaDescription:
    executable: str | None = None
    arguments: list[str] = field(default_factory=list)
    cleanup: bool | None = None
    environment: dict[str, str] = field(default_factory=dict)
    interactive: bool | None = None
    contact: str | None = None
    project: str | None = None
    start_time: str | None = None
    working_directory: str | None = None
    input: str | None = None
    error: str | None = None
    output: str | None = None
    file_transfer: list[str] = field(default_factory=list)
    number_of_processes: int | None = None
    processes_per_host: int | None = None
    threads_per_process: int | None = None
    total_cpu_count: int | None = None
    spmd_variation: str | None = None
    candidate_hosts: list[str] = field(default_factory=list)
    cpu_architecture: str | None = None
    total_physical_memory: int | None = None
    operating_system_type: str | None = None
    total_cpu_time: float | None = None
    wall_time_limit: float | None = None
    queue: str | None = None

    @classmethod
    def coerce(cls, value: Any) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise BadParameter(f"expected a {cls.__name__} or a dict, got {type(value).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise BadParameter(f"{cls.__name__}: unknown slot(s) {', '.join(unknown)}")
        return cls(**value)

    def _cores(self) -> int:
        n = self.total_cpu_count or self.number_of_processes or 1
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BadParameter(f"{type(self).__name__}.total_cpu_count: expected an integer "
                               f">= 1, got {n!r}")
        return n

    def _walltime(self) -> float | None:
        if self.wall_time_limit is None:
            return None
        return float(self.wall_time_limit) * 60.0


@dataclass(slots=True)
class PilotJobDescription(_SagaDescription):
    """What kind of pilot job the application wants (seed 002; SAGA slot names)."""

    def to_pilot_description(self, framework: str) -> PilotDescription:
        return PilotDescription(size=self._cores(), framework=framework,
                                walltime=self._walltime(), resource=self.contact)


@dataclass(slots=True)
class WorkUnitDescription(_SagaDescription):
    """A work unit: what to run and with how many cores (seed 002; SAGA slot names)."""

    def to_unit_description(self) -> ComputeUnitDescription:
        if not self.executable:
            raise BadParameter("WorkUnitDescription.executable: required")
        inputs, outputs = [], []
        for d in self.file_transfer:
            if "<" in d:  # SAGA: "local < remote" copies the unit's file back
                local, remote = (p.strip() for p in d.split("<", 1))
                outputs.append(f"{remote} > {local}")
            else:
                inputs.append(d)
        return ComputeUnitDescription(
            executable=self.executable, arguments=list(self.arguments),
            environment=dict(self.environment), working_directory=self.working_directory,
            stdin=self.input, stdout=self.output, stderr=self.error, inputs=inputs,
            outputs=outputs, cores=self._cores(), walltime=self._walltime())


class _Observable:
    """``state``/``state_detail`` with seed-style callbacks."""

    def __init__(self) -> None:
        self._cbs: dict[str, Any] = {}
        self._cb_lock = threading.Lock()
        self._values: dict[str, Any] = {"state": State.PENDING, "state_detail": None}

    @property
    def state(self) -> State:
        return self._values["state"]

    @property
    def state_detail(self) -> str | None:
        return self._values["state_detail"]

    def set_callback(self, member: str, cb: Callback | Callable[[Any, str, Any], Any]) -> None:
        if member not in MEMBERS:
            raise BadParameter(f"set_callback: member must be one of {', '.join(MEMBERS)}, "
                               f"got {member!r}")
        if not (isinstance(cb, Callback) or callable(cb)):
            raise BadParameter(f"set_callback: {cb!r} is neither a Callback nor callable")
        with self._cb_lock:
            self._cbs[member] = cb

    def unset_callback(self, member: str) -> None:
        if member not in MEMBERS:
            raise BadParameter(f"unset_callback: member must be one of {', '.join(MEMBERS)}")
        with self._cb_lock:
            self._cbs.pop(member, None)

    def _update(self, state: State, detail: str | None) -> None:
        changed = []
        with self._cb_lock:
            for member, value in (("state", state), ("state_detail", detail)):
                if self._values[member] != value:
                    self._values[member] = value
                    changed.append((member, value, self._cbs.get(member)))
        for member, value, cb in changed:
            if cb is None:
                continue
            try:
                keep = cb.cb(self, member, value) if isinstance(cb, Callback) \
                    else cb(self, member, value)
            except Exception:
                log.exception("callback on %s.%s failed", self, member)
                continue
            if keep is False:
                with self._cb_lock:
                    if self._cbs.get(member) is cb:
                        del self._cbs[member]


class PilotJob(_Observable):
    """A pilot job created by a PilotJobService: state, cancel, reinitialize, callbacks."""

    def __init__(self, service: PilotJobService, rm: str, description: PilotJobDescription,
                 framework: PilotFramework, pj_type: PilotJobType, context: Any) -> None:
        super().__init__()
        self.id = f"pj.{uuid.uuid4().hex[:8]}"
        self.rm = rm
        self.description = description
        self.pj_type = pj_type
        self.context = context
        self.framework = framework
        self._service = service
        self.pilot: Pilot = self._start()

    def __repr__(self) -> str:
        return f"<PilotJob {self.id} {self.state.value} rm={self.rm}>"

    def _start(self) -> Pilot:
        pilot = self.framework.submit_pilot(
            self.description.to_pilot_description(self.framework.name))
        self.pilot = pilot
        pilot.add_callback(lambda p, s: self._follow(p))
        self._follow(pilot)
        return pilot

    def _follow(self, pilot: Pilot) -> None:
        if getattr(self, "pilot", pilot) is not pilot:
            return  # a pilot replaced by reinitialize
        detail = f"{self.framework.kind} pilot {pilot.id} {pilot.state.value.lower()}"
        if pilot.native_id:
            detail += f" at {pilot.native_id}"
        self._update(pilot.state, detail)

    def cancel(self) -> None:
        """Stop the pilot job; its unfinished work units go to other pilots of the same
        framework, if it has any."""
        if self.pilot.state not in FINAL_STATES:
            self.pilot.cancel()
        self._follow(self.pilot)

    def reinitialize(self, pilotjob_description: PilotJobDescription | dict) -> None:
        """Replace the pilot by one of the new description (same PilotJob, same id)."""
        desc = PilotJobDescription.coerce(pilotjob_description)
        old = self.pilot
        self.description = desc
        self._start()
        if old.state not in FINAL_STATES:
            old.cancel()

    def wait(self, timeout: float | None = None) -> State:
        """Block until the pilot job leaves PENDING."""
        return self.pilot.wait_running(timeout)


_services: dict[str, PilotJobService] = {}
_registry_lock = threading.Lock()


def _resolve(cls: type, registry: dict[str, Any], uid: str | None) -> Any:
    if uid is None:
        return None
    with _registry_lock:
        if uid in registry:
            return registry[uid]
    raise DoesNotExist(f"no {cls.__name__} {uid!r} in this process")


class PilotJobService:
    """Creates and manages pilot jobs (seed 002). ``PilotJobService(id)`` reconnects to a
    live service of this process. Frameworks are started on demand, one per ``rm`` URL."""

    def __new__(cls, id: str | None = None) -> PilotJobService:  # noqa: A002 (seed name)
        existing = _resolve(cls, _services, id)
        return existing if existing is not None else super().__new__(cls)

    def __init__(self, id: str | None = None) -> None:  # noqa: A002
        if getattr(self, "_ready", False):
            return
        self.id = f"pjs.{uuid.uuid4().hex[:8]}"
        self.state = State.RUNNING
        self.pilot_jobs: list[PilotJob] = []
        self.session = Session()
        self._frameworks: dict[str, PilotFramework] = {}
        self._lock = threading.RLock()
        self._ready = True
        with _registry_lock:
            _services[self.id] = self

    def __repr__(self) -> str:
        return f"<PilotJobService {self.id} {self.state.value} pilot_jobs={len(self.pilot_jobs)}>"

    def create(self, rm: str, pilotjob_desc: PilotJobDescription | dict,
               pj_type: PilotJobType | None = None, context: Any = None) -> PilotJob:
        """Start a pilot job on the resource manager ``rm`` (see the module doc)."""
        if self.state is not State.RUNNING:
            raise IncorrectState(f"pilot job service {self.id} is {self.state.value}")
        desc = PilotJobDescription.coerce(pilotjob_desc)
        kind, options = _parse_rm(rm)
        if pj_type is not None and PilotJobType(pj_type) is not PilotJobType(kind):
            raise BadParameter(f"pj_type {PilotJobType(pj_type).value} does not match the "
                               f"resource manager {rm!r}")
        with self._lock:
            fw = self._frameworks.get(rm)
            if fw is None:
                fw = self.session.add_framework(kind, name=f"{kind}.{len(self._frameworks)}",
                                                **options)
                self._frameworks[rm] = fw
            pj = PilotJob(self, rm, desc, fw, PilotJobType(kind), context)
            self.pilot_jobs.append(pj)
        return pj

    @property
    def frameworks(self) -> list[PilotFramework]:
        with self._lock:
            return list(self._frameworks.values())

    def cancel(self) -> None:
        """Cancel every pilot job of this service and release its frameworks."""
        with self._lock:
            if self.state is not State.RUNNING:
                return
            self.state = State.CANCELED
        for pj in list(self.pilot_jobs):
            pj.cancel()
        self.session.close()
        for pj in self.pilot_jobs:
            pj._follow(pj.pilot)
        with _registry_lock:
            _services.pop(self.id, None)


def _parse_rm(rm: str) -> tuple[str, dict[str, Any]]:
    try:
        url = urlsplit(rm)
        port = url.port
    except ValueError as err:
        raise BadParameter(f"resource manager {rm!r}: {err}") from err
    if url.scheme == "local":
        if url.hostname not in (None, "", "localhost", "127.0.0.1"):
            raise BadParameter(f"resource manager {rm!r}: local pilots run on localhost only")
        return "local", {}
    if url.scheme == "dask":
        if not url.hostname:
            raise BadParameter(f"resource manager {rm!r}: expected dask://host[:port]")
        if port is None:
            if url.hostname not in ("localhost", "127.0.0.1"):
                raise BadParameter(f"resource manager {rm!r}: give the scheduler's port")
            return "dask", {}
        return "dask", {"scheduler_address": f"tcp://{url.hostname}:{port}"}
    raise BadParameter(f"resource manager {rm!r}: unknown scheme {url.scheme!r}; "
                       f"known: local://localhost, dask://localhost, dask://host:port")


class WorkUnit(_Observable):
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
        """Block until every work unit is final (a convenience beyond the seed)."""
        for wu in list(self.work_units):
            wu.wait(timeout)
