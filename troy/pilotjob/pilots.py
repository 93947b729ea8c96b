"""PilotJob and PilotJobService (seed 002) over Troy's pilot frameworks."""
from __future__ import annotations

import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

from troy.errors import BadParameter, DoesNotExist, IncorrectState
from troy.frameworks.base import Pilot, PilotFramework
from troy.pilotjob.descriptions import PilotJobDescription, PilotJobType
from troy.pilotjob.observable import Observable
from troy.session import Session
from troy.states import FINAL_STATES, State


class PilotJob(Observable):
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
        # closing the session closes each framework in its own order (a Dask client before
        # its workers: no result keys lost with a worker) and cancels every pilot
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
