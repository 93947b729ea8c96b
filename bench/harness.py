"""The benchmark harness behind ``python -m bench``: finds every ``bench/bench_*.py`` with a
``run(quick)``, runs each in a child process of its own (so one's memory, threads and loggers
do not leak into the next), writes every figure to ``bench/results/latest.json`` and prints
one readable table, then the goals table (``bench/goals.py``: measure | now | goal |
pass/miss, also under ``goals`` in the JSON), both also written to
``bench/results/latest.txt``."""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.util
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
log = logging.getLogger("bench")


class BenchError(Exception):
    """A benchmark could not be found, run or read (one line for the user)."""


def available() -> dict[str, Path]:
    """Benchmark name (``bench_troy.py`` -> ``troy``) -> file, for files defining ``run``."""
    found = {}
    for path in sorted(BENCH.glob("bench_*.py")):
        if "\ndef run(" in path.read_text():
            found[path.stem.removeprefix("bench_")] = path
    return found


def load(path: Path) -> ModuleType:
    for p in (str(BENCH), str(BENCH.parent)):
        if p not in sys.path:
            sys.path.insert(0, p)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def child(name: str, quick: bool, out: Path) -> int:
    """In the child process: run one benchmark and write its figures as JSON to ``out``; a
    failure is one line here and its traceback in ``bench/results/<name>.error.log``."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        figures = load(available()[name]).run(quick=quick)
        out.write_text(json.dumps(figures, default=str))
    except Exception as e:  # noqa: BLE001  (any failure of the benchmark: one line)
        RESULTS.mkdir(parents=True, exist_ok=True)
        trace = RESULTS / f"{name}.error.log"
        trace.write_text(traceback.format_exc())
        print(f"bench_{name}: {type(e).__name__}: {e} (traceback in "
              f"{trace.relative_to(BENCH.parent)})", file=sys.stderr)
        return 1
    return 0


def run_one(name: str, quick: bool, timeout: float) -> dict[str, Any]:
    """Run benchmark ``name`` in a child process (its own session: on timeout the whole
    group, workers included, is stopped) and return its figures."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [sys.executable, str(BENCH / "harness.py"), "--child", name, "--out", str(out)]
        proc = subprocess.Popen(cmd + (["--quick"] if quick else []), stdout=sys.stderr,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise BenchError(f"bench_{name}: no result within {timeout:g} s") from None
        if rc != 0 or not out.exists():
            raise BenchError(f"bench_{name}: failed (exit status {rc})")
        return json.loads(out.read_text())


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def meta(quick: bool, names: list[str]) -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    return {"machine": {"platform": platform.platform(), "arch": platform.machine(),
                        "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
            "python": platform.python_version(),
            "dask": version("dask"), "distributed": version("distributed"),
            "parsl": version("parsl"), "matplotlib": version("matplotlib"),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "quick": quick, "benchmarks": names, "seconds": {}}


def render(results: dict[str, Any]) -> str:
    lines = []
    for name, figures in results.items():
        if name in ("meta", "goals"):
            continue
        took = results["meta"]["seconds"].get(name)
        lines.append(f"== {name}" + (f" ({took:.0f} s)" if took is not None else ""))
        rows = [tuple(r) for r in figures.get("table") or []] or \
            [(k, str(v)) for k, v in figures.items() if k not in ("table", "plots")]
        width = max((len(k) for k, _ in rows), default=10)
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
        lines += [f"  plot: bench/results/{p}" for p in figures.get("plots") or []]
    m = results["meta"]
    lines.append(f"({'quick, ' if m['quick'] else ''}{sum(m['seconds'].values()):.0f} s in "
                 f"all; {m['machine']['cpus']} cpus, load {m['machine']['load_avg_1m']:.1f} "
                 f"at the start; python {m['python']}, dask {m['dask']}, parsl {m['parsl']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small and fast")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these benchmarks only")
    parser.add_argument("--json", type=Path, help="write the figures here instead of "
                        "bench/results/latest.json")
    parser.add_argument("--timeout", type=float, default=900.0, help="per benchmark, s "
                        "(default: %(default)s)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.quick, args.out)
    names = list(available())
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        print(f"python -m bench: --only: no benchmark named {', '.join(unknown)} "
              f"(there are: {', '.join(names)})", file=sys.stderr)
        return 2
    names = [n for n in names if not args.only or n in args.only]
    results: dict[str, Any] = {"meta": meta(args.quick, names)}
    failed = []
    for name in names:
        print(f"== bench_{name}{' --quick' if args.quick else ''}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            results[name] = run_one(name, args.quick, args.timeout)
        except BenchError as e:
            print(f"python -m bench: {e}", file=sys.stderr)
            results[name] = {"error": str(e)}
            failed.append(name)
        results["meta"]["seconds"][name] = round(time.perf_counter() - started, 1)
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    goals = importlib.import_module("goals")  # bench/goals.py: issue 22's goals, pass/miss
    results["goals"] = goals.evaluate(results)
    out = args.json or RESULTS / "latest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    text = render(results) + "\n" + goals.render(results["goals"])
    if args.json is None:
        (RESULTS / "latest.txt").write_text(text + "\n")
    print(text)
    print(f"figures: {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
