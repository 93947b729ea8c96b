#!/usr/bin/env python
"""Units/s through a 16-node emulated cluster, against raw Dask on the same 16 workers.

    .venv/bin/python bench/bench_cluster16.py [--quick] [--nodes N]

An :class:`ElasticCluster` (as ``elasticslice run`` makes it: TLS, node agents adopted as
pilots, prefetch 0) on a fresh box (``boot_delay`` :data:`BOOT_DELAY`) holds
:data:`NODES` nodes booted from the pilot image (the agent in the image, ``node_python``).
Once every node's pilot has joined, each round measures, one after the other (so engines
alternate), a burst of ``/bin/true``:

- raw Dask: ``client.map(subprocess.call, ...)`` on the cluster's own client, any worker;
- Troy, direct: units submitted to the cluster's framework at once (late binding);
- Troy, the whole pipeline: ``execute_workload`` of unbundled tasks on the cluster's
  following overlay (planner, workload manager, unit service).

Each figure is the median of the rounds (3; 1 with ``--quick``, which also uses 2 nodes
and small bursts: the smoke test's size), with min and max; ratios are taken within a
round. ``run(quick)`` is the harness's entry (``python -m bench --only cluster16``).
"""
from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import troy  # noqa: E402
from troy import ComputeUnitDescription as CUD  # noqa: E402

from bench_troy import burst  # noqa: E402  (bench/bench_troy.py)
from elasticslice.config import load_config  # noqa: E402
from elasticslice.emulator import EmulatorServer, init_emulator  # noqa: E402
from elasticslice.rpc.client import ProtoGeniServer  # noqa: E402

log = logging.getLogger("bench.cluster16")
NODES = 16
BOOT_DELAY = 0.2   # the box's boot delay (seconds): small, the figure is about units
JOIN_TIMEOUT = 600.0
TRUE = ["/bin/true"]


@dataclass(frozen=True)
class Sizes:
    nodes: int
    burst: int     # /bin/true per burst (each engine)
    rounds: int


def sizes(quick: bool, nodes: int | None = None) -> Sizes:
    s = Sizes(2, 40, 1) if quick else Sizes(NODES, 2000, 3)
    return s if nodes is None else Sizes(nodes, s.burst, s.rounds)


def pilot_image_urn(emu_dir: Path) -> str:
    from elasticslice.emulator.images import PILOT_IMAGE
    from elasticslice.emulator.setup import load_config as load_emulator
    cfg = load_emulator(emu_dir)
    return f"urn:publicid:IDN+{cfg.domain}+image+{cfg.project}//{PILOT_IMAGE}"


class Box16:
    """A box, a client and an ElasticCluster holding ``nodes`` pilot nodes (context)."""

    def __init__(self, root: Path, nodes: int) -> None:
        self.root, self.nodes = root, nodes
        self.emu: Any = None
        self.client: Any = None
        self.cluster: Any = None
        self.joined_s = 0.0

    def __enter__(self) -> Box16:
        from elasticslice.pilots import ElasticCluster
        d = init_emulator(self.root / "emu")
        self.emu = EmulatorServer(d, port=0, boot_delay=BOOT_DELAY)
        self.emu.start()
        try:
            self.client = ProtoGeniServer(load_config(d / "elasticslice.conf"))
            self.cluster = ElasticCluster(
                self.client, self.root / "cluster", minthreshold=self.nodes,
                maxthreshold=self.nodes, idle_timeout=None,
                intervals={"update_sliver_status": 0.2, "add_nodes": 0.5},
                disk_image=pilot_image_urn(d), node_python="python3")
            t0 = time.monotonic()
            self.cluster.start()
            while len(self.cluster.pilots()) < self.nodes:
                if time.monotonic() - t0 > JOIN_TIMEOUT:
                    raise SystemExit(f"only {len(self.cluster.pilots())} of {self.nodes} "
                                     f"pilots joined in {JOIN_TIMEOUT:.0f} s")
                time.sleep(0.1)
            self.joined_s = time.monotonic() - t0
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for close in (lambda: self.cluster and self.cluster.close(),
                      lambda: self.client and self.client.close(),
                      lambda: self.emu and self.emu.stop()):
            try:
                close()
            except Exception:  # the others still close
                log.exception("closing the box")

    @property
    def cores(self) -> int:
        return sum(p.size for p in self.cluster.pilots())


