"""The report of a run: totals, makespan, and one entry per task.

One entry shape for every report that lists tasks (``troy run --report`` under ``tasks``,
the elasticslice demo's under ``troy.tasks``): ``ENTRY_KEYS``. ``start``/``end`` are epoch
seconds or None (a bundled task gets its own member's); ``unit`` names the unit it ran in;
``stdout``/``stderr`` are the kept output files (``troy.output``) relative to ``base`` (the
report's directory), or None.
"""
from __future__ import annotations

import os
from typing import Any

from troy.output import OutputKeeper, member_result

ENTRY_KEYS = ("task", "unit", "pilot", "framework", "state", "start", "end", "cores",
              "error", "stdout", "stderr")


def _relative(path: str | None, base: str | None) -> str | None:
    if path is None:
        return None
    return os.path.relpath(path, base or os.getcwd())


def task_entry(tid: str, task: Any, outputs: OutputKeeper | None = None,
               base: str | None = None) -> dict[str, Any]:
    """The report entry of task ``tid`` (``ENTRY_KEYS``, in that order)."""
    unit = task.units[-1] if task.units else None
    start = end = error = None
    if unit is not None:
        start, end = unit.start, unit.end
        ran = member_result(tid, unit)
        if ran is not None:
            error = ran.error
            if ran is not unit.result:  # a bundle member: its own times
                start, end = ran.start, ran.end
    files = outputs.files(tid) if outputs is not None else None
    return {"task": tid, "unit": unit.id if unit else None,
            "pilot": unit.pilot if unit else None,
            "framework": unit.framework if unit else None,
            "state": task.state.value, "start": start, "end": end,
            "cores": int(task.description.cores), "error": error,
            "stdout": _relative(files.stdout, base) if files else None,
            "stderr": _relative(files.stderr, base) if files else None}


def rebase(entries: list[dict[str, Any]], old: str, new: str) -> list[dict[str, Any]]:
    """``entries`` with their output paths relative to directory ``new`` instead of ``old``
    (the same report written to a second place)."""
    if os.path.abspath(old) == os.path.abspath(new):
        return entries
    return [{**e, **{k: os.path.relpath(os.path.join(old, e[k]), new)
                     for k in ("stdout", "stderr") if e.get(k)}} for e in entries]


def task_entries(workload: Any, outputs: OutputKeeper | None = None,
                 base: str | None = None) -> list[dict[str, Any]]:
    """One ``task_entry`` per task of ``workload``, in its order."""
    return [task_entry(tid, task, outputs, base) for tid, task in workload.tasks.items()]


def build_report(workload: Any, state: Any, wall: float, *,
                 outputs: OutputKeeper | None = None, base: str | None = None,
                 started: float | None = None) -> dict[str, Any]:
    """The report of ``troy run``: totals, makespan, units/s, ``started`` (epoch seconds,
    when given: the run's start, before its first task) and ``tasks`` (the entries)."""
    entries = task_entries(workload, outputs, base)
    units = {e["unit"] for e in entries if e["unit"] is not None}
    starts = [e["start"] for e in entries if e["start"] is not None]
    ends = [e["end"] for e in entries if e["end"] is not None]
    makespan = max(ends) - min(starts) if starts and ends else 0.0
    count = {s: sum(1 for e in entries if e["state"] == s)
             for s in ("DONE", "FAILED", "CANCELED")}
    return {"state": state.value, "tasks_total": len(entries), "tasks_done": count["DONE"],
            "tasks_failed": count["FAILED"], "tasks_canceled": count["CANCELED"],
            "units_total": len(units), "makespan_s": round(makespan, 6),
            "wall_s": round(wall, 6),
            **({"started": started} if started is not None else {}),
            "units_per_s": round(len(units) / makespan, 3) if makespan > 0 else 0.0,
            "tasks": entries}
