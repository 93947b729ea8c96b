"""``DaskFramework``: pilots as Dask worker processes, units as Dask tasks (see the
package documentation, ``troy.frameworks.dask``, for the design)."""
from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import os
import queue
import re
import shutil
import ssl
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from troy.descriptions import PilotDescription
from troy.errors import BadParameter, NoSuccess
from troy.frameworks.base import Pilot, PilotFramework
from troy.frameworks.dask import agent, forkserver
from troy.frameworks.dask.channel import CANCEL_WAIT, Sent, UnitChannel
from troy.frameworks.dask.drain import PilotMoves
from troy.frameworks.dask.events import UnitEvents, UnitRecord
from troy.frameworks.dask.processes import (AgentProcess, InProcessScheduler, quiet_dask_here,
                                            resolve_dask_log_level)
from troy.frameworks.dask.address import scheduler_url
from troy.frameworks.dask.schedproc import (SchedulerProcess, SchedulerRecovery,
                                            scheduler_contexts)
from troy.frameworks.dask.tls import DaskTLS
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit, UnitResult

log = logging.getLogger(__name__)

# a pilot's default backlog, per core of its size: enough to cover a Dask round trip
DEFAULT_BACKLOG_PER_CORE = 4
REFILL = 0.5  # the part of a pilot's backlog it takes back at once (see DaskPilot.room)


class DaskPilot(Pilot):
    """A pilot that accepts ``backlog`` cores' worth of units beyond its size (they queue in
    Dask, ready the moment cores free up, instead of paying a Dask round trip per unit);
    ``free_cores`` stays exact: it counts them as taken."""

    def __init__(self, description: PilotDescription, framework: PilotFramework,
                 prefetch: int | None = None) -> None:
        self._refilling = True
        super().__init__(description, framework)
        self.backlog = DEFAULT_BACKLOG_PER_CORE * description.size if prefetch is None \
            else prefetch

    @property
    def room(self) -> int:
        """As a pilot's, but a backlog that still keeps every core busy is refilled in
        chunks of at least :data:`REFILL` of it: units handed over one by one as others end
        cost a Dask graph each (the unbundled pipeline: 1.2 units a graph, the scheduler a
        third of the process's time, profiled). An idle pilot takes any unit at once."""
        room = super().room
        if room >= int(self.backlog * REFILL):
            self._refilling = True     # until it is full again
        elif room == 0:
            self._refilling = False
        return room if self._refilling else 0


@dataclass
class _Worker:
    pilot: Pilot
    proc: AgentProcess | None        # None: adopted, not ours
    timer: threading.Timer | None = None


AdoptFilter = Callable[[str, str, dict[str, float]], bool]


def scheduler_workers(client: Any) -> dict[str, dict[str, Any]]:
    """The workers of ``client``'s scheduler (address -> info, with ``resources``), asked now.

    Not ``client.scheduler_info()``: it returns the client's cached identity, which a
    periodic refresh (every 2 s, without workers) may overwrite right after the fetch, and
    then a worker that just joined looks absent (adoption missed it; a test saw 0 of 3)."""
    identity = client.sync(client.scheduler.identity, n_workers=-1)
    return dict(identity.get("workers", {}))


