"""Bundling: packing many short tasks into one compute unit (seed 001 allows it).

Every unit costs a framework round trip (scheduling, a worker hop, a state update); for
tasks that run a few milliseconds that overhead dominates. A bundle unit runs its members
one after another where it lands, each with its own result, so a thousand ``/bin/true``
tasks become a few dozen units.

Policy (``bundle`` option of the WorkloadManager, default from the session config):

- ``False`` / ``0`` / ``None``: one unit per task.
- ``"auto"``: a task is *short* if its ``runtime`` hint (else its ``walltime``) is at most
  ``threshold`` seconds (default 1.0). Tasks without a hint are never bundled. Short
  one-core tasks with the same set of head tasks (so no relation links two members, and the
  bundle becomes ready at once) are packed into bundles of
  ``min(256, ceil(n / (4 * cores)), 10 * threshold / hint)`` members, with ``cores`` the
  overlay's cores: at least four bundles per core keep every core busy to the end.
- an int ``N`` > 1: every one-core task, short or not, in bundles of up to ``N`` (still
  grouped by head set).

Bundles of fewer than two tasks are not made. This is a pure function of the tasks.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

from troy.errors import BadParameter
from troy.workload.task import Task

BundleMode = Literal["auto"] | int | bool | None
MAX_BUNDLE = 256


def check_mode(mode: object) -> BundleMode:
    if mode in (None, False, "auto") or (isinstance(mode, int) and not isinstance(mode, bool)
                                         and mode >= 0):
        return mode  # type: ignore[return-value]
    if mode is True:
        return "auto"
    raise BadParameter(f"bundle: expected 'auto', an integer >= 0 or false, got {mode!r}")


def _hint(task: Task) -> float | None:
    d = task.description
    return d.runtime if d.runtime is not None else d.walltime


def plan_bundles(tasks: Sequence[Task], heads: Callable[[str], set[str]], mode: BundleMode,
                 threshold: float = 1.0, cores: int = 1) -> list[list[Task]]:
    """Group ``tasks`` into units: each inner list becomes one unit (bundled if > 1)."""
    mode = check_mode(mode)
    if not mode:
        return [[t] for t in tasks]
    groups: dict[frozenset[str], list[Task]] = {}
    singles: list[list[Task]] = []
    for t in tasks:
        d = t.description
        eligible = d.cores == 1
        if mode == "auto":
            hint = _hint(t)
            eligible = eligible and hint is not None and hint <= threshold
        if eligible:
            groups.setdefault(frozenset(heads(t.id)), []).append(t)
        else:
            singles.append([t])
    out = list(singles)
    for members in groups.values():
        if isinstance(mode, int):
            size = mode
        else:
            size = min(MAX_BUNDLE, math.ceil(len(members) / (4 * max(1, cores))))
            longest = max((_hint(t) or 0.0) for t in members)
            if longest > 0:
                size = min(size, max(1, int(10 * threshold / longest)))
        if size < 2:
            out.extend([t] for t in members)
            continue
        n = math.ceil(len(members) / size)
        # balanced chunks: sizes differ by at most one
        base, extra = divmod(len(members), n)
        i = 0
        for k in range(n):
            step = base + (1 if k < extra else 0)
            out.append(members[i:i + step])
            i += step
    return out
