"""The Dask side of the ``dask`` framework: the task every unit runs, and the worker and
scheduler processes (``python -m troy.frameworks.dask worker|scheduler|node ...``).

Each process prints its address as one JSON line on stdout once it serves. ``worker`` and
``scheduler`` leave when their stdin closes: the framework that started them holds the
other end, so a Troy that dies never leaves workers behind. ``node`` is the pilot agent of a
machine of its own (a CloudLab node's startup command runs it): a worker with the node's
cores as its ``cores`` resource, which a framework with ``adopt_workers`` registers as a
pilot; it serves until SIGTERM/SIGINT; when the scheduler goes away it kills the units
running there and rejoins the same address under the same name for up to
``TROY_NODE_RECONNECT`` seconds (default 300), then exits with one line. Every process uses
TLS when its environment configures it (``DASK_DISTRIBUTED__COMM__TLS__...``, see
``tls``). Worker-side state (the processes of running units, for kills) lives in this
module, which is what Dask imports when it unpickles ``run_unit``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time

from troy.descriptions import ComputeUnitDescription
from troy.execution import execute, kill
from troy.frameworks.dask.processes import tls_options
from troy.frameworks.dask.tls import security_from_config
from troy.unit import UnitResult

# Every worker of a framework carries its tag as a resource that units ask 1 of: frameworks
# sharing one scheduler never run each other's units; the amount never limits anything.
TAG_AMOUNT = 1_000_000
SMALL = 16_384  # results carried inline in the ``end`` event up to about this size
RUN_EVENT_DELAY = 0.005  # seconds a unit runs before its ``run`` event is sent

_procs: dict[str, list[subprocess.Popen]] = {}
_canceled: set[str] = set()
_procs_lock = threading.Lock()
_stopping = threading.Event()
_terminating = threading.Event()  # SIGTERM/SIGINT arrived: the worker is closing
SHUTDOWN_GRACE = 2.0  # how long a unit killed by a signal waits for the agent's own SIGTERM
SHUTDOWN_WAIT = 30.0  # then for the worker to have left (nothing is reported after that)


def _small(result: UnitResult) -> bool:
    v = result.value
    if v is None or isinstance(v, (bool, int, float)):
        return not result.members or all(_small(m) for m in result.members)
    return isinstance(v, (str, bytes)) and len(v) < SMALL


def result_to_wire(r: UnitResult) -> list:
    """Events travel as msgpack: a UnitResult as a plain list (``_small`` results only)."""
    return [r.exit_code, r.value, r.error, r.start, r.end,
            [result_to_wire(m) for m in r.members]]


def result_from_wire(w: list) -> UnitResult:
    return UnitResult(exit_code=w[0], value=w[1], error=w[2], start=w[3], end=w[4],
                      members=[result_from_wire(m) for m in w[5]])


class _Outbox:
    """A worker's pending events, sent to the scheduler in batches: one ``log_event`` per
    topic per event-loop turn (``["batch", [event, ...]]``) instead of one per unit, and one
    timer that announces units still running ``RUN_EVENT_DELAY`` after they started instead
    of a timer per unit.

    Order: a unit's ``end`` event is queued, with a flush scheduled on the worker's loop,
    before the unit's function returns, so the flush runs before Dask reports the task
    finished (the framework sees ``end`` before the future's outcome, as with one event per
    unit); a ``run`` event is only sent while its unit is still running, so it precedes its
    ``end``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: dict[str, list[list]] = {}   # topic -> events not yet sent
        self.flushing = False                     # a flush is scheduled on the loop
        self.running: dict[str, tuple[str, float]] = {}  # unit -> (topic, start), unannounced
        self.ticking = False                      # the announce timer is armed

    def started(self, worker, unit_id: str, topic: str, start: float) -> None:
        with self.lock:
            self.running[unit_id] = (topic, start)
            arm = not self.ticking
            self.ticking = True
        if arm:
            worker.loop.add_callback(self._arm, worker)

    def ended(self, worker, unit_id: str, topic: str, event: list) -> None:
        with self.lock:
            self.running.pop(unit_id, None)
            self.events.setdefault(topic, []).append(event)
            flush = not self.flushing
            self.flushing = True
        if flush:
            worker.loop.add_callback(self._flush, worker)

    def forget(self, unit_id: str) -> None:
        with self.lock:
            self.running.pop(unit_id, None)

    def _arm(self, worker) -> None:
        worker.loop.call_later(RUN_EVENT_DELAY, self._tick, worker)

    def _tick(self, worker) -> None:
        """On the worker's loop: announce units running for ``RUN_EVENT_DELAY`` already."""
        due = time.time() - RUN_EVENT_DELAY
        with self.lock:
            for uid, (topic, start) in list(self.running.items()):
                if start <= due:
                    del self.running[uid]
                    self.events.setdefault(topic, []).append(
                        ["run", uid, worker.address, start])
            self.ticking = bool(self.running)
        self._flush(worker)
        if self.ticking:
            self._arm(worker)

    def _flush(self, worker) -> None:
        with self.lock:
            events, self.events = self.events, {}
            self.flushing = False
        for topic, batch in events.items():
            worker.log_event(topic, ["batch", batch])


