"""The management cycle on APScheduler 3: one job per method, each at its own interval.

* A method that raises is retried after ``retry_interval``, doubling on each further failure
  (never later than its own interval, at most 32 x ``retry_interval``); the others go on.
  Its last error is recorded (``ManagerState.record_run``), so ``status`` shows it.
* ``reset_triggers``: when a method reports a change (returns something truthy), the methods
  listed for it run at once instead of waiting out their intervals.
* :meth:`Cycle.wake` runs methods now: events (a node turning ready, a delete notice, a
  demand change) use it. A wake that arrives while the method's job is under way (from inside
  the run itself, or from another thread) makes the job run the method once more before it
  returns: rescheduling a job APScheduler still counts as running would be skipped as
  "maximum number of running instances reached", and the wake lost for a whole interval.

Jobs run one at a time (one worker thread, ``cycle``): the methods share the slice and its
state. The methods of :data:`APART` run on a thread of their own each (``cycle-<method>``),
so that they never wait behind another: ``release_nodes`` gives nodes back while
``add_nodes`` may be stuck in a slow AddNodes.
"""
from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger(__name__)

MAX_BACKOFF_FACTOR = 32

# -- the one table of cycle intervals (seconds) ---------------------------------------------
#: the seed's order of the cycle's methods (``SimpleElasticSliceManager.DEF_ORDER``)
DEF_ORDER: tuple[str, ...] = (
    "ensure_slice", "ensure_sliver", "update_sliver_status", "renew", "update_all",
    "update_available", "get_system_state", "add_nodes", "delete_nodes", "release_nodes",
    "set_system_state")
#: the seed's interval of a method not in :data:`DEF_INTERVALS`
DEF_INTERVAL = 60
#: the seed's intervals (``SimpleElasticSliceManager.DEF_INTERVALS``, ``[manager]``'s defaults)
DEF_INTERVALS: Mapping[str, float] = {
    "update_available": 600, "ensure_sliver": 60, "delete_nodes": 300,
    "update_sliver_status": 60, "update_all": 86400, "renew": 3600, "add_nodes": 300,
    "ensure_slice": 60, "release_nodes": 60}
# Quick enough to follow a workload: what the pilot cluster and the Parsl provider share.
_QUICK = {"ensure_slice": 60.0, "ensure_sliver": 10.0, "update_sliver_status": 1.0,
          "renew": 600.0, "update_all": 3600.0}
#: the pilot cluster's (``run``, ``CloudLabCluster``): quick enough to follow Troy's demand
PILOT_INTERVALS: Mapping[str, float] = {
    **_QUICK, "update_available": 5.0, "get_system_state": 1.0, "add_nodes": 2.0,
    "delete_nodes": 2.0, "release_nodes": 5.0, "set_system_state": 5.0}
#: the Parsl provider's: quick enough to follow Parsl's strategy
PARSL_INTERVALS: Mapping[str, float] = {
    **_QUICK, "update_available": 30.0, "get_system_state": 60.0, "add_nodes": 1.0,
    "delete_nodes": 1.0, "release_nodes": 5.0, "set_system_state": 60.0}
#: the seed's triggers: a method that did something runs these next
#: (``SimpleElasticSliceManager.METHOD_RESET_TRIGGERS``)
RESET_TRIGGERS: Mapping[str, tuple[str, ...]] = {
    "add_nodes": ("update_sliver_status", "update_available", "get_system_state",
                  "set_system_state"),
    "delete_nodes": ("release_nodes",),
    "release_nodes": ("update_sliver_status", "update_available", "get_system_state",
                      "set_system_state")}
#: the methods that run on a thread of their own, never behind another (a release is woken
#: as soon as something is to be given back; its interval only retries what is left)
APART: tuple[str, ...] = ("release_nodes",)


class RunRecorder(Protocol):
    def record_run(self, method: str, *, started: float, finished: float, error: str | None,
                   next_run: float | None) -> None: ...


