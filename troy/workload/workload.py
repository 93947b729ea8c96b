"""Workload and Relation (seed 001).

A workload is a dict of tasks (``workload.tasks[id]``) and a list of relations. Its state
moves atomically through DESCRIBED → PLANNED → TRANSLATED → BOUND (= SCHEDULED) →
DISPATCHED under the planner and workload manager; after dispatch it is derived from its
tasks' states by the seed's table, updated incrementally as tasks push changes.

Changes: tasks and relations can be added while the workload is DESCRIBED or PLANNED and not
locked; ``lock()`` freezes its composition (``IncorrectState`` on add_task / add_relation)
until ``unlock()``.
"""
from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, overload

from troy.collector import collector_paused
from troy.descriptions import TaskDescription
from troy.errors import BadParameter, IncorrectState
from troy.limits import MAX_TASKS
from troy.states import FINAL_STATES, Lockable, Observable, State
from troy.workload.task import Task


WorkloadCallback = Callable[["Workload", State], Any]
TaskLike = TaskDescription | Mapping[str, Any]


@dataclass(frozen=True)
class Relation:
    """``tail`` runs only after ``head`` is DONE (a FAILED or CANCELED head cancels it).

    ``head`` and ``tail`` are task ids (Task objects are accepted and reduced to ids)."""

    head: str
    tail: str

    def __init__(self, head: str | Task, tail: str | Task) -> None:
        object.__setattr__(self, "head", head.id if isinstance(head, Task) else head)
        object.__setattr__(self, "tail", tail.id if isinstance(tail, Task) else tail)


