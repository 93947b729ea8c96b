"""Troy's placement cost per unit with 10 to 10,000 pilots.

    .venv/bin/python bench/bench_scheduling.py [--quick]

A real Session with a ``local`` framework of N running 8-core pilots, as busy as a loaded
system is: every pilot full but 1% with 4 free cores. Measured per unit (late binding, the
default): the scheduler's decision (``scheduler.schedule``: what the UnitService asks for
every unit) for each built-in scheduler and for seed 003's example scheduler (written on the
public API alone: it looks at every pilot); then the whole hand-off of a unit with
``round_robin`` (the decision plus ``framework.submit_unit``, the unit then queued by the
framework, every pilot being full). Each figure is the median of 5 batches (min and max
too). Goals: under 100 us per placement, at most 2x growth from 10 to 1,000 pilots.
"""
from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from troy.descriptions import ComputeUnitDescription  # noqa: E402
from troy.session import Session  # noqa: E402

SCHEDULERS = ("round_robin", "first_fit", "backfill", "seed003")
BATCHES = 5


def batches(fn: Callable[[], object], calls: int) -> list[float]:
    """Microseconds per call, one figure per batch of ``calls`` calls."""
    out = []
    for _ in range(BATCHES):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e6)
    return out


def measure(pilots: int, calls: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scheduling-") as tmp:
        session = Session(store_path=Path(tmp) / "troy.sqlite")
        try:
            fw = session.add_framework("local", "bench")
            made = [fw.submit_pilot({"size": 8}) for _ in range(pilots)]
            for p in made:
                p._reserve(8)   # as if units ran there
            for p in random.Random(10).sample(made, max(1, pilots // 100)):
                p._release(4)
            cud = ComputeUnitDescription(executable="/bin/true")
            for name in SCHEDULERS:
                us = session.unit_service(name)
                out[name] = batches(lambda us=us: us.scheduler.schedule(us, cud), calls)
            for p in made:      # now every pilot is full: the framework queues the units
                p._reserve(8)
            us = session.unit_service("round_robin")
            units: list[Any] = []

            def hand_off() -> None:
                target, pilot = us.scheduler.schedule(us, cud)
                units.append(target.submit_unit(ComputeUnitDescription(
                    executable="/bin/true"), pilot))

            out["hand_off"] = batches(hand_off, max(5, calls // 10))
            for u in units:
                fw.cancel_unit(u)
        finally:
            session.close()
    return out


def run(quick: bool = False) -> dict[str, Any]:
    sizes = (10, 100, 1000) if quick else (10, 100, 1000, 10000)
    figures: dict[str, Any] = {}
    rows: list[tuple[str, str]] = []
    results = {n: measure(n, 200 if quick else 2000) for n in sizes}
    for name in (*SCHEDULERS, "hand_off"):
        what = ("unit hand-off (round_robin + local submit_unit)" if name == "hand_off"
                else f"{name} placement")
        for n in sizes:
            values = results[n][name]
            key = f"troy_{name}_placement_us_{n}_pilots"
            figures[key] = round(statistics.median(values), 2)
            figures[f"{key}_min"] = round(min(values), 2)
            figures[f"{key}_max"] = round(max(values), 2)
            rows.append((f"{what}, {n} pilots", f"{statistics.median(values):9.1f} us "
                                                f"(min {min(values):.1f}, max {max(values):.1f})"))
        growth = statistics.median(results[1000][name]) / statistics.median(results[10][name])
        figures[f"ratio_troy_{name}_placement_1000_over_10_pilots"] = round(growth, 2)
        rows.append((f"{what}: growth 10 -> 1,000 pilots (goal <= 2x)", f"{growth:9.2f}x"))
    return {**figures, "table": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 to 1,000 pilots, fewer calls")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from table import print_table
    print_table(run(quick=args.quick)["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
