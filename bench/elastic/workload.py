"""The work of a simulated campaign: WfFormat workflows, as tasks with arrival times.

Workflows are read by Troy's own loader (:func:`troy.workload.files.load_workload`, the one
``troy run`` uses), so a task's cores and runtime are what Troy would run. A campaign
submits every workflow of a wave at the wave's time; the lower bound of its makespan is the
larger of the critical path (counted from each workflow's arrival) and the work divided by
the peak cores (counted from each wave: the work arriving at or after a wave cannot finish
before the wave's time plus that work over the peak cores).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from troy.workload.files import load_workload

ROOT = Path(__file__).resolve().parents[2]
# ../shared next to the project (as the issue names it); a clone has the same files here:
WORKFLOW_DIRS = (ROOT.parent / "shared" / "workloads" / "wfinstances",
                 ROOT / "examples" / "workflows")


@dataclass(frozen=True)
class SimTask:
    """One unit of work: ``cores`` busy for ``runtime`` seconds once its parents are done and
    its workflow has arrived."""

    uid: str
    cores: int
    runtime: float
    parents: tuple[str, ...]
    arrival: float


def workflow_files() -> list[Path]:
    """The WfFormat instances: the shared wfinstances folder, else examples/workflows."""
    for folder in WORKFLOW_DIRS:
        files = sorted(folder.glob("*.json"))
        if files:
            return files
    raise FileNotFoundError("no WfFormat workflows in " + ", ".join(map(str, WORKFLOW_DIRS)))


def load_tasks(path: Path, *, prefix: str, arrival: float, time_scale: float,
               max_cores: int) -> list[SimTask]:
    """The tasks of one WfFormat file, ids prefixed (one campaign may hold it twice)."""
    workload = load_workload(path, time_scale=time_scale, max_cores=max_cores)
    out = []
    for uid, task in workload.tasks.items():
        d = task.description
        out.append(SimTask(f"{prefix}{uid}", max(1, int(d.cores)), float(d.runtime or 0.0),
                           tuple(sorted(f"{prefix}{p}" for p in workload.heads(uid))), arrival))
    return out


def campaign(files: Sequence[Path], waves: Iterable[float], *, copies: int = 1,
             time_scale: float, max_cores: int) -> list[SimTask]:
    """``copies`` of every workflow of ``files`` submitted at each time of ``waves``."""
    loaded = {f: load_tasks(f, prefix="", arrival=0.0, time_scale=time_scale,
                            max_cores=max_cores) for f in files}
    tasks: list[SimTask] = []
    for w, at in enumerate(waves):
        for c in range(copies):
            for f, base in loaded.items():
                pre = f"w{w}.{c}:{f.stem}:"
                tasks += [SimTask(pre + t.uid, t.cores, t.runtime,
                                  tuple(pre + p for p in t.parents), float(at)) for t in base]
    return tasks


def critical_path(tasks: Sequence[SimTask]) -> float:
    """The latest finish with unlimited cores: arrival plus the longest chain of runtimes."""
    by_id = {t.uid: t for t in tasks}
    finish: dict[str, float] = {}
    for t in topological(tasks):
        start = max([t.arrival, *(finish[p] for p in t.parents if p in by_id)])
        finish[t.uid] = start + t.runtime
    return max(finish.values(), default=0.0)


def work_bound(tasks: Sequence[SimTask], peak_cores: int) -> float:
    """The latest of (a wave's time + the work arriving from then on / ``peak_cores``)."""
    best = 0.0
    for at in sorted({t.arrival for t in tasks}):
        work = sum(t.cores * t.runtime for t in tasks if t.arrival >= at)
        best = max(best, at + work / max(peak_cores, 1))
    return best


def lower_bound(tasks: Sequence[SimTask], peak_cores: int) -> float:
    return max(critical_path(tasks), work_bound(tasks, peak_cores))


def topological(tasks: Sequence[SimTask]) -> list[SimTask]:
    """Parents before children (Kahn's order; the loader has already refused cycles)."""
    by_id = {t.uid: t for t in tasks}
    pending = {t.uid: sum(1 for p in t.parents if p in by_id) for t in tasks}
    children: dict[str, list[str]] = {}
    for t in tasks:
        for p in t.parents:
            children.setdefault(p, []).append(t.uid)
    ready = [uid for uid, n in pending.items() if n == 0]
    out: list[SimTask] = []
    while ready:
        uid = ready.pop()
        out.append(by_id[uid])
        for c in children.get(uid, ()):
            pending[c] -= 1
            if pending[c] == 0:
                ready.append(c)
    return out