def _outbox_of(worker) -> _Outbox:
    box = getattr(worker, "_troy_outbox", None)
    if box is None:
        with _procs_lock:
            box = getattr(worker, "_troy_outbox", None)
            if box is None:
                box = worker._troy_outbox = _Outbox()
    return box


def run_unit(cud: ComputeUnitDescription, unit_id: str, topic: str,
             sandbox: str | None) -> UnitResult | None:
    """Run one unit inside a Dask worker (the Dask task of every Troy unit)."""
    from distributed import get_worker
    worker = get_worker()
    with _procs_lock:
        if unit_id in _canceled:
            return None
        _procs[unit_id] = []

    def hook(proc: subprocess.Popen) -> None:
        with _procs_lock:
            _procs.setdefault(unit_id, []).append(proc)
            dead = unit_id in _canceled
        if dead:
            kill(proc)

    # RUNNING is announced only if the unit is still running RUN_EVENT_DELAY later: a
    # shorter unit's ``end`` event carries its start, and the framework pushes RUNNING then
    # the final state from it, saving a scheduler message per short unit.
    outbox = _outbox_of(worker)
    start = time.time()
    outbox.started(worker, unit_id, topic, start)
    try:
        result = execute(cud, sandbox=sandbox, on_start=hook,
                         canceled=lambda: unit_id in _canceled or _stopping.is_set())
    except BaseException:  # the Dask task errs: the unit ran here, its future says how
        outbox.ended(worker, unit_id, topic, ["run", unit_id, worker.address, start])
        raise
    finally:
        with _procs_lock:
            _procs.pop(unit_id, None)
    if not _stopping.is_set() and _signalled(result, unit_id) \
            and _terminating.wait(SHUTDOWN_GRACE):
        # the node is shutting down (SIGTERM to every process of it, the agent included):
        # the unit died of that, not of its own doing; once the worker has left, nothing
        # is reported and Dask reruns it elsewhere
        _stopping.wait(SHUTDOWN_WAIT)
    if _stopping.is_set():  # the pilot is going away: Dask reruns the unit elsewhere
        outbox.forget(unit_id)
        raise RuntimeError("pilot stopped while the unit ran")
    inline = _small(result)
    outbox.ended(worker, unit_id, topic, ["end", unit_id, worker.address,
                                          result_to_wire(result) if inline else None])
    return None if inline else result


def _signalled(result: UnitResult, unit_id: str) -> bool:
    """Whether the unit's process died of a signal this agent did not send."""
    with _procs_lock:
        ours = unit_id in _canceled
    return not ours and result.exit_code is not None and result.exit_code < 0


def kill_unit(unit_id: str) -> bool:
    """Kill a unit's processes on this worker (run there by ``client.run``)."""
    with _procs_lock:
        _canceled.add(unit_id)
        procs = list(_procs.get(unit_id, ()))
    for p in procs:
        kill(p)
    return bool(procs)


def kill_units(unit_ids: list[str]) -> int:
    """Kill several units' processes on this worker (units moved away from it)."""
    return sum(kill_unit(uid) for uid in unit_ids)


async def set_tags(tags: dict[str, float], dask_worker=None) -> dict[str, float]:  # noqa: ANN001
    """On a worker (``client.run``): set resources ``tags`` here and at the scheduler. A tag
    at 0 stops the worker from starting the queued tasks that ask for it, at once."""
    await dask_worker.set_resources(**tags)
    return dict(dask_worker.state.total_resources)


def schedule_unrunnable(worker: str, dask_scheduler=None) -> int:  # noqa: ANN001
    """On the scheduler (``client.run_on_scheduler``): hand the tasks that had no worker
    to ``worker`` if it may run them now (Dask re-checks them only when a worker joins)."""
    import uuid
    ws = dask_scheduler.workers.get(worker)
    if ws is None:
        return 0
    recs = dask_scheduler.bulk_schedule_unrunnable_after_adding_worker(ws)
    if recs:
        dask_scheduler.transitions(recs, f"troy-tags-{uuid.uuid4().hex[:8]}")
    return len(recs)


