"""The elastic slice manager's cost: CPU and memory per full cycle, reaction to demand.

    .venv/bin/python bench/bench_manager.py [--quick] [--sizes 10,100,1000,5000] [--cycles 7]

The emulator runs in ANOTHER process (`elasticslice emulator serve`), so the manager's CPU
time (``time.process_time`` of this process) excludes the CM's work and all waiting on it.
For each slice size N: the manager grows a slice to N nodes, waits until they are ready,
then runs full cycles (``manage_once``: every method, in order) and reports the median CPU
time per cycle (min and max too: the first cycle after the wait reads everything anew, and
the one after it often still finds a change, so the median of 3 was often such a cycle; of
7, it is a steady one), the Python memory one full cycle allocates at its peak
(tracemalloc, a separate cycle) and the process's max RSS so far. Then, with the daemon
running (all intervals an hour long), the demand jumps and we time how long until the
AddNodes call is made (the seed's default: up to 300 s). Beside each timed cycle, the
CPU of parsing the slice's manifest as the CM resolves it then: issue 36's yardstick (the
cycle at most 1.5 times that, round by round), the same nodes in the form a cycle would
otherwise have to read (it reads SliverStatus, a struct, and advertisements' counts).
Prints a table; exits 0.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticslice.config import load_config  # noqa: E402
from elasticslice.emulator import init_emulator  # noqa: E402
from elasticslice.managers import (SimpleElasticSliceHelper,  # noqa: E402
                                   SimpleElasticSliceManager)
from elasticslice.managers.policy import PolicyConfig  # noqa: E402
from elasticslice.rpc.client import ProtoGeniServer  # noqa: E402
from elasticslice.rpc.transport import RetryPolicy  # noqa: E402
from elasticslice.rspec import parse  # noqa: E402
from table import print_table  # noqa: E402  (bench/table.py; this folder is on sys.path)

HOUR = {m: 3600.0 for m in SimpleElasticSliceManager.DEF_ORDER}


class TimedHelper(SimpleElasticSliceHelper):
    """Notes when AddNodes arguments are asked for (right before the AddNodes call)."""

    asked_at: float | None = None

    def get_add_args(self, count: int = 1) -> dict[str, dict[str, Any]]:
        if self.asked_at is None:
            self.asked_at = time.perf_counter()
        return super().get_add_args(count)


def serve(root: Path, nodes: int) -> tuple[subprocess.Popen[bytes], Path]:
    inventory = root / "inventory.ini"
    count = min(10000, nodes + max(50, nodes // 2))  # the emulator's inventory bound
    inventory.write_text("[inventory]\ndefault_hardware_type = bench\nimages = UBUNTU22-64-STD\n"
                         f"\n[bench]\ncount = {count}\ncores = 8\nmemory = 65536\n"
                         "prefix = bn\n")
    d = init_emulator(root / "emu")
    errors = root / "emulator.err"
    with errors.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "elasticslice.cli", "emulator", "serve", "--dir", str(d),
             "--port", "0", "--inventory", str(inventory), "--boot-delay", "0.2"],
            stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 120
    while not (d / "server.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            last = (errors.read_text(errors="replace").strip().splitlines() or ["no output"])
            raise SystemExit(f"the emulator did not start ({nodes} nodes): {last[-1]}")
        time.sleep(0.1)
    json.loads((d / "server.json").read_text())
    return proc, d


def manager_for(d: Path, root: Path, size: int, helper: SimpleElasticSliceHelper,
                **options: Any) -> SimpleElasticSliceManager:
    os.environ["ELASTICSLICE_CREDENTIAL_CACHE_DIR"] = str(root / "cache")
    server = ProtoGeniServer(load_config(d / "elasticslice.conf"),
                             retry=RetryPolicy(attempts=10, base_delay=0.05, max_delay=0.5))
    policy = PolicyConfig(add_cooldown=0.0, max_add_per_cycle=size, percent_available_minimum=0.0)
    return SimpleElasticSliceManager(server, maxthreshold=size, percent_available_minimum=0.0,
                                     helper=helper, policy=policy,
                                     state_dir=root / "state", **options)


@dataclass(frozen=True)
class CycleCost:
    cpu: list[float]         # seconds per full cycle (manage_once)
    wall: list[float]
    steady: list[float]      # seconds per cycle without the daily update_all
    peak_kib: float          # tracemalloc peak of one full cycle
    rss_mib: float           # the process's max RSS so far
    ready: int               # nodes ready when the cycles were timed
    parse: list[float]       # seconds of CPU parsing the sliver's manifest, one per cycle


def cycle_cost(size: int, cycles: int) -> CycleCost:
    with tempfile.TemporaryDirectory(prefix="bench-manager-") as tmp:
        root = Path(tmp)
        proc, d = serve(root, size)
        try:
            manager = manager_for(d, root, size, SimpleElasticSliceHelper(num_pcs=1))
            manager.manage_once()
            # The emulator boots nodes one by one (a few ms each, much more on a loaded
            # machine): beyond 1,000 nodes we wait at most 2 minutes, then measure the slice
            # as it is (all nodes in it, some still booting; the figures say how many).
            wait = 900 if size <= 1000 else 120
            deadline = time.monotonic() + wait
            while True:  # poll less often in big slices: each poll is a full SliverStatus
                nodes = manager.state.nodes()
                if len(nodes) == size and all(n.state == "ready" for n in nodes):
                    break
                if time.monotonic() > deadline:
                    if len(nodes) == size and size > 1000:
                        break
                    ready = sum(1 for n in nodes if n.state == "ready")
                    raise SystemExit(f"{size} nodes did not become ready in {wait} s "
                                     f"({ready} ready)")
                time.sleep(max(0.2, size / 1000))
                manager.update_sliver_status()
            ready = sum(1 for n in manager.state.nodes() if n.state == "ready")
            manifest = manager.cms[0].resolve()["manifest"].encode()  # the slice's, as it is
            samples, walls, steady, parses = [], [], [], []
            for _ in range(cycles):
                cpu, wall = time.process_time(), time.perf_counter()
                errors = manager.manage_once()
                samples.append(time.process_time() - cpu)
                walls.append(time.perf_counter() - wall)
                if any(errors.values()):
                    raise SystemExit(f"cycle failed: {errors}")
                cpu = time.process_time()   # the yardstick, beside it
                parse(manifest)
                parses.append(time.process_time() - cpu)
            for _ in range(cycles):  # the daemon's usual cycle: update_all is daily
                cpu = time.process_time()
                for name in manager.DEF_ORDER:
                    if name != "update_all" and not manager.cycle.run_method(name):
                        raise SystemExit(f"{name} failed")
                steady.append(time.process_time() - cpu)
            tracemalloc.start()
            manager.manage_once()
            peak = tracemalloc.get_traced_memory()[1] / 1024
            tracemalloc.stop()
            manager.close()
            manager.server.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return CycleCost(samples, walls, steady, peak, rss, ready, parses)


def demand_jump(size: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-manager-") as tmp:
        root = Path(tmp)
        proc, d = serve(root, size)
        try:
            helper = TimedHelper(num_pcs=1)
            manager = manager_for(d, root, size, helper, manage_intervals=HOUR)
            manager.set_demand(1)
            manager.start()
            for _ in range(600):  # the first cycle: slice, sliver, availability
                if manager.cycle.methods["set_system_state"].runs:
                    break
                time.sleep(0.05)
            start = time.perf_counter()
            manager.set_demand(size)
            while helper.asked_at is None and time.perf_counter() - start < 60:
                time.sleep(0.001)
            took = (helper.asked_at or time.perf_counter()) - start
            manager.close()
            manager.server.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return took


def run(quick: bool = False, sizes: tuple[int, ...] | None = None,
        cycles: int = 7) -> dict[str, Any]:
    """Figures per slice size (10, 100, 1,000, 5,000 nodes; quick: 10 and 100)."""
    sizes = sizes or ((10, 100) if quick else (10, 100, 1000, 5000))
    out: dict[str, Any] = {}
    rows: list[tuple[str, str]] = []
    for size in sizes:
        cost = cycle_cost(size, cycles)
        cpu, wall = statistics.median(cost.cpu) * 1000, statistics.median(cost.wall) * 1000
        steady = statistics.median(cost.steady) * 1000
        parse_cpu = statistics.median(cost.parse) * 1000
        ratio = statistics.median(c / max(p, 1e-9) for c, p in zip(cost.cpu, cost.parse))
        key = f"{size}_nodes"
        out.update({f"manager_cycle_cpu_ms_{key}": round(cpu, 2),
                    f"manager_cycle_cpu_ms_{key}_min": round(min(cost.cpu) * 1000, 2),
                    f"manager_cycle_cpu_ms_{key}_max": round(max(cost.cpu) * 1000, 2),
                    f"manager_cycle_wall_ms_{key}": round(wall, 2),
                    f"manager_steady_cycle_cpu_ms_{key}": round(steady, 2),
                    f"manager_cycle_peak_python_kib_{key}": round(cost.peak_kib, 1),
                    f"manager_max_rss_mib_after_{key}": round(cost.rss_mib, 1),
                    f"manager_ready_nodes_when_timed_{key}": cost.ready,
                    f"manager_manifest_parse_cpu_ms_{key}": round(parse_cpu, 2),
                    f"manager_cycle_cpu_{size}_over_manifest_parse": round(ratio, 2)})
        booting = "" if cost.ready == size else f", {size - cost.ready} still booting"
        rows.append((f"one full cycle, {size}-node slice{booting}: manager CPU (wall incl. CM)",
                     f"{cpu:8.1f} ms  ({wall:.0f} ms)"))
        rows.append((f"  / parsing that sliver's manifest ({parse_cpu:.1f} ms CPU; goal <= 1.5)",
                     f"{ratio:8.2f} x"))
        rows.append((f"a cycle without the daily update_all, {size}-node slice: CPU",
                     f"{steady:8.1f} ms"))
        rows.append((f"memory, {size}-node slice: peak of one cycle (max RSS so far)",
                     f"{cost.peak_kib / 1024:8.1f} MiB  ({cost.rss_mib:.0f} MiB)"))
    took = demand_jump(10) * 1000
    out["manager_demand_jump_to_addnodes_ms"] = round(took, 2)
    rows.append(("demand jump -> AddNodes call (daemon running, hour-long intervals)",
                 f"{took:8.1f} ms"))
    return {**out, "table": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10- and 100-node slices")
    parser.add_argument("--sizes", default=None, help="e.g. 10,100,1000,5000")
    parser.add_argument("--cycles", type=int, default=7)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None
    print_table(run(args.quick, sizes, args.cycles)["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
