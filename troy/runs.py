"""A workload executed on a thread of its own: ``WorkloadRun``, its handle.

    run = troy.WorkloadRun(session, workload, overlay, bind_mode="late").start()
    for event in run.events():        # TaskEvent(task, state) as tasks change, to the end
        ...
    state = run.result()              # the final State, or what the run raised, re-raised

``start`` plans the workload first if it is DESCRIBED (cardinality expanded: the events
cover every task to run), then runs ``execute_workload`` on a thread. A workload dispatched
already (rebuilt from the store by ``Session.resume_workload``, or by ``Session.recover``)
is not dispatched again: the run provisions the overlay and waits for its tasks, which is
how a resumed run goes on. ``future`` is a ``concurrent.futures.Future`` of the final
state; ``timeout`` (seconds from ``start``) ends it with ``NoSuccess`` while the tasks keep
running (cancel the workload to stop them).

The commands that run workloads (``troy run``, ``elasticslice run``) and both demos run
through it; ``run_numbers_problem`` checks the numbers they share.
"""
from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from troy.errors import IncorrectState, NoSuccess
from troy.states import FINAL_STATES, State

if TYPE_CHECKING:
    from troy.overlay import Overlay
    from troy.session import Session
    from troy.workload import Task, Workload

log = logging.getLogger(__name__)

#: workload states before dispatch: a workload in any other state was dispatched already
NOT_DISPATCHED = (State.DESCRIBED, State.PLANNED, State.TRANSLATED, State.BOUND)


class TaskEvent(NamedTuple):
    """A task changed state (unpacks as ``(task, state)``)."""

    task: str
    state: State


@dataclass(frozen=True)
class RunProgress:
    """Where the run's tasks are now."""

    total: int
    done: int
    failed: int
    canceled: int
    running: int

    @property
    def final(self) -> int:
        return self.done + self.failed + self.canceled


class WorkloadRun:
    """The handle of one workload being executed (see the module documentation).
    ``manager_options`` go to ``execute_workload`` (``bundle``, ``scheduler``, ...);
    ``events=False``: no event queue (a caller that only polls ``progress()`` does not let
    one grow with every task change)."""

    def __init__(self, session: Session, workload: Workload, overlay: Overlay | None = None,
                 *, bind_mode: str = "late", timeout: float | None = None,
                 name: str = "troy-run", events: bool = True,
                 **manager_options: Any) -> None:
        self.session, self.workload, self.overlay = session, workload, overlay
        self.bind_mode, self.timeout, self.name = bind_mode, timeout, name
        self.manager_options = manager_options
        self._watch = events
        #: the final State, or the error the run raised
        self.future: Future[State] = Future()
        #: the workload was dispatched before: the run only waits for it
        self.resumed = False
        self._events: queue.SimpleQueue[TaskEvent | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<WorkloadRun {self.workload.id} {'ended' if self.done() else 'running'}>"

    def start(self) -> WorkloadRun:
        """Plan (if needed), watch the tasks, start the thread. Returns ``self``."""
        if self._thread is not None:
            return self
        if self.workload.state is State.DESCRIBED:
            from troy.planner import Planner
            Planner(self.session).plan(self.workload)
        self.resumed = self.workload.state not in NOT_DISPATCHED
        for task in self.workload.tasks.values() if self._watch else ():
            task.add_callback(self._on_task)
            if task.state in FINAL_STATES:  # ended in an earlier run: said first
                self._events.put(TaskEvent(task.id, task.state))
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _on_task(self, task: Task, state: State) -> None:
        self._events.put(TaskEvent(task.id, state))

    def _run(self) -> None:
        try:
            self.future.set_result(self._follow() if self.resumed else self._execute())
        except BaseException as err:  # handed to whoever asks for the result
            self.future.set_exception(err)
        finally:
            self._events.put(None)

    def _execute(self) -> State:
        from troy.execute import execute_workload
        return execute_workload(self.session, self.workload, self.overlay,
                                bind_mode=self.bind_mode, timeout=self.timeout,
                                **self.manager_options)

    def _follow(self) -> State:
        started = time.monotonic()
        if self.overlay is not None:
            from troy.overlay import OverlayManager
            OverlayManager(self.session).manage_overlay(self.overlay)
        left = None if self.timeout is None \
            else max(0.0, self.timeout - (time.monotonic() - started))
        state = self.workload.wait(left)
        if not self.workload.finished:
            raise NoSuccess(f"workload {self.workload.id} not finished after "
                            f"{self.timeout:.1f} s (state {state.value})")
        return state

    # -- asking ---------------------------------------------------------------------------
    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the run to end; whether it has."""
        try:
            self.future.exception(timeout)
        except TimeoutError:
            return False
        return True

    def result(self, timeout: float | None = None) -> State:
        """The final state; raises what the run raised (``NoSuccess`` after ``timeout``),
        or ``TimeoutError`` if it has not ended within ``timeout`` seconds of this call."""
        return self.future.result(timeout)

    def exception(self) -> BaseException | None:
        """What the run raised (None: nothing, or not ended)."""
        return self.future.exception() if self.future.done() else None

    def events(self, poll: float = 0.5) -> Iterator[TaskEvent]:
        """Task state changes, in order, until the run ends (one reader). Waits in steps of
        ``poll`` seconds, so that a Ctrl-C on the reading thread is noticed."""
        if not self._watch:
            raise IncorrectState(f"run of {self.workload.id}: made with events=False")
        while True:
            try:
                event = self._events.get(timeout=poll)
            except queue.Empty:
                continue
            if event is None:
                return
            yield event

    def progress(self) -> RunProgress:
        states = [t.state for t in list(self.workload.tasks.values())]
        return RunProgress(len(states), states.count(State.DONE), states.count(State.FAILED),
                           states.count(State.CANCELED), states.count(State.RUNNING))


def run_numbers_problem(time_scale: float, timeout: float | None) -> str | None:
    """What is wrong with a run's ``--time-scale`` and ``--timeout`` (None: nothing); the
    commands that run workflows (``troy run``, ``elasticslice run``) share it."""
    if not math.isfinite(time_scale) or time_scale < 0:
        return f"--time-scale {time_scale}: expected a finite number >= 0"
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        return f"--timeout {timeout}: expected a number of seconds > 0"
    return None
