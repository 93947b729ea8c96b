"""``python -m bench.chaos [--runs N] [--seed S] [--json OUT]``: N chaos runs (run i uses
seed S+i, so ``--runs 1 --seed S+i`` replays it), one line per run, the totals, exit 1 when
an invariant broke. Logs go to ``<workdir>/run-<seed>/chaos.log``."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.chaos.run import WORKFLOW, RunResult, chaos_run

log = logging.getLogger("bench.chaos")
SITES = ("utah", "wisc", "clemson")

TOTALS = ("kills", "faults_injected", "emulator_calls_faulted", "units", "units_lost",
          "units_requeued", "duplicate_runs", "duplicate_runs_counted", "nodes_leaked",
          "duplicate_adds", "slice_lapses", "processes")


def totals(results: list[RunResult]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(results),
                           "runs_failed": sum(1 for r in results if not r.ok)}
    for key in TOTALS:
        out[key] = sum(getattr(r, key) for r in results)
    out["seconds"] = round(sum(r.seconds for r in results), 1)
    return out


def line(r: RunResult) -> str:
    verdict = "ok" if r.ok else "FAILED"
    text = (f"run seed={r.seed}: {verdict} {r.seconds:.0f}s units {r.units_done}/{r.units} "
            f"lost {r.units_lost} requeued {r.units_requeued} dup_runs {r.duplicate_runs} "
            f"(counted {r.duplicate_runs_counted}) processes {r.processes} "
            f"kills {r.kills} faults {r.faults_injected} leaked {r.nodes_leaked} "
            f"dup_adds {r.duplicate_adds} lapses {r.slice_lapses}")
    if r.nodes_peak_by_site:
        text += " nodes " + ", ".join(f"{s} {n}" for s, n in r.nodes_peak_by_site.items())
    return text + (f" ({r.error})" if r.error else "")


def run_logging(directory: Path) -> logging.Handler:
    handler = logging.FileHandler(directory / "chaos.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s "
                                           "%(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--workdir", type=Path, help="keep every run's files here (default: a "
                   "temporary directory, kept only for failed runs)")
    p.add_argument("--workflow", type=Path, default=WORKFLOW)
    p.add_argument("--time-scale", type=float, default=0.05)
    p.add_argument("--sites", type=int, default=1, choices=(1, 2, 3),
                   help="CMs in the box (utah, wisc, clemson), the slice a sliver at each; "
                        "faults per CM (one answers BUSY a while; nodes of any revoked)")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error("--runs must be at least 1")
    if not a.workflow.is_file():
        p.error(f"--workflow {a.workflow}: no such file")
    from elasticslice.emulator import init_emulator
    work = a.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    sites = SITES[:a.sites] if a.sites > 1 else ()
    pki = init_emulator(work / "pki", port=0, clusters=sites)  # keys once; runs copy them
    results = []
    for seed in range(a.seed, a.seed + a.runs):
        directory = work / f"run-{seed}"
        directory.mkdir()
        handler = run_logging(directory)
        try:
            result = chaos_run(seed, directory, pki, workflow=a.workflow,
                               time_scale=a.time_scale, sites=sites)
        finally:
            logging.getLogger().removeHandler(handler)
            handler.close()
        results.append(result)
        print(line(result), flush=True)
        if result.ok and a.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)
    figures = totals(results)
    print("chaos: " + ", ".join(f"{k} {v}" for k, v in figures.items()), flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"totals": figures, "runs": [
            dataclasses.asdict(r) for r in results]}, indent=1) + "\n")
    if figures["runs_failed"]:
        kept = [str(work / f"run-{r.seed}") for r in results if not r.ok]
        print(f"chaos: {figures['runs_failed']} run(s) broke an invariant; files in "
              f"{', '.join(kept)}", file=sys.stderr)
        return 1
    if a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