def dask_map(box: Box16, n: int) -> float:
    """Seconds for raw Dask to run n /bin/true on the cluster's workers (any of them)."""
    c = box.cluster.framework.client
    t0 = time.perf_counter()
    codes = c.gather(c.map(subprocess.call, [TRUE] * n, pure=False))
    dt = time.perf_counter() - t0
    if any(codes):
        raise RuntimeError(f"raw Dask: {sum(1 for x in codes if x)} of {n} /bin/true failed")
    return dt


def troy_burst(box: Box16, n: int) -> float:
    """n /bin/true units submitted to the cluster's framework at once (bench_troy's burst)."""
    return burst(box.cluster.framework, [CUD(executable="/bin/true") for _ in range(n)])


def troy_pipeline(box: Box16, n: int) -> float:
    w = troy.Workload()
    w.add_task([{"executable": "/bin/true", "runtime": 0.001}] * n)
    t0 = time.perf_counter()
    state = troy.execute_workload(box.cluster.session, w, box.cluster.overlay(), bundle=False)
    dt = time.perf_counter() - t0
    if state is not troy.State.DONE:
        raise RuntimeError(f"execute_workload ended {state}")
    return dt


ENGINES = [("cluster16_dask_map_true_tasks_per_s", dask_map),
           ("cluster16_troy_true_units_per_s", troy_burst),
           ("cluster16_troy_pipeline_unbundled_true_tasks_per_s", troy_pipeline)]
RATIOS = {"ratio_cluster16_troy_over_dask_map": "cluster16_troy_true_units_per_s",
          "ratio_cluster16_troy_pipeline_over_dask_map":
              "cluster16_troy_pipeline_unbundled_true_tasks_per_s"}


def _summarise(name: str, values: list[float], figures: dict[str, Any]) -> None:
    figures[name] = statistics.median(values)
    figures[name + "_min"], figures[name + "_max"] = min(values), max(values)


def measure(s: Sizes) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cluster16-") as tmp, \
            Box16(Path(tmp), s.nodes) as box:
        troy_burst(box, 4 * s.nodes)   # every pilot has run a unit once
        dask_map(box, 4 * s.nodes)
        for r in range(s.rounds):
            log.info("round %d of %d", r + 1, s.rounds)
            for name, fn in ENGINES:
                samples.setdefault(name, []).append(s.burst / fn(box, s.burst))
        figures: dict[str, Any] = {"cluster16_nodes": s.nodes, "cluster16_cores": box.cores,
                                   "cluster16_rounds": s.rounds, "cluster16_burst": s.burst,
                                   "cluster16_nodes_joined_s": box.joined_s}
    for name, values in samples.items():
        _summarise(name, values, figures)
    base = samples["cluster16_dask_map_true_tasks_per_s"]
    for ratio, top in RATIOS.items():
        _summarise(ratio, [t / b for t, b in zip(samples[top], base)], figures)
    figures["goal_cluster16_troy_at_least_1x_dask_map"] = \
        figures["ratio_cluster16_troy_over_dask_map"] >= 1.0
    return figures


def table(figures: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for name, value in figures.items():
        if name.endswith(("_min", "_max")) or isinstance(value, bool):
            continue
        if name + "_min" in figures:
            fmt = "{:,.2f}" if name.startswith("ratio_") else "{:,.0f}"
            unit = " x" if name.startswith("ratio_") else " /s"
            rows.append((name, f"{fmt.format(value)}{unit} ({fmt.format(figures[name + '_min'])}"
                               f" .. {fmt.format(figures[name + '_max'])})"))
        else:
            rows.append((name, f"{value:,.1f}" if isinstance(value, float) else str(value)))
    rows += [(name, "met" if ok else "MISSED") for name, ok in figures.items()
             if isinstance(ok, bool)]
    return rows


def run(quick: bool = False, nodes: int | None = None) -> dict[str, Any]:
    import distributed  # noqa: F401  (configures its loggers on import)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    figures = measure(sizes(quick, nodes))
    figures["table"] = table(figures)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 nodes, small bursts, 1 round")
    parser.add_argument("--nodes", type=int, default=None, help=f"nodes (default {NODES})")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from table import print_table
    print_table(run(args.quick, args.nodes)["table"])


if __name__ == "__main__":
    main()