def peer_common_name(worker: str, dask_scheduler=None) -> str | None:  # noqa: ANN001
    """On the scheduler: the common name of the TLS certificate the worker at ``worker``
    connected with (None: no TLS, or no such worker)."""
    stream = dask_scheduler.stream_comms.get(worker)
    comm = getattr(stream, "comm", None)
    cert = (getattr(comm, "extra_info", None) or {}).get("peercert") or {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _kill_all() -> None:
    _stopping.set()
    with _procs_lock:
        procs = [p for ps in _procs.values() for p in ps]
    for p in procs:
        kill(p)


async def _start_worker(scheduler: str, death_timeout: float = 30,
                        **options: object):  # noqa: ANN202 - a Worker
    """A started worker (TLS when configured); its address printed on stdout."""
    from distributed import Worker
    # memory_limit=0: units are separate processes; Dask's memory manager (which watches
    # this process only) must not pause or spill on their behalf.
    w = await Worker(scheduler, dashboard=False, dashboard_address="127.0.0.1:0",
                     death_timeout=death_timeout, memory_limit=0, security=security_from_config(),
                     **options)
    sys.stdout.write(json.dumps({"address": w.address}) + "\n")
    sys.stdout.flush()
    return w


async def _serve_worker(scheduler: str, name: str, nthreads: int, cores: int,
                        tag: str) -> None:
    w = await _start_worker(scheduler, nthreads=nthreads,
                            resources={"cores": cores, tag: TAG_AMOUNT,
                                       f"{tag}-long": TAG_AMOUNT}, name=name,
                            host="127.0.0.1")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:  # EOF: the framework closed us or died
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    done = asyncio.ensure_future(w.finished())
    await asyncio.wait([done, asyncio.ensure_future(stop.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    # Leave the scheduler first (it reschedules what ran here), then kill the units.
    await w.close(timeout=5, executor_wait=False, reason="troy pilot stopped")
    _kill_all()


async def _serve_scheduler(saturation: float, host: str = "127.0.0.1", port: int = 0) -> None:
    import dask
    from distributed import Scheduler
    with dask.config.set({"distributed.scheduler.worker-saturation": saturation}):
        s = Scheduler(host=host, port=port, dashboard=False,
                      dashboard_address="127.0.0.1:0",
                      **tls_options(security_from_config()))
    await s
    sys.stdout.write(json.dumps({"address": s.address}) + "\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    await s.close()


RECONNECT_ENV = "TROY_NODE_RECONNECT"  # seconds a node agent tries to rejoin (0: never)
RECONNECT_DEFAULT = 300.0
RECONNECT_BACKOFF = (1.0, 10.0)  # first and longest pause between two rejoin attempts
UNITS_GONE_WAIT = 10.0  # seconds the killed units of a lost scheduler get to end


def reconnect_seconds(environ: dict[str, str] | None = None) -> float:
    """How long a node agent keeps trying to rejoin a scheduler that went away
    (``TROY_NODE_RECONNECT``, seconds; default 300; 0: it exits at once)."""
    raw = (os.environ if environ is None else environ).get(RECONNECT_ENV, "").strip()
    if not raw:
        return RECONNECT_DEFAULT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{RECONNECT_ENV}={raw!r}: expected a number of seconds >= 0")
    return value


class SchedulerGone(Exception):
    """The scheduler went away and did not come back within the agent's bound."""


def _await_units_gone(timeout: float) -> None:
    """After ``_kill_all``: wait (bounded) until the killed units' threads have ended, so
    that clearing ``_stopping`` for the next worker cannot make them report."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _procs_lock:
            if not _procs:
                return
        time.sleep(0.05)


async def _rejoin(scheduler: str, stop: asyncio.Event, bound: float,
                  **options: object):  # noqa: ANN202 - a Worker, or None when stopped
    """A new worker (same name, same address) once the scheduler is back; tries for
    ``bound`` seconds with a growing pause between attempts (each attempt itself polls
    the address for up to 30 s). None if ``stop`` was set meanwhile."""
    deadline = time.monotonic() + bound
    pause, last = RECONNECT_BACKOFF[0], "no attempt"
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            raise SchedulerGone(f"scheduler {scheduler} did not come back within "
                                f"{bound:g} s (last: {last})")
        attempt = asyncio.ensure_future(_start_worker(
            scheduler, death_timeout=max(1.0, min(30.0, left)), **options))
        halt = asyncio.ensure_future(stop.wait())
        await asyncio.wait([attempt, halt], return_when=asyncio.FIRST_COMPLETED)
        halt.cancel()
        if attempt.done():
            try:
                return attempt.result()
            except Exception as err:  # not back yet: try again after a pause
                cause = err.__cause__ or err
                last = f"{type(cause).__name__}: {cause}"
        else:
            attempt.cancel()
            return None
        try:
            await asyncio.wait_for(stop.wait(), min(pause, max(0.0, deadline - time.monotonic())))
        except asyncio.TimeoutError:
            pass
        pause = min(pause * 2, RECONNECT_BACKOFF[1])
    return None


async def _serve_node(scheduler: str, cores: int, name: str | None, host: str | None,
                      reconnect: float = RECONNECT_DEFAULT) -> None:
    """Serve as the node's pilot until SIGTERM/SIGINT. When the scheduler goes away (the
    cluster process died), the units running here are killed (Troy dispatches them again)
    and a new worker of the same name rejoins the same address for up to ``reconnect``
    seconds (:class:`SchedulerGone` after that)."""
    import signal
    import distributed  # noqa: F401  (configures its loggers on import)
    if "DASK_LOGGING__DISTRIBUTED" not in os.environ:  # a node's log: warnings and errors
        logging.getLogger("distributed").setLevel(logging.WARNING)
    if host is None:  # listen where the scheduler reaches us, not on every interface
        from distributed.comm import get_address_host
        from distributed.utils import get_ip
        host = get_ip(get_address_host(scheduler))
    options = {"nthreads": cores, "resources": {"cores": cores}, "name": name, "host": host}
    w = await _start_worker(scheduler, **options)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        _terminating.set()
        stop.set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    while w is not None:
        done = asyncio.ensure_future(w.finished())
        await asyncio.wait([done, asyncio.ensure_future(stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        await w.close(timeout=5, executor_wait=False, reason="troy node agent stopped")
        _kill_all()
        if stop.is_set():
            return
        if reconnect <= 0:
            raise SchedulerGone(f"scheduler {scheduler} went away (reconnecting is off: "
                                f"{RECONNECT_ENV}=0)")
        logging.getLogger(__name__).warning(
            "the scheduler %s went away: units here killed; rejoining for up to %g s",
            scheduler, reconnect)
        await loop.run_in_executor(None, _await_units_gone, UNITS_GONE_WAIT)
        with _procs_lock:  # a unit killed here may come back, to the new worker
            _canceled.clear()
        _stopping.clear()
        w = await _rejoin(scheduler, stop, reconnect, **options)


NODE_USAGE = ("usage: python -m troy.frameworks.dask node SCHEDULER CORES [NAME [HOST]]\n"
              "  a pilot agent: a Dask worker with CORES as its cores resource; TLS from\n"
              "  DASK_DISTRIBUTED__COMM__TLS__* (see troy.frameworks.dask.tls)")


def main(argv: list[str]) -> None:
    """``python -m troy.frameworks.dask worker SCHEDULER NAME NTHREADS CORES TAG`` or
    ``... scheduler SATURATION``: serve until stdin closes, after printing the address;
    ``... node SCHEDULER CORES [NAME [HOST]]``: a node's pilot agent, until SIGTERM."""
    logging.basicConfig(level=logging.WARNING)
    if len(argv) in (2, 4) and argv[0] == "scheduler":
        asyncio.run(_serve_scheduler(float(argv[1]), *argv[2:3], *map(int, argv[3:4])))
        return
    if argv[:1] == ["node"]:
        if not 3 <= len(argv) <= 5 or not argv[2].isdigit() or int(argv[2]) < 1:
            sys.exit(NODE_USAGE)
        if argv[1].startswith("tls://") and security_from_config() is None:
            sys.exit(f"troy node agent: cannot join {argv[1]}: no TLS certificate configured "
                     f"(DASK_DISTRIBUTED__COMM__TLS__*)")
        try:
            reconnect = reconnect_seconds()
        except ValueError as err:
            sys.exit(f"troy node agent: {err}")
        try:
            asyncio.run(_serve_node(argv[1], int(argv[2]), *(argv[3:] + [None, None])[:2],
                                    reconnect=reconnect))
        except SchedulerGone as err:
            sys.exit(f"troy node agent: {err}; exiting")
        except Exception as err:  # one line for the node's log, not a traceback
            cause = err.__cause__ or err
            sys.exit(f"troy node agent: cannot join {argv[1]}: {type(cause).__name__}: {cause}")
        os._exit(0)
    if len(argv) != 6 or argv[0] != "worker":
        sys.exit("usage: python -m troy.frameworks.dask worker SCHEDULER NAME NTHREADS CORES TAG")
    asyncio.run(_serve_worker(argv[1], argv[2], int(argv[3]), int(argv[4]), argv[5]))
    os._exit(0)  # unit threads may still be blocked on killed processes
