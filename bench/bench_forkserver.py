"""What a local Dask pilot's worker costs to start: forked (the fork server) or afresh.

    .venv/bin/python bench/bench_forkserver.py [--workers 8] [--rounds 3] [--quick]

Each round, in a process of its own: a scheduler process, then ``--workers`` worker
processes started at once and waited for until each reports its address, then all stopped.
Rounds alternate forked (``troy.frameworks.dask.forkserver``) and afresh
(``TROY_DASK_FORKSERVER=0``); the figures are medians. CPU is everything the round's
process and all it started used (the fork server and its children included), so the
scheduler's start and the round's own imports are in both. ``run(quick)`` is the harness's
entry (``python -m bench --only forkserver``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

ROUND = textwrap.dedent("""
    import json, resource, sys, tempfile, time
    from troy.frameworks.dask import forkserver
    from troy.frameworks.dask.processes import AgentProcess
    n = int(sys.argv[1])
    d = tempfile.mkdtemp(prefix="bench-forkserver-")
    sched = AgentProcess(["scheduler", "1.0"], d + "/s.log")
    address = sched.read_address(120)
    forkserver.hold()
    t = time.perf_counter()
    workers = [AgentProcess(["worker", address, f"p{i}", "1", "1", "tag"], f"{d}/w{i}.log",
                            forked=True) for i in range(n)]
    joined = [w.read_address(120) for w in workers]
    wall = time.perf_counter() - t
    for w in workers:
        w.stop()
    forkserver.let_go()
    sched.stop()
    use = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    print(json.dumps({"ok": all(joined), "wall": wall,
                      "cpu": sum(u.ru_utime + u.ru_stime for u in use)}))
""")

FIGURES = {"forkserver_workers_cpu_s_forked": "CPU of a round, workers forked",
           "forkserver_workers_cpu_s_fresh": "CPU of a round, workers afresh",
           "forkserver_workers_join_s_forked": "all workers joined, forked",
           "forkserver_workers_join_s_fresh": "all workers joined, afresh"}


def _round(workers: int, forked: bool) -> dict[str, Any]:
    env = dict(os.environ, TROY_DASK_FORKSERVER="1" if forked else "0",
               PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", ROUND, str(workers)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if not result["ok"]:
        raise RuntimeError("a worker did not start")
    return result


def measure(workers: int, rounds: int) -> dict[str, float]:
    seen: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for _ in range(rounds):
        for forked in (True, False):
            seen[forked].append(_round(workers, forked))
    figures = {}
    for forked, name in ((True, "forked"), (False, "fresh")):
        figures[f"forkserver_workers_cpu_s_{name}"] = statistics.median(
            r["cpu"] for r in seen[forked])
        figures[f"forkserver_workers_join_s_{name}"] = statistics.median(
            r["wall"] for r in seen[forked])
    return figures


def run(quick: bool = False) -> dict[str, Any]:
    figures: dict[str, Any] = {"workers": 4 if quick else 8, "rounds": 1 if quick else 3}
    figures.update(measure(figures["workers"], figures["rounds"]))
    figures["table"] = [(f"{FIGURES[k]} ({figures['workers']} workers)", f"{v:.2f} s")
                        for k, v in figures.items() if k in FIGURES]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 workers, 1 round")
    args = parser.parse_args()
    workers, rounds = (4, 1) if args.quick else (args.workers, args.rounds)
    for key, value in measure(workers, rounds).items():
        print(f"{FIGURES[key] + f' ({workers} workers)':<48} {value:8.2f} s")


if __name__ == "__main__":
    main()
