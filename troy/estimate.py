"""How long a run will take, said before it starts (``troy run`` prints it on stderr).

Two lower bounds from the tasks' ``runtime`` hints (seconds; a WfFormat file's recorded
runtimes times ``--time-scale``): the **critical path**, the longest chain of runtimes through
the dependency graph (no number of cores makes the run shorter), and the **work per core**,
the sum of runtime × cores over every task divided by the cores of all pilots (no ordering
makes it shorter). The larger of the two is the estimate. Tasks without a runtime hint
count as 0 s, and the line says how many there are. Start-up, bundling and scheduling
overheads are not counted: the run takes at least this long.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Estimate:
    """The bounds of one workload on ``cores`` cores (seconds; core-seconds for ``work``)."""

    tasks: int
    cores: int
    critical_path_s: float
    work_core_s: float
    unknown: int  # tasks without a runtime hint (counted as 0 s)

    @property
    def work_per_core_s(self) -> float:
        return self.work_core_s / self.cores if self.cores > 0 else 0.0

    @property
    def seconds(self) -> float:
        """The estimate: the larger bound."""
        return max(self.critical_path_s, self.work_per_core_s)

    @property
    def bound(self) -> str:
        """Which bound decides: ``"critical path"`` or ``"work / cores"``."""
        return "critical path" if self.critical_path_s >= self.work_per_core_s \
            else "work / cores"

    def line(self) -> str:
        """One line for stderr."""
        if self.unknown == self.tasks:
            return (f"estimated duration: unknown (none of the {self.tasks} tasks has a "
                    f"runtime hint)")
        path = f"critical path {duration(self.critical_path_s)}"
        work = (f"work / cores {duration(self.work_per_core_s)} ({self.work_core_s:.0f} "
                f"core-s on {self.cores} core{'' if self.cores == 1 else 's'})")
        first, second = (path, work) if self.bound == "critical path" else (work, path)
        text = f"estimated duration: at least {duration(self.seconds)}: {first}; {second}"
        if self.unknown:
            text += (f"; {self.unknown} of {self.tasks} tasks have no runtime hint, "
                     f"counted as 0 s")
        return text


def duration(seconds: float) -> str:
    """``0.25 s``, ``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    if seconds < 10:
        return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def estimate(workload: Any, cores: int) -> Estimate:
    """The bounds of ``workload`` (a planned ``troy.Workload``: cardinality expanded) on
    pilots of ``cores`` cores in all."""
    tasks = workload.tasks
    runtime = {tid: float(t.description.runtime or 0.0) for tid, t in tasks.items()}
    unknown = sum(1 for t in tasks.values() if t.description.runtime is None)
    work = sum(runtime[tid] * t.description.cores for tid, t in tasks.items())
    return Estimate(tasks=len(tasks), cores=cores, critical_path_s=_longest_path(
        workload, runtime), work_core_s=work, unknown=unknown)


def _longest_path(workload: Any, runtime: dict[str, float]) -> float:
    """The longest sum of runtimes along a chain of relations (Kahn's order; the workload
    refuses cycles when relations are added)."""
    indeg = {tid: len(workload.heads(tid)) for tid in runtime}
    finish: dict[str, float] = {}
    ready = [tid for tid, d in indeg.items() if d == 0]
    earliest = dict.fromkeys(runtime, 0.0)
    while ready:
        tid = ready.pop()
        finish[tid] = earliest[tid] + runtime[tid]
        for tail in workload.tails(tid):
            earliest[tail] = max(earliest[tail], finish[tid])
            indeg[tail] -= 1
            if indeg[tail] == 0:
                ready.append(tail)
    return max(finish.values(), default=0.0)
