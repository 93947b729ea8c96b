"""Deadline-aware drains on real Dask node agents joined over mutual TLS.

    .venv/bin/python bench/bench_drain.py [--quick]

Node agents (``python -m troy.frameworks.dask node``, as CloudLab nodes run them) join a
``dask`` framework over TLS with certificates from a CA made here; ``drain_pilot`` is called
as a revocation notice arrives (no emulator: the notice is the call).

Revocation, for notices of 10 s and 60 s (safety margin 5 s): a doomed node of 2 cores runs
a short unit (2 s hint) and a long one, with four more queued behind them; a survivor of 8
cores is idle. Measured from the call: until nothing new can start on the doomed node (goal < 1 s:
and no unit started there afterwards); until it holds no unit (finished or requeued; goal:
the slack before the deadline is at least the margin); until every requeued unit runs on the
survivor (goal < 5 s); units lost (goal 0).

Throughput: 4 nodes of 2 cores are kept fed with 0.5 s units; units completed per second
with all of them, then in a window starting when 1 (25%) and then 2 (50%) of them are
drained with a 10 s notice, against what the survivors carry (the all-nodes rate per core
times the surviving cores; goal >= 95%).

A slow CM (bench/slowcm.py): the pilots manager on the emulator while AddNodes takes 30 s,
then while AddNodes answers BUSY and the client backs off; two busy nodes are revoked (15 s
notices), the second during the replacement's AddNodes. Per case: the notices' answer
times as the CM saw them (p50 / p99; goal < 200 ms), from the notice until nothing new can
start on the doomed pilot (and units started there afterwards), how the reclamations ended
(goal: early, 0 units lost).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import troy  # noqa: E402
import slowcm  # noqa: E402  (bench/slowcm.py)
from elasticslice.rpc.pki import issue_certificate, make_ca  # noqa: E402
from table import print_table  # noqa: E402  (bench/table.py)
from troy import ComputeUnitDescription as CUD  # noqa: E402
from troy import State  # noqa: E402
from troy.frameworks.dask import DaskFramework  # noqa: E402
from troy.frameworks.dask.guard import CONTROL, WORKER  # noqa: E402
from troy.frameworks.dask.tls import DaskTLS  # noqa: E402

MARGIN = 5.0


class Cluster:
    """A TLS ``dask`` framework and the node agents that joined it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = make_ca("bench_drain CA", key_type="ec")
        self.fw = DaskFramework("bench", sandbox=str(root / "sb"), adopt_workers=True,
                                tls=self.tls("control", CONTROL))
        self.fw.start()
        self.agents: list[subprocess.Popen] = []

    def tls(self, name: str, role: str) -> DaskTLS:
        """Certificates for ``name`` with its role (the scheduler's guard refuses a peer
        whose certificate has none)."""
        cert, key = issue_certificate(*self.ca, name, hostnames=["localhost"],
                                      ips=["127.0.0.1"], role=role, key_type="ec")
        files = [self.root / f"{name}{suffix}" for suffix in ("-ca.pem", ".pem", ".key")]
        for path, data in zip(files, (self.ca[0], cert, key)):
            path.write_bytes(data)
        return DaskTLS(*map(str, files))

    def node(self, name: str, cores: int) -> troy.Pilot:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
        env.update(self.tls(name, WORKER).environ())
        self.agents.append(subprocess.Popen(
            [sys.executable, "-m", "troy.frameworks.dask", "node", self.fw.scheduler_address,
             str(cores), name], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.root / f"{name}.log", "wb")))
        return until(lambda: (p := self.fw.find_pilot(name)) is not None
                     and p.state is State.RUNNING and p, 120, f"node {name}")

    def close(self) -> None:
        self.fw.close()
        for a in self.agents:
            a.terminate()
        for a in self.agents:
            try:
                a.wait(30)
            except subprocess.TimeoutExpired:
                a.kill()


