"""Dask's adaptive target on CloudLab: how fast a jump becomes a worker, and how often it flaps.

    .venv/bin/python bench/bench_adaptive.py [--quick]

Two figures (issue 21):

1. **In the box**: the time from a jump in Dask's adaptive target (a burst of tasks submitted
   to a ``CloudLabCluster`` under ``adapt(minimum=1, maximum=2)`` with one node) to the first
   task running on the new node's worker, with the cluster's defaults (intervals, policy) and
   the emulator's boot delay stated (:data:`BOOT_DELAY`); what is left after the boot delay
   is this project's machinery (manager cycle, AddNodes, tarball, enrolment, Dask join).
2. **By simulation** (``bench/elastic``'s virtual clock, no sleeping): one hour of a bursty
   Dask load (bursts of short one-core tasks at random times, seeded), nodes that boot in
   :data:`SIM_BOOT` seconds, the same trace under (a) ``CloudLabCluster.adapt``: Dask's own
   target as demand through the manager's real policy (``decide``) with the cluster's
   default policy (add cooldown 1 s, delete cooldown 5 s, idle timeout 60 s, one node given
   back per decision, a decision every 2 s) and (b) Dask's ``Adaptive`` with its defaults
   (every 1 s; scale up at once; a worker closed once recommended for closing 3 times in a
   row; target duration 5 s). Reported: direction changes of the node count per hour (an add
   after a give-back or the reverse), adds, give-backs, node-hours, and the tasks' mean wait.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from elastic.policies import Ours, idle_nodes  # noqa: E402
from elastic.sim import Action, SimConfig, Simulation, View  # noqa: E402
from elastic.tenants import Steady  # noqa: E402
from elastic.workload import SimTask  # noqa: E402

from elasticslice.managers.policy import PolicyConfig  # noqa: E402
from troy.frameworks.dask.framework import scheduler_workers  # noqa: E402

log = logging.getLogger(__name__)
HOUR = 3600.0
BOOT_DELAY = 1.0        # the box's boot delay for figure 1 (seconds)
SIM_BOOT = 120.0        # node boot time in the simulation (seconds)
MAX_NODES = 8
TARGET_DURATION = 5.0   # Dask's default distributed.adaptive.target-duration


# ---------------------------------------------------------------- the simulation ---------
def bursty_trace(seed: int = 21, hour: float = HOUR) -> list[SimTask]:
    """Bursts of 20-400 one-core tasks of 1-15 s, 30 s to 6 minutes apart."""
    rng = random.Random(seed)
    tasks, now, n = [], 0.0, 0
    while now < hour:
        for _ in range(rng.randint(20, 400)):
            n += 1
            tasks.append(SimTask(f"t{n}", 1, rng.uniform(1.0, 15.0), (), now))
        now += rng.uniform(30.0, 360.0)
    return tasks


def dask_target(view: View) -> int:
    """``Scheduler.adaptive_target`` in workers (nodes): the cores for the queued and running
    work over the target duration, capped by the tasks' count, per node's cores."""
    running = sum(n.cores for n in view.nodes for _ in n.running)
    occupancy = view.queued_work + running * TARGET_DURATION
    cores = min(math.ceil(occupancy / TARGET_DURATION), view.queued_cores + view.running_cores)
    return math.ceil(cores / view.cores_per_node)


@dataclass
class Steps:
    """The policy's own node-count steps (+1 an add, -1 a give-back), in time order."""

    steps: list[tuple[float, int]] = field(default_factory=list)

    def record(self, now: float, action: Action) -> Action:
        if action.delete:
            self.steps.append((now, -1))
        if action.add:
            self.steps.append((now, 1))
        return action

    def changes(self) -> int:
        out, last = 0, 0
        for _, step in self.steps:
            out += bool(last and step != last)
            last = step
        return out


