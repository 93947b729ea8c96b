#!/usr/bin/env python
"""Troy's throughput and latency against its peers, side by side in one run.

Every engine gets the same 2 workers (a 2-core Troy pilot on Dask or ``local``, raw Dask on
that pilot's scheduler and worker, a Parsl HighThroughputExecutor block of 2 workers, a pool
of 2 processes for the spawn floor). All are started first; then each round measures every
engine once, one after the other (so engines alternate), and each figure is the median of
the rounds (3; 1 with ``--quick``) with its min and max. Ratios are taken within a round
(Troy against the peer measured next to it) and then summarised the same way.

- null units: a Python no-op; ``true``: ``/bin/true``, a real process each;
- units/s (tasks/s): a burst submitted at once, until the last result is in;
- bundled: bundles of 250 ``/bin/true`` members made directly, and the whole pipeline
  (``execute_workload``: planner, workload manager with bundling, unit service);
- the spawn floor: ``/bin/true`` from a pool of 2 processes (forked before anything else
  starts), measured before the bundled Troy figures and again after each: a bundled figure's
  ratio to the floor is to the mean of the floor just before and just after it (BRACKETS);
  the thread floor: from 2 threads of this process (where ``local`` runs units);
- every throughput figure starts with a full garbage collection: the engines share this
  process, and a full collection that the objects of the figures before made due fell in
  the next one otherwise (120 ms in a 1.7 s figure; one in 4-5 whole-pipeline runs, each
  adding 70,000 objects the collector tracks); one that a figure's own work makes due
  counts in it, as in any run;
- latency: back-to-back round trips of one null unit, median ms of the round;
- memory kept: the Python memory (tracemalloc) a ``local`` session still holds per task
  after two more whole-pipeline workloads ran and were let go, bundled and unbundled (what
  a session running workload after workload grows by: its unit service keeps every unit
  and its result for ``list_units()``; the tasks and workloads go).

``python bench/bench_troy.py [--quick]``; ``python -m bench --only troy``.
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing import Pool
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import troy  # noqa: E402
from troy import ComputeUnitDescription as CUD  # noqa: E402
from troy.frameworks.dask import DaskFramework  # noqa: E402
from troy.overlay import OverlayManager  # noqa: E402

CORES = 2
BUNDLE = 250
RESULTS = BENCH / "results"
log = logging.getLogger("bench.troy")


@dataclass(frozen=True)
class Sizes:
    null: int      # units per null burst
    true: int      # units per /bin/true burst (unbundled)
    bundled: int   # /bin/true tasks per bundled run
    lat: int       # round trips per latency figure
    rounds: int


def sizes(quick: bool) -> Sizes:
    return Sizes(400, 200, 1000, 30, 1) if quick else Sizes(2000, 1000, 5000, 150, 3)


def noop(_: object = None) -> None:
    return None


def true_proc(_: object = None) -> int:
    return subprocess.call(["/bin/true"])


def burst(fw: Any, cuds: list[CUD]) -> float:
    t0 = time.perf_counter()
    units = [fw.submit_unit(c) for c in cuds]
    for u in units:
        u.wait()
    dt = time.perf_counter() - t0
    bad = [u for u in units if u.state is not troy.State.DONE]
    if bad:
        raise RuntimeError(f"{len(bad)} units not DONE, e.g. {bad[0].id}: {bad[0].state}")
    return dt


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def latency_ms(once: Callable[[], object], n: int) -> float:
    times = [timed(once) for _ in range(n)]
    return statistics.median(times) * 1000


class Engines(ExitStack):
    """Every engine of the comparison, started once and kept for all rounds."""

    def __init__(self) -> None:
        super().__init__()
        self.dask: Any = None        # Troy's dask framework (worker-saturation inf)
        self.dask_default: Any = None  # a second cluster at Dask's default saturation
        self.local: Any = None
        self.overlays: dict[str, troy.Overlay] = {}
        self.sessions: dict[str, troy.Session] = {}
        self.parsl: Any = None
        self.pool: Any = None
        self.threads: Any = None

    def __enter__(self) -> Engines:
        super().__enter__()
        # the spawn floor's pool first: forked from a process not yet holding the others
        self.pool = self.enter_context(Pool(CORES))
        self.pool.map(true_proc, range(20))
        self.threads = self.enter_context(ThreadPool(CORES))
        for kind in ("dask", "local"):
            session = self.enter_context(troy.Session())
            fw = session.add_framework(kind)
            overlay = troy.Overlay([{"size": CORES, "framework": kind}])
            OverlayManager(session).manage_overlay(overlay)
            self.callback(overlay.cancel)
            self.sessions[kind], self.overlays[kind] = session, overlay
            setattr(self, kind, fw)
        self.dask_default = DaskFramework("bench-default", worker_saturation=1.1)
        self.dask_default.start()
        self.callback(self.dask_default.close)
        self.dask_default.submit_pilot(troy.PilotDescription(size=CORES)).wait_running(60)
        from parsl_peer import ParslPeer  # bench/ is on sys.path
        self.parsl = self.enter_context(ParslPeer(CORES))
        for fw in (self.dask, self.dask_default, self.local):  # warm the workers
            burst(fw, [CUD(function=noop)] * 100)
        return self


def pipeline(e: Engines, kind: str, n: int, bundle: object) -> float:
    """Seconds for ``execute_workload`` to run n ``/bin/true`` tasks on the running overlay."""
    w = troy.Workload()
    w.add_task([{"executable": "/bin/true", "runtime": 0.001}] * n)
    t0 = time.perf_counter()
    state = troy.execute_workload(e.sessions[kind], w, e.overlays[kind], bundle=bundle)
    dt = time.perf_counter() - t0
    if state is not troy.State.DONE:
        raise RuntimeError(f"execute_workload on {kind} ended {state}")
    return dt


def bundles(n: int) -> list[CUD]:
    return [CUD(bundle=[CUD(executable="/bin/true")] * BUNDLE) for _ in range(n // BUNDLE)]


def dask_map(fw: Any, fn: Callable[[object], object], n: int) -> float:
    c = fw.client
    return timed(lambda: c.gather(c.map(fn, range(n), pure=False)))


def throughputs(e: Engines, s: Sizes) -> list[tuple[str, int, Callable[[], float]]]:
    """(figure name, tasks, a callable returning seconds), in the order a round runs them:
    each Troy figure next to the peers it is compared with."""
    null, true = [CUD(function=noop)] * s.null, [CUD(executable="/bin/true")] * s.true
    half = s.bundled // 2

    def floor() -> float:
        return timed(lambda: e.pool.map(true_proc, range(s.bundled), chunksize=16))
    return [
        ("dask_map_null_tasks_per_s", s.null, lambda: dask_map(e.dask, noop, s.null)),
        ("troy_dask_null_units_per_s", s.null, lambda: burst(e.dask, null)),
        ("dask_map_default_saturation_null_tasks_per_s", s.null,
         lambda: dask_map(e.dask_default, noop, s.null)),
        ("parsl_htex_null_tasks_per_s", s.null, lambda: e.parsl.burst("null", s.null)),
        ("troy_local_null_units_per_s", s.null, lambda: burst(e.local, null)),
        ("dask_map_true_tasks_per_s", s.true, lambda: dask_map(e.dask, true_proc, s.true)),
        ("troy_dask_true_units_per_s", s.true, lambda: burst(e.dask, true)),
        ("dask_map_default_saturation_true_tasks_per_s", s.true,
         lambda: dask_map(e.dask_default, true_proc, s.true)),
        ("parsl_htex_python_app_true_tasks_per_s", s.true,
         lambda: e.parsl.burst("python_app", s.true)),
        ("parsl_htex_bash_app_true_tasks_per_s", s.true,
         lambda: e.parsl.burst("bash_app", s.true)),
        ("troy_local_true_units_per_s", s.true, lambda: burst(e.local, true)),
        ("spawn_floor_threads_true_tasks_per_s", s.bundled,
         lambda: timed(lambda: e.threads.map(true_proc, range(s.bundled), chunksize=16))),
        (FLOOR, s.bundled, floor),
        ("troy_dask_bundled_true_tasks_per_s", s.bundled,
         lambda: burst(e.dask, bundles(s.bundled))),
        (after("troy_dask_bundled_true_tasks_per_s"), s.bundled, floor),
        ("troy_local_bundled_true_tasks_per_s", s.bundled,
         lambda: burst(e.local, bundles(s.bundled))),
        (after("troy_local_bundled_true_tasks_per_s"), s.bundled, floor),
        ("troy_pipeline_dask_bundled_true_tasks_per_s", s.bundled,
         lambda: pipeline(e, "dask", s.bundled, "auto")),
        (after("troy_pipeline_dask_bundled_true_tasks_per_s"), s.bundled, floor),
        ("troy_pipeline_local_bundled_true_tasks_per_s", s.bundled,
         lambda: pipeline(e, "local", s.bundled, "auto")),
        (after("troy_pipeline_local_bundled_true_tasks_per_s"), s.bundled, floor),
        ("troy_pipeline_dask_unbundled_true_tasks_per_s", half // 2,
         lambda: pipeline(e, "dask", half // 2, False)),
        ("troy_pipeline_local_unbundled_true_tasks_per_s", half // 2,
         lambda: pipeline(e, "local", half // 2, False)),
    ]


def latencies(e: Engines) -> list[tuple[str, Callable[[], object]]]:
    c = e.dask.client
    return [("dask_latency_ms", lambda: c.submit(noop, pure=False).result()),
            ("troy_dask_latency_ms", lambda: e.dask.submit_unit(CUD(function=noop)).wait()),
            ("parsl_htex_latency_ms", e.parsl.once),
            ("troy_local_latency_ms", lambda: e.local.submit_unit(CUD(function=noop)).wait())]


#: the spawn floor, measured before the bundled Troy figures and again after each of them
FLOOR = "spawn_floor_true_tasks_per_s"
#: the bundled Troy figures, each between two measurements of the floor (see BRACKETS)
BUNDLED = ("troy_dask_bundled_true_tasks_per_s", "troy_local_bundled_true_tasks_per_s",
           "troy_pipeline_dask_bundled_true_tasks_per_s",
           "troy_pipeline_local_bundled_true_tasks_per_s")


def after(figure: str) -> str:
    """The name of the floor measured right after ``figure`` (a figure of its own, not a
    throughput of the chart: no ``_per_s``)."""
    return f"spawn_floor_true_after_{figure.removesuffix('_true_tasks_per_s')}"


#: figure -> the floor measurements just before and just after it: its ratio to the floor
#: is taken against their mean, which cancels a drift of the machine's speed over the few
#: seconds between them (the floor moved 2,678-3,751/s between the rounds of one run, more
#: than the 10 % its goal allows; each is 1.5-2 s)
BRACKETS = {figure: (FLOOR if i == 0 else after(BUNDLED[i - 1]), after(figure))
            for i, figure in enumerate(BUNDLED)}

# ratio name -> (numerator, denominators: the best of them in the same round; the floor:
# the mean of the floors around the numerator, BRACKETS)
RATIOS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ratio_troy_dask_over_dask_map_null": (
        "troy_dask_null_units_per_s",
        ("dask_map_null_tasks_per_s", "dask_map_default_saturation_null_tasks_per_s")),
    "ratio_troy_dask_over_dask_map_true": (
        "troy_dask_true_units_per_s",
        ("dask_map_true_tasks_per_s", "dask_map_default_saturation_true_tasks_per_s")),
    "ratio_troy_dask_over_parsl_true": (
        "troy_dask_true_units_per_s",
        ("parsl_htex_python_app_true_tasks_per_s", "parsl_htex_bash_app_true_tasks_per_s")),
    "ratio_troy_dask_over_parsl_null": ("troy_dask_null_units_per_s",
                                        ("parsl_htex_null_tasks_per_s",)),
}
RATIOS["ratio_troy_pipeline_dask_unbundled_over_dask_map_true"] = (
    "troy_pipeline_dask_unbundled_true_tasks_per_s",
    ("dask_map_true_tasks_per_s", "dask_map_default_saturation_true_tasks_per_s"))
# what bounds the bundled figures against Parsl: the floor itself, over Parsl's best
RATIOS["ratio_spawn_floor_over_parsl"] = (
    FLOOR, ("parsl_htex_python_app_true_tasks_per_s", "parsl_htex_bash_app_true_tasks_per_s"))
RATIOS["ratio_troy_local_bundled_true_over_thread_floor"] = (
    "troy_local_bundled_true_tasks_per_s", ("spawn_floor_threads_true_tasks_per_s",))
for _kind in ("dask", "local"):
    for _path in ("pipeline_" + _kind, _kind):
        RATIOS[f"ratio_troy_{_path}_bundled_true_over_floor"] = (
            f"troy_{_path}_bundled_true_tasks_per_s", ("spawn_floor_true_tasks_per_s",))
        RATIOS[f"ratio_troy_{_path}_bundled_true_over_parsl"] = (
            f"troy_{_path}_bundled_true_tasks_per_s",
            ("parsl_htex_python_app_true_tasks_per_s", "parsl_htex_bash_app_true_tasks_per_s"))


def summarise(name: str, values: list[float], figures: dict[str, Any]) -> None:
    figures[name] = statistics.median(values)
    figures[name + "_min"], figures[name + "_max"] = min(values), max(values)


def kept_bytes_per_task(e: Engines, n: int, bundle: object, runs: int = 2) -> float:
    """Python memory the ``local`` session still holds per task after ``runs`` more
    whole-pipeline workloads of ``n`` tasks ran and were let go (after a first one: what
    first use allocates once is not counted)."""
    pipeline(e, "local", n, bundle)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(runs):
            pipeline(e, "local", n, bundle)
        time.sleep(0.2)   # the store's writer and the last callbacks
        gc.collect()
        return (tracemalloc.get_traced_memory()[0] - before) / (runs * n)
    finally:
        tracemalloc.stop()


def measure(quick: bool) -> dict[str, list[float]]:
    s = sizes(quick)
    samples: dict[str, list[float]] = {}
    with Engines() as e:
        for r in range(s.rounds):
            log.info("round %d of %d", r + 1, s.rounds)
            for name, n, fn in throughputs(e, s):
                gc.collect()   # (none owed by the figures before it: see the docstring)
                samples.setdefault(name, []).append(n / fn())
            for name, once in latencies(e):
                once()
                samples.setdefault(name, []).append(latency_ms(once, s.lat))
        # once, after the rounds (tracemalloc slows what it watches)
        samples["troy_local_kept_bytes_per_task_bundled"] = [
            kept_bytes_per_task(e, s.bundled, "auto")]
        samples["troy_local_kept_bytes_per_task_unbundled"] = [
            kept_bytes_per_task(e, s.bundled // 5, False)]
    return samples


def figures_of(samples: dict[str, list[float]], rounds: int) -> dict[str, Any]:
    figures: dict[str, Any] = {"rounds": rounds, "workers": CORES, "bundle_size": BUNDLE}
    for name, values in samples.items():
        summarise(name, values, figures)
    def peer(top: str, peers: tuple[str, ...], i: int) -> float:
        if peers == (FLOOR,) and top in BRACKETS:
            return statistics.mean(samples[f][i] for f in BRACKETS[top])
        return max(samples[p][i] for p in peers)

    for name, (top, peers) in RATIOS.items():
        summarise(name, [samples[top][i] / peer(top, peers, i) for i in range(rounds)],
                  figures)
    summarise("troy_dask_latency_over_dask_ms",
              [t - d for t, d in zip(samples["troy_dask_latency_ms"],
                                     samples["dask_latency_ms"])], figures)
    figures["goal_bundled_true_at_least_90pct_of_floor"] = \
        figures["ratio_troy_pipeline_local_bundled_true_over_floor"] >= 0.9
    figures["goal_bundled_true_at_least_3x_parsl"] = \
        figures["ratio_troy_pipeline_local_bundled_true_over_parsl"] >= 3.0
    figures["goal_unbundled_at_least_1x_dask_map"] = min(
        figures["ratio_troy_dask_over_dask_map_null"],
        figures["ratio_troy_dask_over_dask_map_true"]) >= 1.0
    figures["goal_latency_within_1ms_of_dask"] = figures["troy_dask_latency_over_dask_ms"] <= 1.0
    summarise("troy_dask_latency_over_parsl_ms",
              [t - p for t, p in zip(samples["troy_dask_latency_ms"],
                                     samples["parsl_htex_latency_ms"])], figures)
    figures["goal_latency_at_most_parsl"] = figures["troy_dask_latency_over_parsl_ms"] <= 0.0
    figures["goal_pipeline_unbundled_at_least_1x_dask_map"] = \
        figures["ratio_troy_pipeline_dask_unbundled_over_dask_map_true"] >= 1.0
    figures["goal_dask_bundled_true_at_least_90pct_of_floor"] = min(
        figures["ratio_troy_dask_bundled_true_over_floor"],
        figures["ratio_troy_pipeline_dask_bundled_true_over_floor"]) >= 0.9
    return figures


def _fig(figures: dict[str, Any], name: str, unit: str) -> str:
    fmt = "{:,.2f}" if unit in ("x", "ms") else "{:,.0f}"
    lo, hi = fmt.format(figures[name + "_min"]), fmt.format(figures[name + "_max"])
    return f"{fmt.format(figures[name])} {unit} ({lo} .. {hi})"


def table(figures: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for name in figures:
        if name.endswith(("_min", "_max")) or not isinstance(figures[name], float):
            continue
        unit = "ms" if name.endswith("_ms") else "x" if name.startswith("ratio_") else \
            "B" if "_bytes_" in name else "/s"
        rows.append((name, _fig(figures, name, unit)))
    rows += [(name, "met" if ok else "MISSED") for name, ok in figures.items()
             if name.startswith("goal_")]
    return rows


def plot(figures: dict[str, Any], path: Path) -> None:
    """A bar chart of the throughput figures (median, min..max as error bars)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [n for n in figures if n.endswith("_per_s")]
    med = [figures[n] for n in names]
    err = [[m - figures[n + "_min"] for n, m in zip(names, med)],
           [figures[n + "_max"] - m for n, m in zip(names, med)]]
    colours = ["tab:blue" if n.startswith("troy_") else "tab:orange" if n.startswith("dask")
               else "tab:green" if n.startswith("parsl") else "tab:grey" for n in names]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(names) + 1.2))
    ax.barh(range(len(names)), med, xerr=err, color=colours)
    ax.set_yticks(range(len(names)), [n.removesuffix("_per_s") for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("tasks (units) per second, log scale; median of "
                  f"{figures['rounds']} rounds, bars min..max")
    ax.set_title(f"Throughput with {CORES} workers: Troy (blue), Dask (orange), "
                 "Parsl HTEX (green), spawn floor (grey)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run(quick: bool = False) -> dict[str, Any]:
    # Dask and Parsl workers unpickle our functions by reference: let them import this module
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(BENCH.parent), str(BENCH)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    import distributed  # noqa: F401  (configures its loggers on import)
    logging.getLogger("distributed").setLevel(logging.ERROR)  # no worker-loss chatter
    rounds = sizes(quick).rounds
    figures = figures_of(measure(quick), rounds)
    name = "throughput-quick.png" if quick else "throughput.png"  # the README shows the full run's
    plot(figures, RESULTS / name)
    figures["table"] = table(figures)
    figures["plots"] = [name]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small bursts, one round")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from table import print_table
    print_table(run(args.quick)["table"])


if __name__ == "__main__":
    main()