class Workload(Lockable, Observable):
    """Tasks and their relations, managed by Troy's planner and workload manager."""

    def __init__(self, uid: str | None = None) -> None:
        self.id = uid or f"workload.{uuid.uuid4().hex[:8]}"
        self.tasks: dict[str, Task] = {}
        self.relations: list[Relation] = []
        #: task id -> the ids it was expanded into by the planner (cardinality > 1)
        self.expansions: dict[str, list[str]] = {}
        self._heads: dict[str, set[str]] = defaultdict(set)
        self._tails: dict[str, set[str]] = defaultdict(set)
        self._seq = itertools.count()
        self._state = State.DESCRIBED
        self._dispatched = False
        self._counts: Counter[State] = Counter()
        self._locked = False
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._callbacks: tuple[WorkloadCallback, ...] = ()

    def __repr__(self) -> str:
        return f"<Workload {self.id} {self._state.value} tasks={len(self.tasks)}>"

    # -- state --------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Whether every task is final (DONE, FAILED or CANCELED)."""
        with self._lock:
            return sum(self._counts[s] for s in FINAL_STATES) == len(self.tasks)

    def wait(self, timeout: float | None = None) -> State:
        """Block until every task is final (or ``timeout``); return the workload state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self.tasks and not self.finished:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return self._state

    # States are set under the lock (the last event wins); callbacks run outside it.
    def _set_state(self, state: State) -> None:
        with self._lock:
            callbacks = self._transition(state)
        self._notify(state, callbacks)

    def _transition(self, state: State) -> tuple[WorkloadCallback, ...] | None:
        if self._state is state:
            return None
        self._state = state
        self._cond.notify_all()
        return self._callbacks

    def _notify(self, state: State, callbacks: tuple[WorkloadCallback, ...] | None) -> None:
        self._run_callbacks(callbacks or (), state)

    def _task_changed(self, task: Task, old: State, new: State) -> None:
        self._tasks_changed([(task, old, new)])

    def _tasks_changed(self, changes: list[tuple[Task, State, State]]) -> None:
        """Tasks moved from ``old`` to ``new``: the counts, the waiters woken, this
        workload's state derived again (once for them all)."""
        with self._lock:
            tasks, moves = self.tasks, {}
            for task, old, new in changes:
                if task.id in tasks:
                    move = (old, new)
                    moves[move] = moves.get(move, 0) + 1
            if not moves:
                return
            counts = self._counts
            for (old, new), n in moves.items():
                counts[old] -= n
                counts[new] += n
            self._cond.notify_all()
            if not self._dispatched:
                return
            state = self._derive()
            callbacks = self._transition(state)
        self._notify(state, callbacks)

    def _derive(self) -> State:
        """Seed 001's workload table plus its RUNNING line, on task-state counts (same
        result as ``troy.states.derive_workload_state`` over the tasks, in O(1))."""
        c, n = self._counts, len(self.tasks)
        if n == 0:
            return State.UNKNOWN
        if c[State.FAILED]:
            return State.FAILED
        if c[State.CANCELED]:
            return State.CANCELED
        if c[State.RUNNING]:
            return State.RUNNING
        if c[State.DISPATCHED]:
            return State.DISPATCHED
        if c[State.DONE] == n:
            return State.DONE
        return State.UNKNOWN

    def _mark_dispatched(self) -> None:
        with self._lock:
            self._dispatched = True
            first = self._transition(State.DISPATCHED)
            state = self._derive()
            second = self._transition(state)
        self._notify(State.DISPATCHED, first)
        self._notify(state, second)

    # -- composition --------------------------------------------------------------------
    def _check_changeable(self) -> None:
        if self._locked:
            raise IncorrectState(f"workload {self.id} is locked")
        if self._state not in (State.DESCRIBED, State.PLANNED):
            raise IncorrectState(f"workload {self.id} is {self._state.value}: tasks and "
                                 f"relations can only be added before translation")

    @overload
    def add_task(self, descr: TaskLike, uid: str | None = None) -> str: ...
    @overload
    def add_task(self, descr: list[TaskLike], uid: None = None) -> list[str]: ...

    def add_task(self, descr: TaskLike | list[TaskLike],
                 uid: str | None = None) -> str | list[str]:
        """Add a task (or a list of tasks); returns its id (or their ids).

        ``descr`` is a TaskDescription or a dict of its fields. ``uid`` names a single
        task (default: ``task.NNNN``); reach tasks through ``workload.tasks[id]``."""
        if isinstance(descr, list):
            if uid is not None:
                raise BadParameter("add_task: uid names a single task, not a list")
            with self._lock, collector_paused():
                self._check_changeable()
                tds = [TaskDescription.coerce(d) for d in descr]
                return [self._add(td, None) for td in tds]
        td = TaskDescription.coerce(descr)
        with self._lock:
            self._check_changeable()
            return self._add(td, uid)

    def _add(self, td: TaskDescription, uid: str | None) -> str:
        if uid is None:
            uid = f"task.{next(self._seq):04d}"
            while uid in self.tasks:
                uid = f"task.{next(self._seq):04d}"
        elif uid in self.tasks:
            raise BadParameter(f"workload {self.id} already has a task {uid!r}")
        if len(self.tasks) >= MAX_TASKS:
            raise BadParameter(f"workload {self.id}: more than the limit of {MAX_TASKS} tasks")
        task = Task(uid, td, self)
        task._state = self._state if self._state is State.PLANNED else State.DESCRIBED
        self.tasks[uid] = task
        self._counts[task.state] += 1
        return uid

    def _remove_task(self, uid: str) -> Task:
        """Drop a task and its relations (the planner, when expanding cardinality)."""
        task = self.tasks.pop(uid)
        self._counts[task.state] -= 1
        for h in self._heads.pop(uid, set()):
            self._tails[h].discard(uid)
        for t in self._tails.pop(uid, set()):
            self._heads[t].discard(uid)
        self.relations = [r for r in self.relations if uid not in (r.head, r.tail)]
        return task

    def add_relation(self, descr: Relation | Iterable[Relation]) -> None:
        """Add a relation (or several): the tail runs after the head is DONE.

        Raises ValueError (``BadParameter``) for a task not in the workload, a relation
        added twice, or one that would close a cycle; a list is added all or nothing."""
        rels = [descr] if isinstance(descr, Relation) else list(descr)
        with self._lock:
            self._check_changeable()
            seen = set(self.relations)
            for r in rels:
                if not isinstance(r, Relation):
                    raise BadParameter(f"add_relation: expected a Relation, got {r!r}")
                for end in (r.head, r.tail):
                    if end not in self.tasks:
                        raise BadParameter(f"relation {r.head} -> {r.tail}: no task {end!r} "
                                           f"in workload {self.id}")
                if r in seen:
                    raise BadParameter(f"relation {r.head} -> {r.tail} was already added")
                if r.head == r.tail:
                    raise BadParameter(f"relation {r.head} -> {r.tail} is a cycle")
                seen.add(r)
            if len(rels) == 1 and self._reaches(rels[0].tail, rels[0].head):
                raise BadParameter(f"relation {rels[0].head} -> {rels[0].tail} would make a "
                                   f"cycle")
            for r in rels:
                self._heads[r.tail].add(r.head)
                self._tails[r.head].add(r.tail)
            cycle = self._find_cycle() if len(rels) > 1 else None
            if cycle:
                for r in rels:
                    self._heads[r.tail].discard(r.head)
                    self._tails[r.head].discard(r.tail)
                raise BadParameter(f"relations would make a cycle through task {cycle!r}")
            self.relations.extend(rels)

    def _reaches(self, start: str, goal: str) -> bool:
        """Whether ``goal`` is ``start`` or runs after it (depth-first over tails)."""
        stack, seen = [start], {start}
        while stack:
            t = stack.pop()
            if t == goal:
                return True
            for n in self._tails.get(t, ()):
                if n not in seen:
                    seen.add(n)
                    stack.append(n)
        return False

    def _find_cycle(self) -> str | None:
        """A task on a cycle, or None (Kahn's algorithm over the whole graph)."""
        indeg = {t: len(self._heads.get(t, ())) for t in self.tasks}
        ready = [t for t, d in indeg.items() if d == 0]
        seen = 0
        while ready:
            t = ready.pop()
            seen += 1
            for tail in self._tails.get(t, ()):
                indeg[tail] -= 1
                if indeg[tail] == 0:
                    ready.append(tail)
        if seen == len(self.tasks):
            return None
        return next(t for t, d in indeg.items() if d > 0)

    def heads(self, uid: str) -> set[str]:
        """Ids of the tasks ``uid`` must wait for."""
        return set(self._heads.get(uid, ()))

    def tails(self, uid: str) -> set[str]:
        """Ids of the tasks waiting for ``uid``."""
        return set(self._tails.get(uid, ()))

    def levels(self) -> list[list[str]]:
        """Tasks by dependency depth (level 0 has no heads), for planners."""
        depth: dict[str, int] = {}
        order = list(self.tasks)
        indeg = {t: len(self._heads.get(t, ())) for t in order}
        ready = [t for t in order if indeg[t] == 0]
        for t in ready:
            depth[t] = 0
        while ready:
            t = ready.pop()
            for tail in self._tails.get(t, ()):
                depth[tail] = max(depth.get(tail, 0), depth[t] + 1)
                indeg[tail] -= 1
                if indeg[tail] == 0:
                    ready.append(tail)
        out: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for t in order:
            out[depth.get(t, 0)].append(t)
        return out

    def cancel(self) -> None:
        """Cancel every task (seed: cancel all tasks)."""
        for task in list(self.tasks.values()):
            task.cancel()
        if not self._dispatched:
            self._set_state(State.CANCELED)