def one_line(err: BaseException) -> str:
    """An error as one line, for logs, status and email."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) < 500 else text[:497] + "..."


@dataclass
class MethodRun:
    """What the cycle knows about one method (in memory; the state store has the rest)."""

    interval: float
    failures: int = 0
    last_error: str | None = None
    running: bool = False
    rerun: bool = False              # woken while its job was under way: run once more
    in_job: bool = False             # a job of it entered, and not yet released by APScheduler
    last_result: Any = None
    runs: int = 0
    errors: list[str] = field(default_factory=list)
    failures_total: int = 0          # every failure since this cycle was made (metrics)
    last_ok: float | None = None     # when it last ended without an error (clock time)


class Cycle:
    """Runs ``call(method)`` for each method of ``order`` at ``intervals[method]`` seconds."""

    def __init__(self, call: Callable[[str], Any], *, order: Sequence[str],
                 intervals: Mapping[str, float], default_interval: float = 60.0,
                 reset_triggers: Mapping[str, Sequence[str]] | None = None,
                 retry_interval: float = 30.0, recorder: RunRecorder | None = None,
                 on_error: Callable[[str, BaseException, int], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 apart: Sequence[str] = APART) -> None:
        self.call = call
        self.order = list(order)
        self.apart = [m for m in apart if m in self.order]
        self.reset_triggers = {k: list(v) for k, v in (reset_triggers or {}).items()}
        self.retry_interval = max(0.01, float(retry_interval))
        self.recorder = recorder
        self.on_error = on_error
        self.clock = clock
        self.methods = {m: MethodRun(float(intervals.get(m, default_interval)))
                        for m in self.order}
        self._lock = threading.Lock()
        self._scheduler: BackgroundScheduler | None = None
        self._stopping = False

    # ---- one method, with bookkeeping (used by the jobs and by run_once)
    def run_method(self, name: str) -> bool:
        """Run ``name`` once; True when it succeeded. Never raises."""
        info = self.methods[name]
        with self._lock:
            info.running = True
            info.rerun = False
        started = self.clock()
        error: BaseException | None = None
        result: Any = None
        try:
            result = self.call(name)
        except Exception as err:  # a failing method must not stop the others
            error = err
        finished = self.clock()
        with self._lock:
            info.running = False
            info.runs += 1
            info.last_result = result
        if error is None:
            info.failures = 0
            info.last_error = None
            info.last_ok = finished
            next_run = finished + info.interval
        else:
            info.failures += 1
            info.failures_total += 1
            info.last_error = f"{type(error).__name__}: {one_line(error)}"
            delay = self.backoff(name)
            next_run = finished + delay
            log.warning("%s failed (%d in a row; retry in %.0f s): %s", name, info.failures,
                        delay, info.last_error, exc_info=log.isEnabledFor(logging.DEBUG))
        self._record(name, started, finished, info.last_error, next_run)
        if error is not None:
            self._reschedule(name, next_run)
            if self.on_error is not None:
                try:
                    self.on_error(name, error, info.failures)
                except Exception:  # reporting must not break the cycle
                    log.exception("reporting the failure of %s failed", name)
        elif result:
            triggered = self.reset_triggers.get(name, ())
            if triggered:
                log.debug("%s changed something: running %s now", name, ", ".join(triggered))
                self.wake(*triggered)
        with self._lock:  # woken during a run outside any job (run_once): run it soon
            again = info.rerun and not info.in_job
            if again:
                info.rerun = False
        if again:
            self._reschedule(name, self.clock())
        return error is None

    def _job(self, name: str) -> None:
        """A scheduled run: dropped once stopping (runs queued before the stop). Runs the
        method again while wakes arrived during its pass (each pass clears the flag)."""
        info = self.methods[name]
        if self._stopping:
            return
        with self._lock:
            info.in_job = True
        while not self._stopping:
            self.run_method(name)
            with self._lock:
                if not info.rerun:
                    return
            log.debug("%s was woken while it ran: running it again", name)

    def _job_released(self, event: JobExecutionEvent) -> None:
        """APScheduler released a job (its instance count is down): a wake that came after
        the job's last pass but before this would have been skipped, so it runs now."""
        info = self.methods.get(event.job_id)
        if info is None:
            return
        with self._lock:
            info.in_job = False
            again, info.rerun = info.rerun, False
        if again and not self._stopping:
            # Not here: this may run on the scheduler's own thread, inside its processing of
            # due jobs (a job that ended before APScheduler attached its done-callback), which
            # then sets the job's next run from its trigger, over ours.
            threading.Thread(target=self._reschedule, args=(event.job_id, self.clock()),
                             name=f"cycle-wake-{event.job_id}", daemon=True).start()

    def backoff(self, name: str) -> float:
        info = self.methods[name]
        cap = max(self.retry_interval, min(info.interval,
                                           self.retry_interval * MAX_BACKOFF_FACTOR))
        return min(cap, self.retry_interval * 2 ** max(0, info.failures - 1))

    def _record(self, name: str, started: float, finished: float, error: str | None,
                next_run: float | None) -> None:
        if self.recorder is None:
            return
        try:
            self.recorder.record_run(name, started=started, finished=finished, error=error,
                                     next_run=next_run)
        except Exception:
            log.exception("cannot record the run of %s", name)

    def run_once(self) -> dict[str, str | None]:
        """Every method once, in order (``manage --once``); method -> last error or None."""
        return {name: (None if self.run_method(name) else self.methods[name].last_error)
                for name in self.order}

    # ---- the scheduler
    def start(self, first_delay: float | None = None) -> None:
        """Schedule every method; the first runs come after ``first_delay`` seconds
        (default: each method's interval, as after a :meth:`run_once`)."""
        # With one worker, a due run of a method still queued behind another is skipped (the
        # queued run comes anyway; wakes never are, see _job): APScheduler's WARNING is noise.
        # Its INFO lines (every run of every job) would drown the manager's own.
        for name, level in (("apscheduler", logging.WARNING),
                            ("apscheduler.scheduler", logging.ERROR)):
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(level)
        self._stopping = False
        with self._lock:
            for info in self.methods.values():
                info.in_job = info.rerun = False
        executors = {"default": ThreadPoolExecutor(1, {"thread_name_prefix": "cycle"})}
        for name in self.apart:
            executors[name] = ThreadPoolExecutor(1, {"thread_name_prefix": f"cycle-{name}"})
        scheduler = BackgroundScheduler(
            executors=executors,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=dt.timezone.utc)
        now = dt.datetime.now(dt.timezone.utc)
        for index, name in enumerate(self.order):
            info = self.methods[name]
            # Staggered, so that the first runs keep the order (ties would go by name).
            delay = (info.interval if first_delay is None else first_delay) + index * 0.01
            scheduler.add_job(self._job, IntervalTrigger(seconds=info.interval),
                              args=[name], id=name, name=name,
                              executor=name if name in self.apart else "default",
                              next_run_time=now + dt.timedelta(seconds=delay))
        # Dispatched after APScheduler released the job (executors/base.py _run_job_success).
        scheduler.add_listener(self._job_released, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
        self._scheduler = scheduler
        scheduler.start()

    def stop(self, wait: bool = True) -> None:
        """Stop scheduling; the method running finishes, queued runs are dropped."""
        self._stopping = True
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None and scheduler.running:
            scheduler.shutdown(wait=wait)

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    def wake(self, *names: str) -> None:
        """Run these methods as soon as possible (each once, however often woken)."""
        for name in names:
            info = self.methods.get(name)
            if info is None:
                continue
            with self._lock:
                if info.in_job or info.running:  # run again after (_job, _job_released)
                    info.rerun = True
                    continue
            self._reschedule(name, self.clock())

    def _reschedule(self, name: str, when: float) -> None:
        scheduler = self._scheduler
        if scheduler is None:
            return
        at = dt.datetime.fromtimestamp(max(when, time.time()), dt.timezone.utc)
        try:
            scheduler.modify_job(name, next_run_time=at)
        except Exception as err:  # shutting down, or the job is gone
            log.debug("cannot reschedule %s: %s", name, err)

    def next_run(self, name: str) -> float | None:
        scheduler = self._scheduler
        job = scheduler.get_job(name) if scheduler is not None else None
        if job is None or job.next_run_time is None:
            return None
        return job.next_run_time.timestamp()
