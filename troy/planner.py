"""Planner: expands a workload's cardinality and derives an overlay for it (seed 001).

Cardinality: a task with ``cardinality = N`` becomes N tasks ``<id>.0`` … ``<id>.N-1``
(``workload.expansions[id]`` lists them); ``%(cardinal)s`` in the executable, arguments,
environment values, working directory, stdin/stdout/stderr, staging directives and tag is
replaced by the instance number. Relations follow: between two expanded tasks of the same
cardinality instance *i* relates to instance *i* (a pipeline per instance); otherwise every
instance of the head relates to every instance of the tail.

At most ``troy.limits.MAX_TASKS`` tasks after expansion: a workload that would grow past it
is refused (``BadParameter`` naming the widest task) before anything is expanded.

Overlay: ``derive_overlay`` sizes one pilot for the workload's peak concurrency: the largest
sum of cores over a dependency level, capped at the machine's cores (config
``machine_cores``, default ``os.cpu_count()``) but never below the widest task.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from troy.collector import collector_paused
from troy.descriptions import PilotDescription, TaskDescription
from troy.errors import BadParameter, IncorrectState
from troy.limits import MAX_TASKS
from troy.overlay.overlay import Overlay
from troy.states import FINAL_STATES, State
from troy.workload.task import set_states
from troy.workload.workload import Relation, Workload

if TYPE_CHECKING:
    from troy.session import Session

log = logging.getLogger(__name__)

CARDINAL = "%(cardinal)s"
_STR_FIELDS = ("executable", "working_directory", "stdin", "stdout", "stderr", "tag")
_LIST_FIELDS = ("arguments", "inputs", "outputs")


def substitute(td: TaskDescription, i: int) -> TaskDescription:
    """Instance ``i`` of ``td``: ``%(cardinal)s`` replaced, cardinality 1."""
    n = str(i)
    changes: dict[str, Any] = {"cardinality": 1}
    for f in _STR_FIELDS:
        v = getattr(td, f)
        if isinstance(v, str):
            changes[f] = v.replace(CARDINAL, n)
    for f in _LIST_FIELDS:
        changes[f] = [x.replace(CARDINAL, n) for x in getattr(td, f)]
    changes["environment"] = {k: v.replace(CARDINAL, n) for k, v in td.environment.items()}
    return td.replace(**changes)


class Planner:
    """Plans workloads of a session (the session only lends its config)."""

    def __init__(self, session: Session | None = None) -> None:
        self.session = session

    @property
    def machine_cores(self) -> int:
        cfg = self.session.config.get("machine_cores") if self.session else None
        return int(cfg or os.cpu_count() or 1)

    def expand_workload(self, workload: Workload) -> None:
        """Replace every task of cardinality N > 1 by its N instances (see module doc)."""
        with workload._lock:
            if workload.state not in (State.DESCRIBED, State.PLANNED):
                raise IncorrectState(f"workload {workload.id} is {workload.state.value}; "
                                     f"cardinality is expanded before translation")
            wide = [t for t in workload.tasks.values() if t.description.cardinality > 1]
            if not wide:
                return
            total = sum(t.description.cardinality for t in workload.tasks.values())
            if total > MAX_TASKS:  # refused before a single instance is made
                widest = max(wide, key=lambda t: t.description.cardinality)
                raise BadParameter(f"workload {workload.id}: expanding cardinality would make "
                                   f"{total} tasks, more than the limit of {MAX_TASKS} (task "
                                   f"{widest.id!r} has cardinality "
                                   f"{widest.description.cardinality})")
            relations = list(workload.relations)
            for task in wide:
                n = task.description.cardinality
                old = workload._remove_task(task.id)
                ids = []
                for i in range(n):
                    uid = f"{task.id}.{i}"
                    ids.append(workload._add(substitute(old.description, i), uid))
                    if old.state in FINAL_STATES:  # canceled before planning
                        workload.tasks[uid]._set_state(old.state)
                workload.expansions[task.id] = ids
            new = []
            for r in relations:
                heads = workload.expansions.get(r.head, [r.head])
                tails = workload.expansions.get(r.tail, [r.tail])
                if len(heads) == len(tails) > 1:
                    new.extend(Relation(h, t) for h, t in zip(heads, tails))
                else:
                    new.extend(Relation(h, t) for h in heads for t in tails)
            existing = set(workload.relations)
            new = [r for r in dict.fromkeys(new) if r not in existing]
            for r in new:
                workload._heads[r.tail].add(r.head)
                workload._tails[r.head].add(r.tail)
            workload.relations.extend(new)
            log.info("expanded %d task(s) of %s by cardinality", len(wide), workload.id)

    def plan(self, workload: Workload) -> None:
        """Expand cardinality; the workload (and its tasks) move to PLANNED (with the
        collector paused, as the workload manager's steps: :mod:`troy.collector`)."""
        with collector_paused():
            self.expand_workload(workload)
            set_states(list(workload.tasks.values()), State.PLANNED)
            workload._set_state(State.PLANNED)

    def derive_overlay(self, workload: Workload, framework: str | None = None) -> Overlay:
        """One pilot sized for the workload's peak concurrency (see module doc)."""
        widest = max((t.description.cores for t in workload.tasks.values()), default=1)
        peak = 0
        for level in workload.levels():
            cores = 0
            for tid in level:
                d = workload.tasks[tid].description
                cores += d.cores * d.cardinality
            peak = max(peak, cores)
        size = max(widest, min(peak, self.machine_cores), 1)
        return Overlay([PilotDescription(size=size, framework=framework)])
