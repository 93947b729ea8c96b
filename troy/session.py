"""Session: the root of a Troy run. It holds the config, the store and the frameworks.

``Session()`` opens nothing until used. Its store is SQLite at ``store_path`` (default: a
temporary directory removed on ``close``); give a path to keep units across restarts: a
new ``Session(store_path=same)`` sees every unit, and ``recover()`` re-dispatches the ones
that were in flight.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from troy.demand import Demand, work_to_come, session_demand
from troy.errors import BadParameter, DoesNotExist, IncorrectState
from troy.frameworks import framework_class
from troy.frameworks.base import Pilot, PilotFramework
from troy.frameworks.drain import UnitStats
from troy.schedulers import BaseScheduler
from troy.states import FINAL_STATES, State
from troy.store import Store
from troy.unit import ComputeUnit, UnitResult
from troy.order import check_order
from troy.unit_service import UnitService

log = logging.getLogger(__name__)

DEFAULT_CONFIG: dict[str, Any] = {
    "default_framework": None,   # name or kind of the framework overlay pilots go to
    "machine_cores": None,       # cores the planner may size a pilot to (None: os.cpu_count)
    "bundle": "auto",            # bundling of short tasks: "auto", an int size, or False
    "bundle_threshold": 1.0,     # seconds: tasks with a runtime hint below this are short
    "scheduler": "backfill",     # the scheduler workload managers use
    "order": "longest_first",    # queued units offered longest runtime hint first, or "fifo"
    "pilot_timeout": 60.0,       # seconds provision_overlay waits for pilots to run
    "late_binding": "overlay",   # late-bound units of a workload run on an overlay go to
                                 # its pilots' frameworks ("overlay") or any ("session")
}


class Session:
    """Config, store and pilot frameworks of one Troy run (a context manager)."""

    def __init__(self, store_path: str | os.PathLike[str] | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        self.id = f"session.{uuid.uuid4().hex[:8]}"
        self.config: dict[str, Any] = dict(DEFAULT_CONFIG)
        if config:
            unknown = sorted(set(config) - set(DEFAULT_CONFIG))
            if unknown:
                raise BadParameter(f"session config: unknown key(s) {', '.join(unknown)}; "
                                   f"known: {', '.join(sorted(DEFAULT_CONFIG))}")
            self.config.update(config)
        check_order(self.config["order"], "session config: order")
        if self.config["late_binding"] not in ("overlay", "session"):
            raise BadParameter(f"session config: late_binding "
                               f"{self.config['late_binding']!r}: expected 'overlay' or "
                               f"'session'")
        self.frameworks: dict[str, PilotFramework] = {}
        #: workloads rebuilt by ``recover`` (by id)
        self.workloads: dict[str, Any] = {}
        self._store_path = os.fspath(store_path) if store_path is not None else None
        self._tmpdir: str | None = None
        self._store: Store | None = None
        self._services: list[UnitService] = []
        self._managers: weakref.WeakSet[Any] = weakref.WeakSet()  # dispatching workloads
        self._lock = threading.RLock()
        self._closed = False

    def __repr__(self) -> str:
        return f"<Session {self.id} frameworks={list(self.frameworks)}>"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- store --------------------------------------------------------------------------
    @property
    def store_path(self) -> str:
        with self._lock:
            if self._store_path is None:
                self._tmpdir = tempfile.mkdtemp(prefix="troy-")
                self._store_path = os.path.join(self._tmpdir, "troy.sqlite")
            return self._store_path

    @property
    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                self._check_open()
                self._store = Store(self.store_path)
            return self._store

    def _check_open(self) -> None:
        if self._closed:
            raise IncorrectState(f"session {self.id} is closed")

    # -- frameworks ---------------------------------------------------------------------
    def add_framework(self, kind: str, name: str | None = None,
                      **options: Any) -> PilotFramework:
        """Create, start and register a pilot framework of ``kind`` ("local", "dask", ...).

        ``name`` defaults to the kind (then ``kind.2``, ``kind.3`` for further ones); an
        explicit name already in use is refused."""
        self._check_open()
        cls = framework_class(kind)
        with self._lock:
            if name is None:
                name, n = kind, 1
                while name in self.frameworks:
                    n += 1
                    name = f"{kind}.{n}"
            elif name in self.frameworks:
                raise BadParameter(f"a pilot framework named {name!r} already exists")
            fw = cls(name=name, **options)
        fw.work_to_come = functools.partial(work_to_come, self)
        fw.start()
        fw.add_pilot_callback(self._on_pilot)
        with self._lock:
            self.frameworks[name] = fw
        self._kick_services()
        return fw

    def get_framework(self, name: str) -> PilotFramework:
        try:
            return self.frameworks[name]
        except KeyError:
            raise DoesNotExist(f"no pilot framework named {name!r}; known: "
                               f"{', '.join(self.frameworks) or 'none'}") from None

    def find_framework(self, name_or_kind: str | None) -> PilotFramework | None:
        """The framework called ``name_or_kind``, else the first of that kind, else None.
        ``None`` means the default: config ``default_framework``, else the first added."""
        if name_or_kind is None:
            name_or_kind = self.config.get("default_framework")
            if name_or_kind is None:
                return next(iter(self.frameworks.values()), None)
        if name_or_kind in self.frameworks:
            return self.frameworks[name_or_kind]
        for fw in self.frameworks.values():
            if fw.kind == name_or_kind:
                return fw
        return None

    def _on_pilot(self, pilot: Pilot, state: State) -> None:
        self._kick_services()

    def _kick_services(self) -> None:
        for us in list(self._services):
            us._kick()

    # -- units --------------------------------------------------------------------------
    def unit_service(self, scheduler: str | type[BaseScheduler] | BaseScheduler
                     = "round_robin", wait: bool = True,
                     early_binding: bool = False, order: str | None = None) -> UnitService:
        """A UnitService over every framework of this session (see troy.unit_service);
        ``order``: the queue's (:mod:`troy.order`; default the session config's)."""
        self._check_open()
        us = UnitService(self, scheduler, wait=wait, early_binding=early_binding,
                         order=self.config["order"] if order is None else order)
        with self._lock:
            self._services.append(us)
        return us

    def shared_unit_service(self, scheduler: str) -> UnitService:
        """The session's one UnitService for ``scheduler`` (a name), made on first use;
        workload managers share it instead of each starting a dispatcher."""
        with self._lock:
            for us in self._services:
                if us._shared == scheduler:
                    return us
            us = self.unit_service(scheduler)
            us._shared = scheduler
            return us

    def recover(self, unit_service: UnitService | None = None) -> list[ComputeUnit]:
        """Re-dispatch every stored unit that was in flight when its session ended.

        Units whose last recorded state is not final are submitted again (same id, same
        description; at least once) through ``unit_service`` (default: a new round-robin
        service), queuing until pilots can take them. A dispatched workload is rebuilt
        (same task and unit ids, into ``session.workloads``) and resumed: its held units
        are released by its relations as before. Units of Python callables cannot be
        re-run after a restart: they are marked FAILED. Returns the units not final (now
        dispatched again, or held by their workload's relations)."""
        live = {u.id for us in self._services for u in us.list_units()}
        live |= {u.id for w in self.workloads.values() for t in w.tasks.values()
                 for u in t.units}
        records = [r for r in self.store.unfinished_units() if r.id not in live]
        if not records:
            return []
        specs = {wid: self.store.workload_spec(wid) for wid in {r.workload for r in records}
                 if wid is not None}
        resumed: list[ComputeUnit] = []
        for wid, spec in specs.items():
            if spec:
                w = self.resume_workload(wid, unit_service=unit_service)
                resumed.extend({u.id: u for t in w.tasks.values() for u in t.units
                                if u.state not in FINAL_STATES}.values())
        records = [r for r in records if not (r.workload and specs.get(r.workload))]
        if not records:
            return resumed
        us = unit_service or self.unit_service()
        units, lost = [], []
        for rec in records:
            unit = ComputeUnit(rec.to_description() if rec.persistable else
                               {"executable": "/bin/false"}, uid=rec.id,
                               task_ids=rec.task_ids)
            unit.attempts = rec.attempts
            (units if rec.persistable else lost).append(unit)
        for unit in lost:
            unit._set_state(State.FAILED, result=UnitResult(
                error="a Python callable cannot be re-run after a restart"))
            self.store.record(unit)
        log.info("recovering %d unit(s) in flight (%d callables marked FAILED)",
                 len(units), len(lost))
        if units:
            us.submit_units(units)
        return resumed + units

    def resume_workload(self, workload_id: str | None = None, *,
                        unit_service: UnitService | None = None) -> Any:
        """The dispatched workload ``workload_id`` (None: the last one the store holds),
        rebuilt from the store with the same task and unit ids (``session.workloads[id]``):
        units that ended keep their recorded state, those in flight are dispatched again
        (at least once, through ``unit_service``; default: the config's scheduler), held
        ones are released by the relations as before. A workload rebuilt already (by
        ``recover`` or an earlier call) is returned as it is. ``troy.WorkloadRun`` runs it
        on (provisions an overlay and waits). ``DoesNotExist`` if the store holds no such
        workload."""
        store = self.store
        if workload_id is None:
            known = [r["id"] for r in store.workloads() if store.workload_spec(r["id"])]
            if not known:
                raise DoesNotExist(f"store {self.store_path}: holds no dispatched workload")
            workload_id = known[-1]
        with self._lock:
            found = self.workloads.get(workload_id)
        if found is not None:
            return found
        spec = store.workload_spec(workload_id)
        if spec is None:
            raise DoesNotExist(f"store {self.store_path}: no dispatched workload "
                               f"{workload_id!r}")
        from troy.workload.manager import WorkloadManager
        from troy.workload.recovery import resume_workload
        workload, _ = resume_workload(WorkloadManager(self, unit_service=unit_service),
                                      workload_id, spec, store.units(workload=workload_id))
        with self._lock:
            self.workloads[workload_id] = workload
        return workload

    # -- for scaling and reports --------------------------------------------------------
    def demand(self) -> Demand:
        """Cores and units of the work not final now: queued, running, and held by the
        workloads being executed (see ``troy.demand.Demand``)."""
        return session_demand(self)

    def unit_stats(self) -> UnitStats:
        """Requeues, duplicate completions and lost units of every framework so far."""
        total = UnitStats()
        for fw in list(self.frameworks.values()):
            total = total + fw.unit_stats()
        return total

    # -- lifecycle ----------------------------------------------------------------------
    def close(self, *, keep_unfinished: bool = False) -> None:
        """Stop unit services, close every framework (units not final become CANCELED),
        flush and close the store. Idempotent. ``keep_unfinished``: close the store first,
        so that the units not final stay unfinished in it (a run stopped to be resumed
        later: ``recover``, ``resume_workload``) instead of being recorded CANCELED."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if keep_unfinished and self._store is not None:
                self._store.close()
            services, self._services = self._services, []
            frameworks = list(self.frameworks.values())
        for us in services:
            us.close()
        for fw in reversed(frameworks):
            try:
                fw.close()
            except Exception:
                log.exception("closing framework %s failed", fw.name)
        if self._store is not None:
            self._store.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
