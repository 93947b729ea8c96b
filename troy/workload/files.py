"""Workload files: Troy JSON and WfCommons WfFormat instances, loaded into a ``Workload``.

Troy JSON (``load_workload`` tells the formats apart by their top-level keys)::

    {"tasks": [{"id": "split", "executable": "/bin/sh", "arguments": ["-c", "..."],
                "cores": 1, "walltime": 60, ...any TaskDescription field...},
               {"name": "join", "executable": "/bin/true", "parents": ["split"]}],
     "relations": [["split", "join"], {"head": "split", "tail": "join"}]}

A task's id is ``id``, else ``name``, else ``task.N`` (its position); ``name`` is only a
label otherwise. ``parents`` (a list of ids) inside a task and ``relations`` (pairs or
``{"head", "tail"}`` objects) both add relations: the tail runs after the head is DONE.

WfFormat (https://github.com/wfcommons/WfFormat): schema 1.5 (``workflow.specification
.tasks`` for the graph, ``workflow.execution.tasks`` for what was recorded, joined by task
id) and the older layouts (``workflow.tasks`` or ``workflow.jobs``, with ``runtime`` or
``runtimeInSeconds`` and ``cores``). ``parents`` become relations. A task becomes a unit
that occupies its cores for its recorded runtime times ``time_scale``: ``/bin/sleep
<runtime × time_scale>`` with ``cores`` from the task's ``coreCount`` (or ``cores``;
1 when not recorded, clamped to ``max_cores`` when given) and the scaled runtime as the
task's ``runtime`` hint (so short tasks get bundled).

Any problem is a ``WorkloadFileError`` whose one-line message names the file and the place:
a JSON line and column, a JSON path (``tasks[3].cores``) or a task id. Limits (see
``troy.limits``): at most ``MAX_BYTES`` bytes, ``MAX_TASKS`` tasks after cardinality
expansion; numbers must be finite (``NaN`` and ``Infinity`` are refused where a number is
read); JSON nested deeper than Python's parser allows (about 1,000 levels) is refused.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from troy.descriptions import short_repr
from troy.errors import BadParameter, WorkloadFileError
from troy.limits import MAX_TASKS, is_finite_number
from troy.workload.workload import Relation, Workload

__all__ = ["load_workload", "WorkloadFileError"]

MAX_BYTES = 256 * 1024 * 1024


def load_workload(path: str | os.PathLike[str], *, time_scale: float = 1.0,
                  max_cores: int | None = None) -> Workload:
    """Read a Troy JSON or WfFormat file into a new (DESCRIBED) ``Workload``."""
    where = str(path)
    if isinstance(time_scale, bool) or not isinstance(time_scale, (int, float)) \
            or not math.isfinite(time_scale) or time_scale < 0:
        raise BadParameter(f"time_scale: expected a finite number >= 0, got {time_scale!r}")
    try:
        size = Path(path).stat().st_size
        if size > MAX_BYTES:
            raise WorkloadFileError(f"{where}: {size} bytes is more than {MAX_BYTES}")
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except OSError as err:
        raise WorkloadFileError(f"{where}: cannot read: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise WorkloadFileError(f"{where}: not UTF-8 text (byte {err.start})") from err
    except json.JSONDecodeError as err:
        raise WorkloadFileError(f"{where}: line {err.lineno} column {err.colno}: "
                                f"invalid JSON: {err.msg}") from err
    except RecursionError:
        raise WorkloadFileError(f"{where}: JSON nested too deeply (more levels of lists "
                                f"and objects than Python's JSON parser allows)") from None
    if not isinstance(data, dict):
        raise WorkloadFileError(f"{where}: expected a JSON object at the top, "
                                f"got {type(data).__name__}")
    try:
        if "workflow" in data:
            return _Loader(where).wfformat(data, float(time_scale), max_cores)
        if "tasks" in data:
            return _Loader(where).troy(data)
    except RecursionError:  # a value nested ~1,000 deep, in a message or a check
        raise WorkloadFileError(f"{where}: a value is nested too deeply") from None
    raise WorkloadFileError(f"{where}: neither Troy JSON (no 'tasks' key) nor WfFormat "
                            f"(no 'workflow' key)")


class _Loader:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, place: str, message: str) -> WorkloadFileError:
        return WorkloadFileError(f"{self.where}: {place}: {message}")

    def _list(self, value: Any, place: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(place, f"expected a list, got {type(value).__name__}")
        return value

    def _tasks(self, value: Any, place: str) -> list[Any]:
        tasks = self._list(value, place)
        if len(tasks) > MAX_TASKS:
            raise self.fail(place, f"{len(tasks)} tasks is more than the limit of {MAX_TASKS}")
        return tasks

    def _build(self, specs: list[tuple[str, str, dict[str, Any]]],
               edges: list[tuple[str, str, str]], tasks_place: str) -> Workload:
        """``specs``: (id, place, TaskDescription fields); ``edges``: (head, tail, place)."""
        if not specs:
            raise self.fail(tasks_place, "no tasks")
        w = Workload()
        total = 0
        for uid, place, fields in specs:
            if uid in w.tasks:
                raise self.fail(place, f"duplicate task id {uid!r}")
            try:
                w.add_task(fields, uid=uid)
            except BadParameter as err:
                raise self.fail(f"{place} (task {uid!r})", str(err)) from err
            total += w.tasks[uid].description.cardinality
            if total > MAX_TASKS:  # checked as we go: the sum never runs away
                raise self.fail(f"{place} (task {uid!r})",
                                f"cardinality {w.tasks[uid].description.cardinality} brings "
                                f"the workload to at least {total} tasks after expansion, "
                                f"more than the limit of {MAX_TASKS}")
        rels, seen = [], set()
        for head, tail, place in edges:
            for end in (head, tail):
                if not isinstance(end, str):
                    raise self.fail(place, f"expected a task id (a string), "
                                           f"got {short_repr(end)}")
                if end not in w.tasks:
                    raise self.fail(place, f"unknown task {short_repr(end)}")
            if (head, tail) not in seen:  # a parent listed twice is one relation
                seen.add((head, tail))
                rels.append(Relation(head, tail))
        if rels:
            try:
                w.add_relation(rels)
            except BadParameter as err:
                raise self.fail("relations", str(err)) from err
        return w

    # -- Troy JSON ---------------------------------------------------------------------
    def troy(self, data: dict[str, Any]) -> Workload:
        unknown = sorted(set(data) - {"tasks", "relations", "name", "description"})
        if unknown:
            raise self.fail("top level", f"unknown key(s) {', '.join(unknown)}; known: "
                            "tasks, relations, name, description")
        specs, edges = [], []
        for i, task in enumerate(self._tasks(data["tasks"], "tasks")):
            place = f"tasks[{i}]"
            if not isinstance(task, Mapping):
                raise self.fail(place, f"expected an object, got {type(task).__name__}")
            fields = dict(task)
            uid = fields.pop("id", None) or fields.get("name") or f"task.{i}"
            fields.pop("name", None)
            if not isinstance(uid, str):
                raise self.fail(f"{place}.id", f"expected a string, got {short_repr(uid)}")
            for j, parent in enumerate(self._list(fields.pop("parents", []),
                                                  f"{place}.parents")):
                edges.append((parent, uid, f"{place}.parents[{j}]"))
            if "function" in fields:
                raise self.fail(f"{place}.function", "a JSON file cannot name a callable")
            specs.append((uid, place, fields))
        for i, rel in enumerate(self._list(data.get("relations", []), "relations")):
            place = f"relations[{i}]"
            if isinstance(rel, list) and len(rel) == 2:
                head, tail = rel
            elif isinstance(rel, Mapping) and set(rel) == {"head", "tail"}:
                head, tail = rel["head"], rel["tail"]
            else:
                raise self.fail(place, 'expected [head, tail] or {"head": .., "tail": ..}')
            edges.append((head, tail, place))
        w = self._build(specs, edges, "tasks")
        for uid, place, fields in specs:  # (after the checks of fields and relations)
            if fields.get("executable") is None:
                raise self.fail(f"{place} (task {uid!r})", "no executable")
        return w

    # -- WfFormat ----------------------------------------------------------------------
    def wfformat(self, data: dict[str, Any], time_scale: float,
                 max_cores: int | None) -> Workload:
        wf = data["workflow"]
        if not isinstance(wf, Mapping):
            raise self.fail("workflow", "expected an object")
        if "specification" in wf:  # schema 1.5
            spec = wf["specification"]
            tasks = self._tasks(spec.get("tasks") if isinstance(spec, Mapping) else None,
                                "workflow.specification.tasks")
            execution = wf.get("execution") or {}
            recorded = self._list(execution.get("tasks", []), "workflow.execution.tasks")
            base = "workflow.specification.tasks"
        else:
            key = "tasks" if "tasks" in wf else "jobs"
            tasks = self._tasks(wf.get(key), f"workflow.{key}")
            recorded = []
            base = f"workflow.{key}"
        runs: dict[str, Mapping[str, Any]] = {}
        for i, r in enumerate(recorded):
            if not isinstance(r, Mapping) or not isinstance(r.get("id"), str):
                raise self.fail(f"workflow.execution.tasks[{i}]", "expected an object with an id")
            runs[r["id"]] = r
        specs, edges = [], []
        for i, task in enumerate(tasks):
            place = f"{base}[{i}]"
            if not isinstance(task, Mapping):
                raise self.fail(place, f"expected an object, got {type(task).__name__}")
            uid = task.get("id") or task.get("name")
            if not isinstance(uid, str) or not uid:
                raise self.fail(place, "task without an id or name")
            run = {**task, **runs.get(uid, {})}
            seconds = self._number(run, ("runtimeInSeconds", "runtime"), f"{place} ({uid})")
            cores = self._cores(run, f"{place} ({uid})")
            if max_cores is not None:
                cores = min(cores, max_cores)
            scaled = round(seconds * time_scale, 6)
            specs.append((uid, place, {"executable": "/bin/sleep",
                                       "arguments": [f"{scaled:.6f}".rstrip("0").rstrip(".")
                                                     or "0"],
                                       "cores": cores, "runtime": scaled}))
            for j, parent in enumerate(self._list(task.get("parents", []), f"{place}.parents")):
                if isinstance(parent, Mapping):  # very old layouts: {"name": ...}
                    parent = parent.get("id") or parent.get("name")
                edges.append((parent, uid, f"{place}.parents[{j}] (task {uid!r})"))
        return self._build(specs, edges, base)

    def _number(self, run: Mapping[str, Any], keys: tuple[str, ...], place: str) -> float:
        for k in keys:
            if k in run:
                v = run[k]
                if not is_finite_number(v) or v < 0:
                    raise self.fail(f"{place}.{k}", f"expected a finite number >= 0, "
                                                    f"got {short_repr(v)}")
                return float(v)
        return 0.0

    def _cores(self, run: Mapping[str, Any], place: str) -> int:
        for k in ("coreCount", "cores"):
            if k in run and run[k] is not None:
                v = run[k]
                if not is_finite_number(v) or v < 1:
                    raise self.fail(f"{place}.{k}", f"expected a finite number >= 1, "
                                                    f"got {short_repr(v)}")
                return int(round(v))
        return 1
