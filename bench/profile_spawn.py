#!/usr/bin/env python
"""Where a bundled ``/bin/true`` member's CPU goes: its own process, or what starts it.

Runs ``/bin/true`` from 2 processes as ``bench_troy``'s spawn floor does (``Pool(2)``,
``subprocess.call``) and as Troy's bundles do (``troy.execution.execute`` of bundles of
250, two at a time: the C runner), and splits each member's CPU with the kernel's own
accounting (``getrusage``): the member's process, from its start to its exit (the
spawner's children), and the spawner (the process that starts, watches and reaps it).
What the member's own process costs, no spawner can take off: it is the floor that
``bench_troy``'s bundled figures are measured against, and what bounds them.

Writes ``bench/results/spawn_true_member_cpu.svg`` and prints the same figures; not part
of ``make bench`` (it runs in about 10 s): ``python bench/profile_spawn.py [--members N] [--out SVG]``.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pool
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent)]
OUT = BENCH / "results" / "spawn_true_member_cpu.svg"
BUNDLE = 250


def _cpu() -> tuple[float, float]:
    """(this process's CPU, its reaped children's) in seconds."""
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _true(_: object = None) -> int:
    return subprocess.call(["/bin/true"])


def _worker_cpu(_: object) -> tuple[int, float, float]:
    time.sleep(0.01)   # let the other worker take the next one
    return (os.getpid(), *_cpu())


def _pool_cpu(pool: Pool) -> tuple[float, float]:
    """The pool's workers' CPU (their own, their children's), summed over the workers."""
    last: dict[int, tuple[float, float]] = {}
    for pid, me, kids in pool.map(_worker_cpu, range(40), chunksize=1):
        last[pid] = max(last.get(pid, (0.0, 0.0)), (me, kids))
    if len(last) != 2:
        raise SystemExit("profile_spawn: a pool worker did not answer; run it again")
    return sum(v[0] for v in last.values()), sum(v[1] for v in last.values())


def floor(members: int) -> tuple[float, float, float]:
    """(spawner's CPU, members' CPU, wall) per member, µs / s: the spawn floor."""
    with Pool(2) as pool:
        pool.map(_true, range(20))
        before = _pool_cpu(pool)
        start = time.perf_counter()
        pool.map(_true, range(members), chunksize=16)
        wall = time.perf_counter() - start
        after = _pool_cpu(pool)
    return ((after[0] - before[0]) / members * 1e6, (after[1] - before[1]) / members * 1e6,
            members / wall)


def troy_bundles(members: int) -> tuple[float, float, float]:
    """The same for Troy's C runner: bundles of 250, two run at a time by one process."""
    from troy import ComputeUnitDescription as CUD
    from troy.execution import execute, native_problem
    if native_problem():
        raise SystemExit(f"profile_spawn: the C runner is not built: {native_problem()}")
    bundle = CUD(bundle=[CUD(executable="/bin/true")] * BUNDLE)
    n = members // BUNDLE
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: execute(bundle), range(2)))
        before, start = _cpu(), time.perf_counter()
        results = list(pool.map(lambda _: execute(bundle), range(n)))
        wall, after = time.perf_counter() - start, _cpu()
    if not all(r.ok for r in results):
        raise SystemExit("profile_spawn: a bundle failed")
    done = n * BUNDLE
    return ((after[0] - before[0]) / done * 1e6, (after[1] - before[1]) / done * 1e6,
            done / wall)


def plot(figures: dict[str, tuple[float, float, float]], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 3.0))
    for y, (name, (spawner, member, rate)) in enumerate(figures.items()):
        ax.barh(y, member, color="tab:blue", label="the member's own process (exec to exit)"
                if y == 0 else None)
        ax.barh(y, spawner, left=member, color="tab:grey",
                label="the spawner (starts, watches, reaps it)" if y == 0 else None)
        ax.text(member + spawner + 8, y, f"{member:.0f} + {spawner:.0f} µs; {rate:,.0f} /s",
                va="center", fontsize=8)
    ax.set_yticks(range(len(figures)), list(figures), fontsize=8)
    ax.set_xlim(0, 1.35 * max(m + s for s, m, _ in figures.values()))
    ax.set_xlabel("CPU per /bin/true member, µs (getrusage), and members per second "
                  "on 2 cores", fontsize=8)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    ax.set_title("Where a bundled /bin/true member's CPU goes", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=5000,
                        help="/bin/true runs per case (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="the plot (default: bench/results/spawn_true_member_cpu.svg)")
    args = parser.parse_args()
    figures = {"spawn floor: Pool(2), subprocess.call": floor(args.members),
               "Troy bundles of 250, 2 at a time (C runner)": troy_bundles(args.members)}
    for name, (spawner, member, rate) in figures.items():
        print(f"{name}: member {member:.0f} µs + spawner {spawner:.0f} µs of CPU; "
              f"{rate:,.0f} members/s")
    plot(figures, args.out)
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
