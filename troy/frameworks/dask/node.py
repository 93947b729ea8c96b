"""The node agent (``python -m troy.frameworks.dask node``, a CloudLab node's startup
command): a Dask worker with the node's cores as its ``cores`` resource, serving until
SIGTERM/SIGINT. It outlives the process holding its scheduler: when the scheduler goes away
(that process was SIGKILLed), the units running here are killed (Troy dispatches them again)
and a new worker of the same name rejoins the same address, for up to
``TROY_NODE_RECONNECT`` seconds (default 300; 0: never), then the agent exits with one line.
With ``TROY_NODE_RENEW_URL`` set (an enrolled node), the agent renews its certificate there
before it expires (:class:`troy.frameworks.dask.enrol.Renewer`).
The units' bookkeeping is :mod:`troy.frameworks.dask.agent`'s.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

from troy.frameworks.dask.agent import (_canceled, _kill_all, _procs, _procs_lock,
                                        _start_worker, _stopping, _terminating)

log = logging.getLogger(__name__)

RECONNECT_ENV = "TROY_NODE_RECONNECT"  # seconds a node agent tries to rejoin (0: never)
RECONNECT_DEFAULT = 300.0
RECONNECT_BACKOFF = (1.0, 10.0)  # first and longest pause between two rejoin attempts
UNITS_GONE_WAIT = 10.0  # seconds the killed units of a lost scheduler get to end
CUT_OFF_POLL = 0.05  # seconds between two looks at whether the worker lost its scheduler


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


async def _kill_when_cut_off(w: object, stop: asyncio.Event) -> None:
    """Kill the units as soon as the worker starts closing on its own (its scheduler went
    away), not once it has closed: a worker's close takes seconds, and a unit that ends its
    work meanwhile can report to nobody, so Troy runs it again (a duplicate run). Not on
    SIGTERM/SIGINT (``stop``): then the worker leaves the scheduler first, as before."""
    from distributed.core import Status
    while getattr(w, "status", None) not in (Status.closing, Status.closed, Status.failed):
        await asyncio.sleep(CUT_OFF_POLL)
    if not stop.is_set():
        _kill_all()


#: set by :func:`leave_for_good`: the cluster retires this node's worker because the node is
#: being given back, so the agent stops instead of rejoining
_leaving = threading.Event()


def leave_for_good() -> str:
    """Run on the node's worker by its cluster (``Client.run``) just before the cluster
    retires the worker to give the node back: the agent then stops instead of rejoining. A
    worker retired or lost without it (Troy lost its pilot, the scheduler went away) rejoins
    as before: its node is still the cluster's."""
    _leaving.set()
    return "leaving"


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
    # memory_limit "auto" (the node's memory, Dask's default): the scheduler judges
    # memory by it; with none (0) its adaptive target never lets a worker holding any
    # result go (workers_to_close wants the memory left >= twice the data held), so an
    # idle cluster whose client keeps a future never shrinks. Troy's units are processes
    # of their own, outside the memory Dask watches (this process's).
    options = {"nthreads": cores, "resources": {"cores": cores}, "name": name, "host": host,
               "memory_limit": "auto"}
    from troy.frameworks.dask.enrol import Renewer
    renewer = Renewer.from_environ()  # an enrolled node: its certificate is short-lived
    if renewer is not None:
        renewer.start()  # a daemon thread: it ends with the agent
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
        cut = asyncio.ensure_future(_kill_when_cut_off(w, stop))
        await asyncio.wait([done, asyncio.ensure_future(stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        cut.cancel()
        try:   # a close that fails kills the units all the same (see _serve_worker)
            await w.close(timeout=5, executor_wait=False, reason="troy node agent stopped")
        finally:
            _kill_all()
        if stop.is_set():
            return
        if _leaving.is_set():  # retired by its cluster: the node is going, no rejoining
            log.warning("the cluster retired this worker to give its node back: the agent "
                        "stops")
            return
        if reconnect <= 0:
            raise SchedulerGone(f"scheduler {scheduler} went away (reconnecting is off: "
                                f"{RECONNECT_ENV}=0)")
        log.warning(
            "the scheduler %s went away: units here killed; rejoining for up to %g s",
            scheduler, reconnect)
        await loop.run_in_executor(None, _await_units_gone, UNITS_GONE_WAIT)
        with _procs_lock:  # a unit killed here may come back, to the new worker
            _canceled.clear()
        _stopping.clear()
        w = await _rejoin(scheduler, stop, reconnect, **options)