class DaskFramework(PilotMoves, SchedulerRecovery, UnitEvents, UnitChannel, PilotFramework):
    """Pilots are Dask workers; units run ``troy.execution.execute`` on them, sent on Troy's
    own unit channel (``unit_channel``, the default) or as Dask tasks.

    Options: ``scheduler_address`` (None: start a scheduler in-process on 127.0.0.1),
    ``worker_saturation`` (for the scheduler we start; ``"inf"`` by default: a worker
    receives every task it may run at once, about twice the throughput for short units),
    ``threads_per_pilot`` (None: one thread per core; resources, not threads, bound
    concurrency), ``sandbox`` (default working directory of units; None: a temporary
    directory removed on ``close``), ``adopt_workers`` (register workers that join the
    scheduler on their own and carry a ``cores`` resource as RUNNING pilots),
    ``prefetch`` (each pilot's backlog, see ``DaskPilot``; None: 4 per core of the pilot),
    ``scheduler_process`` (run the scheduler we start in
    its own process: brought back on the same address if it dies, see ``schedproc``), ``connect_timeout`` and ``pilot_start_timeout`` (seconds),
    ``dask_log_level`` (Dask's ``distributed`` loggers, here and in the processes we start;
    ``"auto"``: WARNING unless the root logger is at DEBUG; None: as Dask configures them),
    ``tls`` (a ``DaskTLS``, or a dict of its files: mutual TLS between the client, the
    scheduler and every worker; the scheduler we start listens on ``tls://`` only, and a
    worker without a certificate from the cluster CA cannot join), ``listen`` and ``port``
    (where the scheduler we start listens: 127.0.0.1, any port), ``adopt_filter``
    (``callable(name, address, resources) -> bool``: a joining worker it refuses is never
    adopted and never receives a unit), ``verify_names`` (with ``tls``, default: adopt a
    worker only if its name is its certificate's common name, so that a member cannot pose
    as another), ``unit_channel`` (True: units go to the pilots' agents on Troy's own
    channel, one connection an agent on ``listen``; False: as Dask tasks; see
    ``troy.frameworks.dask.channel``), ``long_unit`` and ``low_value`` (see
    ``PilotFramework``). Pilots are drained, lost and valued as ``troy.frameworks.dask.
    drain`` describes.
    """

    kind = "dask"

    def __init__(self, name: str | None = None, *, scheduler_address: str | None = None,
                 worker_saturation: float | str = "inf", threads_per_pilot: int | None = None,
                 sandbox: str | None = None, adopt_workers: bool = False,
                 connect_timeout: float = 15.0, pilot_start_timeout: float = 60.0,
                 scheduler_process: bool = False, prefetch: int | None = None,
                 dask_log_level: str | int | None = "auto",
                 tls: DaskTLS | dict[str, Any] | None = None, listen: str = "127.0.0.1",
                 port: int = 0, adopt_filter: AdoptFilter | None = None,
                 verify_names: bool = True, dashboard_address: str | None = None,
                 unit_channel: bool = True, **options: Any) -> None:
        super().__init__(name, **options)
        if not isinstance(unit_channel, bool):
            raise BadParameter(f"framework {self.name!r}: unit_channel: expected true or "
                               f"false, got {unit_channel!r}")
        self.unit_channel = unit_channel
        self._links: Any = None
        self._waiting: list[UnitRecord] = []   # channel: units no pilot has room for
        self._waiting_bound: list[UnitRecord] = []   # ... bound to one not connected yet
        if dashboard_address is not None and (scheduler_process or scheduler_address):
            raise BadParameter(f"framework {self.name!r}: dashboard_address: only for the "
                               f"scheduler it starts in this process")
        self.dashboard_address = dashboard_address
        if adopt_filter is not None and not callable(adopt_filter):
            raise BadParameter(f"framework {self.name!r}: adopt_filter: expected a callable "
                               f"(name, address, resources) -> bool, got {adopt_filter!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise BadParameter(f"framework {self.name!r}: port: expected 0..65535, "
                               f"got {port!r}")
        self.listen, self.port, self.adopt_filter = str(listen), port, adopt_filter
        self.tls = DaskTLS.coerce(tls, f"framework {self.name!r}")
        self.verify_names = bool(verify_names) and self.tls is not None
        self._security = self.tls.security() if self.tls is not None else None
        self.scheduler_address = None if scheduler_address is None \
            else scheduler_url(scheduler_address)
        self.worker_saturation = float(worker_saturation)
        self.threads_per_pilot = threads_per_pilot
        self.sandbox = sandbox
        self.adopt_workers = adopt_workers
        self.connect_timeout = connect_timeout
        self.pilot_start_timeout = pilot_start_timeout
        self.scheduler_process = scheduler_process
        if prefetch is not None and (isinstance(prefetch, bool)
                                     or not isinstance(prefetch, int) or prefetch < 0):
            raise BadParameter(f"framework {self.name!r}: prefetch: expected an integer "
                               f">= 0, got {prefetch!r}")
        self.prefetch = prefetch
        self.dask_log_level = dask_log_level
        self._log_level = resolve_dask_log_level(dask_log_level, f"framework {self.name!r}")
        self.client: Any = None
        self.topic = ""
        self._own_sandbox = False
        self._scheduler: SchedulerProcess | InProcessScheduler | None = None
        self._sched_lock = threading.Lock()
        self._scheduler_up = threading.Event()   # cleared while a new scheduler comes up
        self._scheduler_up.set()
        self._records: dict[str, UnitRecord] = {}
        self._workers: dict[str, _Worker] = {}      # pilot id -> worker
        self._by_addr: dict[str, Pilot] = {}
        self._dead_addrs: set[str] = set()
        self._parked: dict[str, list[UnitRecord]] = {}  # pilot id -> units waiting for it
        self._submitq: queue.SimpleQueue = queue.SimpleQueue()
        self._held = threading.local()   # a thread's submissions held together (holding)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._attempt = itertools.count(1)
        self._by_key: dict[str, UnitRecord] = {}
        self._started = False
        self._forking = False   # holding the fork server (forkserver.hold)
        self._dispatch_lock = threading.RLock()
        self._tags_lock = threading.Lock()
        # a unit's future set (dispatch) and its cancel flag read, or the flag set and the
        # future read (cancel_unit), are one step: exactly one of the two kills its task
        self._cancel_lock = threading.RLock()
        self._moved: dict[str, ComputeUnit] = {}   # units requeued at least once

    # ------------------------------------------------------------ lifecycle ---------------
    def start(self) -> None:
        if self._started:
            return
        from distributed import Client
        if self.sandbox is None:
            self.sandbox = tempfile.mkdtemp(prefix=f"troy-{self.name}-")
            self._own_sandbox = True
        os.makedirs(self.sandbox, exist_ok=True)
        if self._log_level is not None:
            quiet_dask_here(self._log_level, explicit=self.dask_log_level != "auto")
        address = self.scheduler_address or self._start_scheduler()
        try:
            self.client = Client(address, set_as_default=False,
                                 timeout=f"{self.connect_timeout}s", security=self._security)
        except (OSError, TimeoutError) as err:
            self._stop_scheduler()
            if self._own_sandbox:
                shutil.rmtree(self.sandbox, ignore_errors=True)
            raise NoSuccess(f"framework {self.name!r}: cannot reach Dask scheduler "
                            f"{address}: {err}") from err
        self.scheduler_address = address
        # the topic is also the workers' private resource and a command-line argument
        safe = re.sub(r"[^A-Za-z0-9_.]+", "_", self.name)[:40]
        self.topic = f"troy-{safe}-{uuid.uuid4().hex[:8]}"
        self._subscribe()
        if self.unit_channel:
            try:
                self._start_links()
            except (OSError, ssl.SSLError) as err:
                self.client.close()
                self._stop_scheduler()
                raise NoSuccess(f"framework {self.name!r}: cannot listen for its unit "
                                f"channel on {self.listen}: {err}") from err
        for target, tname in ((self._submit_loop, "submit"), (self._event_loop, "events")):
            t = threading.Thread(target=target, name=f"troy-{self.name}-{tname}", daemon=True)
            t.start()
            self._threads.append(t)
        self._started = True
        if isinstance(self._scheduler, SchedulerProcess):
            self._watch_scheduler(self._scheduler)
        if self.adopt_workers:
            self.adopt_joined()

    def _subscribe(self) -> None:
        """The client takes the units' events (``topic``) and the cluster's (``all``)."""
        agent.quicken(self.client)
        self.client.subscribe_topic(self.topic, lambda ev: self._inbox.put(ev[1]))
        topic = self.topic   # units' results ride its events: the scheduler keeps only a few
        self.on_scheduler(lambda s: agent.keep_few_events(s, topic))
        self.client.subscribe_topic("all", self._on_cluster_event)

    def adopt_joined(self) -> None:
        """Offer every worker that joined already for adoption again: for an
        ``adopt_filter`` that refused workers before it could judge them (its owner not
        ready yet). Workers adopted already are left as they are."""
        for addr, info in self.workers_info().items():
            self._adopt(addr, info)

    def on_scheduler(self, fn: Callable[[Any], Any], timeout: float = 10.0) -> Any:
        """``fn(scheduler)`` on the Dask scheduler: in-process on its own loop, else through
        the client (``run_on_scheduler``: ``fn`` must pickle)."""
        if isinstance(self._scheduler, InProcessScheduler):
            return self._scheduler.call(fn, timeout)
        if self.client is None:
            raise NoSuccess(f"framework {self.name!r}: not started")

        async def there(dask_scheduler: Any) -> Any:
            out = fn(dask_scheduler)
            return await out if inspect.isawaitable(out) else out
        return self.client.run_on_scheduler(there)

    def on_node(self, addr: str | None, function: Callable[..., Any], *args: Any,
                timeout: float = 30.0) -> dict[str, str | None]:
        """``function(*args)`` on the worker at ``addr`` (None: on every worker), through
        the scheduler (:func:`agent.on_node`): worker address -> None when it ran, else the
        node's text of why not. Never ``client.run``: its answer is a node's pickle, and
        Troy's process decodes nothing a node made."""
        def run(s: Any) -> Any:
            addrs = [addr] if addr else list(s.workers)

            async def all_of() -> dict[str, str | None]:
                import asyncio as aio
                outs = await aio.gather(*(agent.on_node(s, a, function, *args)
                                          for a in addrs))
                return dict(zip(addrs, outs))
            return all_of()
        return self.on_scheduler(run, timeout)

    def tls_contexts(self) -> list[ssl.SSLContext]:
        """The TLS contexts of this process that hold the framework's certificate: the
        listeners and connections out of a scheduler it runs in this process, and its
        client's. Whoever issues the certificates loads a renewed one into them while the
        framework runs (new handshakes take it; open connections keep theirs). A scheduler
        in a process of its own reloads its files when they change on disk
        (``schedproc.CertWatch``): none of its contexts here."""
        found: list[Any] = []
        if isinstance(self._scheduler, InProcessScheduler):
            try:
                found += self._scheduler.call(scheduler_contexts, 10.0)
            except Exception as err:  # noqa: BLE001 - the client's is still there
                log.warning("framework %s: the scheduler's TLS contexts: %s", self.name,
                            err or type(err).__name__)
        found.append((getattr(self.client, "connection_args", None) or {}).get("ssl_context"))
        if self._links is not None:
            found.append(self._links.ssl)
        return list({id(c): c for c in found if isinstance(c, ssl.SSLContext)}.values())

    def _start_scheduler(self) -> str:
        if not self.scheduler_process:
            self._scheduler = InProcessScheduler(
                self.name, self.worker_saturation, self._security, self.listen, self.port,
                self.dashboard_address, deny_file=self.tls.deny_file if self.tls else None)
            return self._scheduler.start()
        proc = self._scheduler_proc(self.port)
        address = proc.start(self.connect_timeout + 30)
        if address is None:
            raise NoSuccess(f"framework {self.name!r}: the Dask scheduler did not start: "
                            f"{proc.reason()}")
        self._scheduler = proc
        return address

    def _tls_environ(self) -> dict[str, str] | None:
        return self.tls.environ() if self.tls is not None else None

    def _stop_scheduler(self) -> None:
        with self._sched_lock:
            scheduler, self._scheduler = self._scheduler, None
        if isinstance(scheduler, SchedulerProcess):
            scheduler.stop()
        elif scheduler is not None:
            scheduler.close()

    def close(self) -> None:
        """Cancel what is left, then close the client (releasing every key), our workers and
        our scheduler. Adopted workers are left running: they are not ours."""
        if not self._started:
            return
        self._started = False
        self._end_drains()
        for rec in list(self._records.values()):
            self._records.pop(rec.unit.id, None)
            self._unreserve(rec)
            rec.unit._set_state(State.CANCELED)
        live = [p for p in self.list_pilots() if p.state not in FINAL_STATES]
        for pilot in live:
            if pilot.native_id:
                self._dead_addrs.add(pilot.native_id)
        self._scheduler_up.set()   # a submitter waiting for a new scheduler: stop waiting
        self._submitq.put(None)
        self._inbox.put(None)
        for t in self._threads:
            t.join(10)
        self._threads.clear()
        self._by_key.clear()
        try:
            self.client.unsubscribe_topic("all")
            self.client.close(timeout=10)
        except Exception:
            log.exception("closing the Dask client of %s", self.name)
        if self._links is not None:
            self._links.close()
        self._waiting.clear()
        self._waiting_bound.clear()
        for pilot in live:
            w = self._workers.get(pilot.id)
            if w is not None and w.timer is not None:
                w.timer.cancel()
            if w is not None and w.proc is not None:
                w.proc.stop()
            pilot._set_state(State.CANCELED)
        if self._forking:   # our workers have ended
            self._forking = False
            forkserver.let_go()
        self._stop_scheduler()
        if self._own_sandbox and self.sandbox:
            shutil.rmtree(self.sandbox, ignore_errors=True)

    # ------------------------------------------------------------ pilots ------------------
    def submit_pilot(self, description: PilotDescription | dict[str, Any]) -> Pilot:
        """Start a pilot (a worker process) of ``description.size`` cores; returns at once
        (PENDING); RUNNING once the worker has registered with the scheduler."""
        pilot = DaskPilot(PilotDescription.coerce(description), self, prefetch=self.prefetch)
        with self._lock:
            self._pilots[pilot.id] = pilot
        self._launch_pilot(pilot)
        return pilot

    def _launch_pilot(self, pilot: Pilot) -> None:
        proc = self._worker_proc(pilot)
        self._workers[pilot.id] = _Worker(pilot, proc)
        threading.Thread(target=self._await_worker, args=(pilot, proc),
                         name=f"troy-{pilot.id}-start", daemon=True).start()

    def _worker_proc(self, pilot: Pilot) -> AgentProcess:
        """A worker process for ``pilot``, forked with Dask already imported (the fork
        server, held from the first until :meth:`close`)."""
        if not self._forking:
            self._forking = True
            forkserver.hold()
        size = pilot.description.size
        return AgentProcess(["worker", str(self.scheduler_address), pilot.id,
                             str(self.threads_per_pilot or size), str(size), self.topic],
                            os.path.join(self.sandbox or ".", f"{pilot.id}.log"),
                            self._log_level, self._tls_environ(), forked=True)

    def _relaunch(self, pilot: Pilot) -> None:
        """A new worker for our pilot whose worker's scheduler died (the old worker leaves
        first, its units killed); the pilot stays RUNNING, lost if it cannot."""
        w = self._workers[pilot.id]
        if w.proc is not None:
            w.proc.stop()
        if pilot.state in FINAL_STATES or not self._started:
            return
        w.proc = proc = self._worker_proc(pilot)
        if not self._started:   # closed meanwhile: close() stopped the old one
            proc.stop()
            return
        self._await_worker(pilot, proc)

    def _await_worker(self, pilot: Pilot, proc: AgentProcess) -> None:
        addr = proc.read_address(self.pilot_start_timeout)
        if addr is None:
            if pilot.state is State.RUNNING:   # its new worker, after its scheduler died
                self.lose_pilot(pilot, f"its worker did not start again: "
                                       f"{proc.log_tail() or 'no output'}")
            elif pilot.state not in FINAL_STATES:
                log.error("pilot %s: its worker did not start: %s", pilot.id,
                          proc.log_tail() or "no output")
                pilot._set_state(State.FAILED)
            return
        if pilot.state in FINAL_STATES:  # canceled while starting
            return
        pilot.native_id = addr
        self._by_addr[addr] = pilot
        failed = self._open_link(addr)
        if failed is not None:
            self._dead_addrs.add(addr)
            if pilot.state is State.RUNNING:
                self.lose_pilot(pilot, f"its worker {addr}: {failed}")
            elif pilot.state not in FINAL_STATES:
                log.error("pilot %s: its worker %s: %s", pilot.id, addr, failed)
                pilot._set_state(State.FAILED)
                proc.stop()
            return
        w = self._workers[pilot.id]
        if pilot.description.walltime and w.timer is None:
            w.timer = threading.Timer(pilot.description.walltime, self._expire, (pilot,))
            w.timer.daemon = True
            w.timer.start()
        pilot.long_ok = True  # our workers start with both tags
        pilot._set_state(State.RUNNING)
        with self._dispatch_lock:
            parked = self._parked.pop(pilot.id, [])
        for rec in parked:
            self._submitq.put(rec)
        self._refill()
        self._values_changed()

    def _adopt(self, addr: str, info: dict[str, Any]) -> None:
        """Register a worker that joined on its own as a RUNNING pilot, once granted our
        tag (before, no unit can go to it). Workers of Troy frameworks (they carry a
        ``troy-...`` resource: their own pilots, maybe leaving) and workers ``adopt_filter``
        refuses are never adopted; called from ``start`` and the event thread, so check and
        register under the lock (one pilot per worker)."""
        resources, name = info.get("resources", {}), info.get("name")
        if "cores" not in resources or any(str(k).startswith("troy-") for k in resources):
            return
        name = None if name is None else str(name)
        why = self._refusal(addr, name, resources)
        if why:
            log.warning("framework %s: worker %s (%s) not adopted: %s", self.name, addr,
                        name, why)
            return
        with self._lock:
            if addr in self._by_addr or addr in self._dead_addrs:
                return
            pilot = DaskPilot(PilotDescription(size=max(1, int(resources["cores"])),
                                               framework=self.name, resource=addr), self,
                              prefetch=self.prefetch)
            pilot.native_id, pilot.worker_name = addr, name
            self._apply_value(pilot)
            self._pilots[pilot.id] = pilot
            self._workers[pilot.id] = _Worker(pilot, None)
            self._by_addr[addr] = pilot
        # a drain or loss that came first keeps it closed (a loss withdraws under _tags_lock)
        with self._dispatch_lock, self._tags_lock:
            if not pilot.draining and not self._grant(addr, {self.topic: agent.TAG_AMOUNT}):
                self._dead_addrs.add(addr)
                pilot._set_state(State.FAILED)
                return
        failed = self._open_link(addr) if not pilot.draining else None
        if failed is not None:
            log.warning("framework %s: worker %s (%s) not adopted: %s", self.name, addr, name,
                        failed)
            self._dead_addrs.add(addr)
            pilot._set_state(State.FAILED)
            return
        pilot.long_ok = False
        pilot._set_state(State.RUNNING)
        self._refill()
        self._values_changed()

    def _expire(self, pilot: Pilot) -> None:
        """The pilot's walltime is over: its units requeue, the pilot is DONE."""
        if pilot.state in FINAL_STATES:
            return
        self._cancel_pilot(pilot)
        pilot._set_state(State.DONE)

    def _cancel_pilot(self, pilot: Pilot) -> None:
        pilot.draining = True
        if pilot.native_id:
            self._dead_addrs.add(pilot.native_id)
        self._evacuate(pilot)
        self._stop_worker(pilot)

    def workers_info(self) -> dict[str, dict[str, Any]]:
        """The scheduler's workers (address -> info, with ``resources``), asked now
        (:func:`scheduler_workers`)."""
        return scheduler_workers(self.client)

    def _on_cluster_event(self, event: tuple[float, Any]) -> None:
        msg = event[1]
        if isinstance(msg, dict) and msg.get("action") in ("add-worker", "remove-worker"):
            self._inbox.put(("cluster", msg))

    # ------------------------------------------------------------ units -------------------
    def _submit(self, unit: ComputeUnit, pilot: Pilot | None) -> None:
        if pilot is not None and unit.description.cores > pilot.size:
            raise BadParameter(f"unit {unit.id} needs {unit.description.cores} cores; "
                               f"pilot {pilot.id} has {pilot.size}")
        if not self._started:
            unit._set_state(State.CANCELED)
            return
        rec = UnitRecord(unit, pilot)
        self._records[unit.id] = rec
        self._reserve(rec, pilot or self._likely_pilot(unit.description.cores))
        held = getattr(self._held, "recs", None)
        if held is not None:
            held.append(rec)
        else:
            self._submitq.put(rec)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """This thread's submissions go to the submitter thread together when it ends: one
        ``client.map`` (one scheduler ``update_graph``, a quarter of the scheduler's time
        when units came one by one, profiled) for what a unit service's pass placed."""
        if getattr(self._held, "recs", None) is not None:  # nested: the outer one hands over
            yield
            return
        self._held.recs = []
        try:
            yield
        finally:
            recs, self._held.recs = self._held.recs, None
            if recs:
                self._submitq.put(recs)

    def _likely_pilot(self, cores: int) -> Pilot | None:
        """Where Dask will most likely run a late-bound unit, so that ``free_cores`` drops
        at once (schedulers look at it); corrected when the unit really starts."""
        best = None
        for p in self.list_pilots():
            if p.room >= cores and (best is None or (p.free_cores, p.room)
                                    > (best.free_cores, best.room)):
                best = p
        return best

    def _submit_loop(self) -> None:
        while True:
            first = self._submitq.get()
            if first is None:
                return
            batch = first if isinstance(first, list) else [first]
            try:
                while len(batch) < 10_000:
                    more = self._submitq.get_nowait()
                    if isinstance(more, list):
                        batch.extend(more)
                    else:
                        batch.append(more)
            except queue.Empty:
                pass
            stop = None in batch
            self._scheduler_up.wait()   # a scheduler coming back: dispatch once it serves
            try:
                self._dispatch([r for r in batch if r is not None])
            except Exception:  # keep serving; fail what we could not dispatch
                if not self._scheduler_up.is_set() and self._started:  # it died meanwhile:
                    for rec in batch:                                   # for the new one
                        if rec is not None and rec.future is None:
                            self._submitq.put(rec)
                    continue
                log.exception("framework %s: dispatching %d units failed", self.name, len(batch))
                for rec in batch:
                    if rec is not None and rec.future is None:
                        self._finish(rec, State.FAILED, UnitResult(error="dispatch failed"))
            if stop:
                return

    def _dispatch(self, batch: list[UnitRecord]) -> None:
        with self._dispatch_lock:  # never while a pilot's units are being moved away
            self._dispatch_locked(batch)

    def _dispatch_locked(self, batch: list[UnitRecord]) -> None:
        if self._links is not None:
            self._dispatch_links(batch)
            return
        groups: dict[tuple[int, str | None, bool], list[UnitRecord]] = {}
        valued = max((p.size for p in self.long_pilots()), default=0)
        for rec in batch:
            if rec.unit.state in FINAL_STATES or not self._started or self._parks(rec):
                continue
            addr = rec.bound.native_id if rec.bound is not None else None
            cores = rec.unit.description.cores  # long: to a valued pilot, if one fits it
            long = addr is None and cores <= valued and self.is_long(rec.unit.description)
            groups.setdefault((cores, addr, long), []).append(rec)
        for (cores, addr, long), recs in groups.items():
            for rec in recs:
                # One Dask task prefix for all units: unique prefixes cost the scheduler
                # a task group each (a third of the throughput).
                rec.key = f"troy-unit-{next(self._attempt)}-{self.topic}"
                rec.keys.add(rec.key)
                self._by_key[rec.key] = rec
            resources = self._unit_resources(cores, long)
            futures = self.client.map(
                agent.run_unit, [r.unit.description for r in recs], [r.unit.id for r in recs],
                [self.topic] * len(recs), [self.sandbox] * len(recs),
                key=[r.key for r in recs], resources=resources,
                workers=[addr] if addr else None, allow_other_workers=False, pure=False)
            watched, doomed = [], []
            for rec, fut in zip(recs, futures):
                with self._cancel_lock:
                    canceled = rec.unit.state in FINAL_STATES or rec.canceling
                    if not canceled:
                        rec.future = fut
                if canceled:
                    fut.cancel()
                    doomed.append(rec.unit.id)
                    continue
                watched.append(fut)
            if watched:
                self.client.loop.add_callback(self._watch, watched)
            if doomed:
                # canceled while handed to Dask: its task may have started on a worker
                # already, and Dask's cancel never stops a task that runs: kill it there
                self._kill_canceled(addr, doomed)

    def _parks(self, rec: UnitRecord) -> bool:
        """Whether ``rec``'s unit waits for the pilot it is bound to (parked until its worker
        runs); a unit bound to a pilot going away is unbound. Under ``_dispatch_lock``."""
        if rec.bound is None or not (rec.bound.draining or rec.bound.native_id is None):
            return False
        if rec.bound.state in FINAL_STATES or rec.bound.draining:  # going away
            rec.bound = None
            return False
        self._parked.setdefault(rec.bound.id, []).append(rec)
        return True

    def _kill_canceled(self, addr: str | None, unit_ids: list[str]) -> None:
        """Kill canceled units' processes on the worker at ``addr`` (None: every worker),
        without waiting; a unit that has not started there yet never will."""
        def kill() -> None:
            try:
                self.on_node(addr, agent.kill_units, unit_ids)
            except Exception as err:  # noqa: BLE001 - closing: its workers stop their units
                log.info("framework %s: killing canceled units on %s: %s", self.name,
                         addr or "every worker", err)

        threading.Thread(target=kill, daemon=True, name=f"troy-{self.name}-kill").start()

    def live_units(self) -> list[ComputeUnit]:
        return [r.unit for r in list(self._records.values())
                if r.unit.state not in FINAL_STATES]

    def cancel_unit(self, unit: ComputeUnit) -> None:
        rec = self._records.get(unit.id)
        if rec is None or unit.state in FINAL_STATES:
            unit._set_state(State.CANCELED)
            return
        with self._cancel_lock:
            rec.canceling = True
            fut, rec.future = rec.future, None
        addr = rec.addr
        self._records.pop(unit.id, None)
        self._unreserve(rec)
        self._unit_gone(rec, addr)   # a drain waiting for it does not wait any more
        unit._set_state(State.CANCELED, result=UnitResult(error="canceled"))
        if isinstance(fut, Sent):   # taken back from its agent: dropped or killed there,
            fut.cancel(CANCEL_WAIT)  # before this returns (the agent acks it)
        elif fut is not None:   # else the dispatch that hands it to Dask kills it
            fut.cancel()
            if fut.status != "finished" and self.client is not None:
                try:  # kill its processes where it runs (or may be just starting)
                    self.on_node(addr, agent.kill_unit, unit.id)
                except Exception:
                    log.exception("killing unit %s on %s", unit.id, addr or "all workers")