def until(predicate: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > end:
            raise RuntimeError(f"bench_drain: timed out waiting for {what}")
        time.sleep(0.01)
    return value


def sleeper(seconds: float, hint: float) -> CUD:
    return CUD(executable="/bin/sleep", arguments=[str(seconds)], runtime=hint)


def revocation(notice: float, quick: bool) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bench-drain-"))
    c = Cluster(root)
    try:
        doomed, survivor = c.node(f"doomed-{notice:g}", 2), c.node(f"survivor-{notice:g}", 8)
        long_s = 8.0 if quick else 20.0   # fits a 60 s notice, not a 10 s one
        fw = c.fw
        first = [fw.submit_unit(sleeper(2, 2), doomed), fw.submit_unit(sleeper(long_s, long_s),
                                                                       doomed)]
        until(lambda: all(u.state is State.RUNNING for u in first), 60, "units running")
        queued = [fw.submit_unit(sleeper(1, 1), doomed) for _ in range(4)]
        # what the node holds (sent on its unit channel, or its Dask tasks): 2 run, 4 wait
        until(lambda: len(fw._processing(doomed.native_id)) == 6, 60,
              "units queued on the doomed node")
        emptied = threading.Event()
        t0 = time.time()
        plan = fw.drain_pilot(doomed, t0 + notice, margin=MARGIN,
                              on_empty=lambda p: emptied.set())
        units = first + queued
        for u in units:
            u.wait(notice + 120)
        emptied.wait(notice + 60)
        moved = set(plan.requeued + plan.late_requeued)
        starts_elsewhere = [u.start for u in units if u.id in moved and u.pilot == survivor.id]
        held = set(plan.kept) | moved   # what the drain found there: handed out before
        late_starts = [u for u in units if u.pilot == doomed.id and u.start and u.id not in held
                       and u.start >= (plan.dispatch_stopped_at or t0)]
        lost = sum(u.state is not State.DONE for u in units) + fw.unit_stats().lost
        return {
            "stop_s": (plan.dispatch_stopped_at or float("nan")) - t0,
            "empty_s": (plan.emptied_at or float("nan")) - t0,
            "slack_s": t0 + notice - (plan.emptied_at or float("inf")),
            "elsewhere_s": max(starts_elsewhere) - t0 if len(starts_elsewhere) == len(moved)
            else float("nan"),
            "kept": len(plan.kept), "requeued": len(moved), "lost": lost,
            "late_starts": len(late_starts),
        }
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


class Feeder:
    """Keeps ``depth`` units of ``seconds`` outstanding; counts completions by time."""

    def __init__(self, fw: DaskFramework, depth: int, seconds: float) -> None:
        self.fw, self.depth, self.seconds = fw, depth, seconds
        self.done: list[float] = []
        self.units: list[troy.ComputeUnit] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stop.is_set():
            live = sum(u.state not in (State.DONE, State.FAILED, State.CANCELED)
                       for u in self.units[-4 * self.depth:])
            for _ in range(self.depth - live):
                u = troy.ComputeUnit(sleeper(self.seconds, self.seconds))
                u.add_callback(lambda unit, st: st is State.DONE and self.done.append(time.time()))
                self.units.append(self.fw.submit_unit(u))
            time.sleep(0.02)

    def rate(self, t0: float, t1: float) -> float:
        return sum(t0 <= t < t1 for t in list(self.done)) / (t1 - t0)


def throughput(quick: bool) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="bench-drain-tp-"))
    c = Cluster(root)
    window = 6.0 if quick else 10.0
    try:
        pilots = [c.node(f"n{i}", 2) for i in range(4)]
        feeder = Feeder(c.fw, depth=16, seconds=0.5)
        time.sleep(3)   # warm up
        t0 = time.time()
        time.sleep(window)
        per_core = feeder.rate(t0, time.time()) / 8
        out = {"full_per_s": per_core * 8}
        for frac, doomed in (("25", pilots[:1]), ("50", pilots[1:2])):
            t0 = time.time()
            for p in doomed:
                c.fw.drain_pilot(p, t0 + 10, margin=MARGIN)
            time.sleep(window)
            alive = sum(p.size for p in pilots if not p.draining)
            out[f"rate_{frac}"] = feeder.rate(t0, time.time())
            out[f"kept_{frac}_pct"] = 100 * out[f"rate_{frac}"] / (per_core * alive)
        feeder.stop.set()
        feeder.thread.join(10)
        for u in feeder.units:
            u.wait(60)
        out["tp_lost"] = sum(u.state is not State.DONE for u in feeder.units) \
            + c.fw.unit_stats().lost
        return out
    finally:
        c.close()
        shutil.rmtree(root, ignore_errors=True)


def run(quick: bool = False) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    table: list[tuple[str, str]] = []
    for notice in (10.0, 60.0):
        r = revocation(notice, quick)
        n = f"{notice:g}s"
        figures.update({f"{k}_{n}": v for k, v in r.items()})
        table += [
            (f"{n} notice: no new dispatch after (goal < 1 s)",
             f"{r['stop_s'] * 1000:.0f} ms, {r['late_starts']} new unit(s) started after"),
            (f"{n} notice: pilot empty after / slack (goal >= {MARGIN:g} s)",
             f"{r['empty_s']:.1f} s / {r['slack_s']:.1f} s "
             f"({r['kept']} kept, {r['requeued']} requeued)"),
            (f"{n} notice: requeued units running elsewhere (goal < 5 s)",
             f"{r['elsewhere_s']:.2f} s"),
            (f"{n} notice: units lost (goal 0)", f"{r['lost']}"),
        ]
    tp = throughput(quick)
    figures.update(tp)
    table += [
        ("throughput, all 4 nodes", f"{tp['full_per_s']:.1f} units/s"),
        ("throughput kept, 25% revoked (goal >= 95%)",
         f"{tp['kept_25_pct']:.0f}% of what the survivors carry"),
        ("throughput kept, 50% revoked (goal >= 95%)",
         f"{tp['kept_50_pct']:.0f}% of what the survivors carry"),
        ("throughput run: units lost (goal 0)", f"{tp['tp_lost']}"),
    ]
    for case in slowcm.CASES:
        r = slowcm.slow_cm(case, quick)
        figures.update({f"{case}_cm_{k}": v for k, v in r.items()})
        table += slowcm.rows(case, r)
    figures["table"] = table
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter units and windows")
    parser.add_argument("--only-slow-cm", action="store_true",
                        help="only the slow-CM cases (AddNodes 30 s, BUSY back-off)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.only_slow_cm:
        table = [row for case in slowcm.CASES
                 for row in slowcm.rows(case, slowcm.slow_cm(case, args.quick))]
        print_table(table)
        return 0
    print_table(run(args.quick)["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
