"""Resuming dispatched workloads after a restart.

``dispatch_workload`` records the workload's spec (task descriptions and relations) and all
its units, held ones included. ``Session.recover`` rebuilds such a workload with the same
task and unit ids: units that ended keep their recorded state, units in flight are
dispatched again (at least once), and held units are released by the relations as before.
Task descriptions holding Python callables are stored without the callable; their units
cannot be re-run and end FAILED.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from troy.descriptions import TaskDescription
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit, UnitResult

if TYPE_CHECKING:
    from troy.store import UnitRecord
    from troy.workload.manager import WorkloadManager
    from troy.workload.workload import Workload

log = logging.getLogger(__name__)


def _task_dict(td: TaskDescription) -> dict[str, Any]:
    d = td.to_dict(defaults=False)   # (coerce() gives the defaults back)
    if td.function is not None:
        d["function"], d["args"], d["kwargs"] = None, [], {}
    d["args"] = list(d.get("args") or [])
    return d


def workload_spec(workload: Workload) -> dict[str, Any]:
    """What it takes to rebuild ``workload``: task descriptions (by id) and relations."""
    return {"tasks": {tid: _task_dict(t.description) for tid, t in workload.tasks.items()},
            "relations": [[r.head, r.tail] for r in workload.relations]}


def resume_workload(manager: WorkloadManager, wid: str, spec: dict[str, Any],
                    records: list[UnitRecord]) -> tuple[Workload, list[ComputeUnit]]:
    """Rebuild workload ``wid`` from its spec and unit records and dispatch what is left.
    Returns the workload and its units that were not final (now dispatched or held)."""
    from troy.workload.manager import _Plan
    from troy.workload.workload import Relation, Workload

    w = Workload(uid=wid)
    for tid, d in spec["tasks"].items():
        w._add(TaskDescription.coerce(d), tid)
    for head, tail in spec["relations"]:
        r = Relation(head, tail)
        w._heads[tail].add(head)
        w._tails[head].add(tail)
        w.relations.append(r)
    plan = _Plan(w)
    pending: list[ComputeUnit] = []
    for rec in records:
        unit = ComputeUnit(rec.to_description() if rec.persistable else
                           {"executable": "/bin/false"}, uid=rec.id, task_ids=rec.task_ids)
        unit.attempts = rec.attempts
        unit.framework, unit.pilot = rec.framework, rec.pilot
        if rec.state in FINAL_STATES:
            unit._set_state(rec.state, result=UnitResult(
                exit_code=rec.exit_code, error=rec.error, start=rec.start, end=rec.end))
            plan.released.add(unit.id)
        elif not rec.persistable:
            unit._set_state(State.FAILED, result=UnitResult(
                error="a Python callable cannot be re-run after a restart"))
            plan.released.add(unit.id)
        else:
            unit._set_state(State.BOUND)
            pending.append(unit)
        own = set(rec.task_ids)
        plan.heads[unit.id] = set().union(*(w.heads(t) for t in own)) - own
        plan.units.append(unit)
        for tid in rec.task_ids:
            if tid in w.tasks:
                w.tasks[tid]._attach(unit)
    for t in w.tasks.values():
        if not t.units:  # canceled before translation
            t._set_state(State.CANCELED)
        else:
            t._set_state(State.BOUND)
    w._set_state(State.BOUND)
    with manager._lock:
        manager._plans[wid] = plan
    store = manager.session.store
    store.add_units([u for u in plan.units if u.state in FINAL_STATES],
                    session=manager.session.id, workload=wid)
    for u in plan.units:
        if u.state in FINAL_STATES:
            store.record(u)  # the error of callables marked FAILED just now, too
    log.info("resuming workload %s: %d of %d units left", wid, len(pending), len(plan.units))
    manager._start(plan)
    return w, pending
