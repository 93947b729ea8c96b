"""The elastic slice manager's own cost: CPU per full cycle, and reaction to a demand jump.

    .venv/bin/python bench/bench_manager.py [--sizes 10,100,1000] [--cycles 3]

The emulator runs in ANOTHER process (`elasticslice emulator serve`), so the manager's CPU
time (``time.process_time`` of this process) excludes the CM's work and all waiting on it.
For each slice size N: the manager grows a slice to N nodes, waits until they are ready,
then runs full cycles (``manage_once``: every method, in order) and reports the median CPU
time per cycle. Then, with the daemon running (all intervals an hour long), the demand jumps
and we time how long until the AddNodes call is made (the seed's default: up to 300 s).
Prints a table; exits 0.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
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
    inventory.write_text("[inventory]\ndefault_hardware_type = bench\nimages = UBUNTU22-64-STD\n"
                         f"\n[bench]\ncount = {nodes * 3 + 50}\ncores = 8\nmemory = 65536\n"
                         "prefix = bn\n")
    d = init_emulator(root / "emu")
    proc = subprocess.Popen(
        [sys.executable, "-m", "elasticslice.cli", "emulator", "serve", "--dir", str(d),
         "--port", "0", "--inventory", str(inventory), "--boot-delay", "0.2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (d / "server.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the emulator did not start")
        time.sleep(0.1)
    json.loads((d / "server.json").read_text())
    return proc, d


def manager_for(d: Path, root: Path, size: int, helper: SimpleElasticSliceHelper,
                **options: Any) -> SimpleElasticSliceManager:
    os.environ["ELASTICSLICE_CREDENTIAL_CACHE_DIR"] = str(root / "cache")
    server = ProtoGeniServer(load_config(d / "elasticslice.conf"),
                             retry=RetryPolicy(attempts=10, base_delay=0.05, max_delay=0.5))
    policy = PolicyConfig(add_cooldown=0.0, max_add_per_cycle=size)
    return SimpleElasticSliceManager(server, maxthreshold=size, helper=helper, policy=policy,
                                     state_dir=root / "state", **options)


def cycle_cpu(size: int, cycles: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-manager-") as tmp:
        root = Path(tmp)
        proc, d = serve(root, size)
        try:
            manager = manager_for(d, root, size, SimpleElasticSliceHelper(num_pcs=1))
            manager.manage_once()
            for _ in range(600):
                nodes = manager.state.nodes()
                if len(nodes) == size and all(n.state == "ready" for n in nodes):
                    break
                time.sleep(0.2)
                manager.update_sliver_status()
            else:
                raise SystemExit(f"{size} nodes did not become ready")
            samples, walls, steady = [], [], []
            for _ in range(cycles):
                cpu, wall = time.process_time(), time.perf_counter()
                errors = manager.manage_once()
                samples.append(time.process_time() - cpu)
                walls.append(time.perf_counter() - wall)
                if any(errors.values()):
                    raise SystemExit(f"cycle failed: {errors}")
            for _ in range(cycles):  # the daemon's usual cycle: update_all is daily
                cpu = time.process_time()
                for name in manager.DEF_ORDER:
                    if name != "update_all" and not manager.cycle.run_method(name):
                        raise SystemExit(f"{name} failed")
                steady.append(time.process_time() - cpu)
            manager.close()
            manager.server.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return (statistics.median(samples), statistics.median(walls),
            statistics.median(steady))


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows: list[tuple[str, str]] = []
    for size in (int(s) for s in args.sizes.split(",")):
        cpu, wall, steady = cycle_cpu(size, args.cycles)
        rows.append((f"one full cycle, {size}-node slice: manager CPU (wall incl. CM)",
                     f"{cpu * 1000:8.1f} ms  ({wall * 1000:.0f} ms)"))
        rows.append((f"a cycle without the daily update_all, {size}-node slice: CPU",
                     f"{steady * 1000:8.1f} ms"))
    took = demand_jump(10)
    rows.append(("demand jump -> AddNodes call (daemon running, hour-long intervals)",
                 f"{took * 1000:8.1f} ms"))
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