@dataclass
class OursAdapt(Ours):
    """``CloudLabCluster.adapt``: Dask's target (nodes) as the demand, the manager's policy."""

    name: str = "CloudLabCluster.adapt"
    interval: float = 2.0
    order: str = "fifo"   # a Dask user's tasks: Dask's scheduler places them, not Troy's
    placement: str = "best_fit"
    steps: Steps = field(default_factory=Steps)

    def observed(self, view: View) -> Any:
        import dataclasses
        return dataclasses.replace(super().observed(view),
                                   demand_cores=dask_target(view) * view.cores_per_node)

    def decide(self, view: View) -> Action:
        return self.steps.record(view.now, super().decide(view))


@dataclass
class DaskAdaptiveDefaults:
    """``distributed.deploy.Adaptive`` with its defaults: every 1 s; up at once; a worker
    closed once it was recommended for closing ``wait_count`` (3) times in a row."""

    maximum: int
    minimum: int = 1
    wait_count: int = 3
    name: str = "dask Adaptive (defaults)"
    interval: float = 1.0
    drains: bool = False
    order: str = "fifo"
    placement: str = "best_fit"
    close_counts: dict[str, int] = field(default_factory=dict)
    steps: Steps = field(default_factory=Steps)

    def initial_nodes(self, config: SimConfig) -> int:
        return self.minimum

    def decide(self, view: View) -> Action:
        target = max(self.minimum, min(self.maximum, dask_target(view)))
        held = len(view.nodes)
        if target > held:
            self.close_counts.clear()
            return self.steps.record(view.now, Action(add=target - held))
        candidates = idle_nodes(view)[:max(0, held - target)]
        self.close_counts = {uid: self.close_counts.get(uid, 0) + 1 for uid in candidates}
        close = tuple(uid for uid, count in self.close_counts.items()
                      if count >= self.wait_count)
        for uid in close:
            del self.close_counts[uid]
        return self.steps.record(view.now, Action(delete=close))


def simulate_flapping(seed: int = 21, hour: float = HOUR) -> dict[str, dict[str, float]]:
    """Policy name -> its figures on :func:`bursty_trace` (``hour`` seconds of bursts)."""
    tasks = bursty_trace(seed, hour)
    config = SimConfig(total_nodes=200, cores_per_node=8, max_nodes=MAX_NODES,
                       boot_delay=SIM_BOOT, tick=1.0, horizon=3 * HOUR)
    def ours(**changes: float) -> PolicyConfig:
        return PolicyConfig(**{**dict(maxthreshold=MAX_NODES, minthreshold=1,
                                      enable_delete=True, idle_timeout=60.0, add_cooldown=1.0,
                                      delete_cooldown=5.0, max_add_per_cycle=MAX_NODES,
                                      max_delete_per_cycle=1), **changes})
    slower = OursAdapt(ours(delete_cooldown=60.0))
    slower.name = "CloudLabCluster.adapt, delete_cooldown 60 s"
    out = {}
    for policy in (OursAdapt(ours()), slower, DaskAdaptiveDefaults(MAX_NODES)):
        sim = Simulation(config, tasks, Steady("none", config.total_nodes, load=0.0), policy)
        waits: list[float] = []
        place = sim._place

        def placing(sim: Simulation = sim) -> None:  # each task's wait, when it starts
            before = {uid for n in sim.nodes.values() for uid in n.running}
            place()
            for n in sim.nodes.values():
                for uid, start in n.running.items():
                    if uid not in before and start == sim.now:
                        waits.append(sim.now - sim.tasks[uid].arrival)
        sim._place = placing  # type: ignore[method-assign]
        result = sim.run()
        assert result.finished, f"{policy.name}: the trace did not finish"
        hours = max(result.makespan, hour) / HOUR
        out[policy.name] = {"direction_changes_per_hour": policy.steps.changes() / hours,
                            "adds": float(result.adds), "gives_back": float(result.gives_back),
                            "node_hours": result.node_hours,
                            "mean_wait_s": sum(waits) / len(waits) if waits else 0.0}
    return out


# ---------------------------------------------------------------- the box ----------------
def _pilot_image(emu_dir: Path) -> str:
    from elasticslice.emulator.images import PILOT_IMAGE
    from elasticslice.emulator.setup import load_config
    cfg = load_config(emu_dir)
    return f"urn:publicid:IDN+{cfg.domain}+image+{cfg.project}//{PILOT_IMAGE}"


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s")
        time.sleep(0.02)


def measure_jump(repeats: int) -> list[float]:
    """Seconds from a burst's submission (Dask's target jumps from 1 to 2 nodes) to its
    first task running on the second node's worker, ``repeats`` times on one cluster."""
    from dask.distributed import Client

    from elasticslice.dask import CloudLabCluster
    from elasticslice.emulator import EmulatorServer, init_emulator

    def task(i: int) -> tuple[str, float]:
        import time as t
        from distributed import get_worker
        started = t.time()
        t.sleep(0.5)
        return str(get_worker().name), started

    with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as tmp:
        root = Path(tmp)
        emu_dir = init_emulator(root / "emu", port=0)
        os.environ["ELASTICSLICE_CREDENTIAL_CACHE_DIR"] = str(root / "cache")
        emu = EmulatorServer(emu_dir, port=0, boot_delay=BOOT_DELAY)
        emu.start()
        spans = []
        try:
            with CloudLabCluster(config=emu_dir / "elasticslice.conf", state_dir=root / "dask",
                                 maximum=2, disk_image=_pilot_image(emu_dir),
                                 node_python="python3", idle_timeout=2.0) as cluster, \
                    Client(cluster) as client:
                cluster.adapt(minimum=1, maximum=2)
                for _ in range(repeats):
                    _wait(lambda: cluster.nodes() == 1
                          and len(scheduler_workers(client)) == 1, 300,
                          "cluster of one node")
                    first = next(iter(scheduler_workers(client).values()))["name"]
                    submitted = time.time()
                    futures = client.map(task, range(200), pure=False)
                    done = client.gather(futures)
                    starts = [at for name, at in done if name != first]
                    if not starts:  # all ran on the first node: the jump needed none
                        log.warning("the burst ended before a second node joined")
                        continue
                    spans.append(min(starts) - submitted)
                    del futures
        finally:
            emu.stop()
    return spans


# ---------------------------------------------------------------- the harness -----------
def run(quick: bool = False) -> dict[str, Any]:
    repeats = 1 if quick else 3
    spans = measure_jump(repeats)
    sim = simulate_flapping()
    ours, dask = sim["CloudLabCluster.adapt"], sim["dask Adaptive (defaults)"]
    slow = sim["CloudLabCluster.adapt, delete_cooldown 60 s"]
    median = sorted(spans)[len(spans) // 2] if spans else float("nan")
    f: dict[str, Any] = {"jump_to_task_s": spans, "jump_to_task_median_s": median,
                         "box_boot_delay_s": BOOT_DELAY, "simulation": sim,
                         "sim_boot_s": SIM_BOOT, "repeats": repeats}
    f["table"] = [
        (f"Dask target jump -> a task on the new node's worker, box (boot delay "
         f"{BOOT_DELAY:g} s; median of {len(spans)})",
         f"{median:.1f} s ({', '.join(f'{x:.1f}' for x in spans)})"),
        (f"direction changes per hour, 1 h bursty Dask load (boot {SIM_BOOT:g} s): "
         "CloudLabCluster.adapt / Dask Adaptive defaults",
         f"{ours['direction_changes_per_hour']:.0f} / {dask['direction_changes_per_hour']:.0f}"),
        ("same trace: node-hours, mean task wait: adapt / Adaptive",
         f"{ours['node_hours']:.1f} h, {ours['mean_wait_s']:.0f} s / "
         f"{dask['node_hours']:.1f} h, {dask['mean_wait_s']:.0f} s"),
        ("same trace, adapt with the policy's delete_cooldown at 60 s: direction changes per "
         "hour, node-hours, mean task wait",
         f"{slow['direction_changes_per_hour']:.0f}, {slow['node_hours']:.1f} h, "
         f"{slow['mean_wait_s']:.0f} s"),
    ]
    return f


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one jump, not three")
    parser.add_argument("--sim-only", action="store_true", help="the simulation only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.sim_only:
        print(json.dumps(simulate_flapping(), indent=2))
        return 0
    figures = run(quick=args.quick)
    for what, value in figures["table"]:
        print(f"{what}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
