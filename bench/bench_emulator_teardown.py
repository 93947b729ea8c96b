"""Other slices' CM calls while the emulator tears down a slice with stubborn processes.

    .venv/bin/python bench/bench_emulator_teardown.py [--stubborn 5] [--rounds 3] [--quick]

Slice A has ``--stubborn`` nodes whose startup command ignores SIGTERM (each needs the
3 s grace period before SIGKILL). While A is deleted (DeleteSlice, blocking), slice B's
owner keeps calling RenewSlice, AddNodes+DeleteNodes, SliverStatus and GetVersion through
the real client. Prints, per call kind, the time an answer took with the CM idle and
during the teardown, and how many of B's calls were answered before the teardown ended.
``run(quick)`` is the harness's entry (``python -m bench --only emulator_teardown``; quick:
2 stubborn nodes, 1 round).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticslice.config import load_config  # noqa: E402
from elasticslice.emulator import EmulatorServer, init_emulator  # noqa: E402
from elasticslice.rpc.client import ProtoGeniServer  # noqa: E402
from elasticslice.rspec import NodeSpec, build_request  # noqa: E402
from tests.elasticslice.emulator.helpers import processes_with, stubborn_startup  # noqa: E402

TIMEOUT = 120.0


def _until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def _calls(b: ProtoGeniServer) -> list[tuple[str, Callable[[], object]]]:
    serial = iter(range(10**6))
    renew_to = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)

    def add_delete() -> None:
        name = f"x{next(serial)}"
        b.add_nodes({name: {}})
        b.delete_nodes([name])

    return [("RenewSlice", lambda: b.cm().renew_slice(renew_to)),
            ("AddNodes+DeleteNodes", add_delete),
            ("SliverStatus", b.sliver_status),
            ("GetVersion", lambda: b.cm().get_version())]


def _round(a: ProtoGeniServer, b: ProtoGeniServer, stubborn: int,
           samples: dict[str, dict[str, list[float]]]) -> tuple[float, int, int]:
    marker = f"bench-stubborn-{uuid.uuid4().hex}"
    specs = [NodeSpec(f"s{i}", executes=[("sh", stubborn_startup(marker))]) for i in range(stubborn)]
    a.create_sliver(build_request(specs))
    _until(lambda: len(processes_with(marker)) >= stubborn, "stubborn startups")
    calls = _calls(b)
    for name, call in calls * 3:  # the CM idle
        start = time.perf_counter()
        call()
        samples[name]["idle"].append(time.perf_counter() - start)
    done = threading.Event()
    started = time.perf_counter()

    def delete() -> None:
        a.delete_slice(blocking=True)
        done.set()

    deleter = threading.Thread(target=delete)
    deleter.start()
    answered = before_end = 0
    i = 0
    while processes_with(marker) and time.perf_counter() - started < TIMEOUT:
        name, call = calls[i % len(calls)]
        i += 1
        start = time.perf_counter()
        call()
        samples[name]["teardown"].append(time.perf_counter() - start)
        answered += 1
        before_end += bool(processes_with(marker))
    deleter.join(TIMEOUT)
    _until(done.is_set, "DeleteSlice")
    return time.perf_counter() - started, answered, before_end


Samples = dict[str, dict[str, list[float]]]


def measure(stubborn: int, rounds_wanted: int) -> tuple[list[tuple[float, int, int]], Samples]:
    """Per round (teardown s, B's calls answered, answered before it ended); call samples."""
    samples: Samples = {name: {"idle": [], "teardown": []} for name in
                        ("RenewSlice", "AddNodes+DeleteNodes", "SliverStatus", "GetVersion")}
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-teardown-") as tmp:
        root = Path(tmp)
        d = init_emulator(root / "emu")
        os.environ["ELASTICSLICE_CREDENTIAL_CACHE_DIR"] = str(root / "cache")
        with EmulatorServer(d, port=0, boot_delay=0.2):
            cfg = load_config(d / "elasticslice.conf")
            with ProtoGeniServer(cfg) as a, \
                    ProtoGeniServer(dataclasses.replace(cfg, slice_name="other")) as b:
                expires = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=4)
                a.register_slice(expiration=expires)
                b.register_slice(expiration=expires)
                b.create_sliver(build_request([NodeSpec("b0"), NodeSpec("b1")]))
                _until(lambda: b.sliver_status().ready, "slice B ready")
                for _ in range(rounds_wanted):
                    rounds.append(_round(a, b, stubborn, samples))
    return rounds, samples


def run(quick: bool = False) -> dict[str, Any]:
    stubborn, n = (2, 1) if quick else (5, 3)
    rounds, samples = measure(stubborn, n)
    teardown = [r[0] for r in rounds]
    figures: dict[str, Any] = {
        "stubborn_nodes": stubborn, "rounds": n,
        "teardown_s": statistics.median(teardown), "teardown_s_min": min(teardown),
        "teardown_s_max": max(teardown),
        "other_slice_calls_answered_during_teardown": statistics.median(r[1] for r in rounds)}
    table = [(f"teardown of {stubborn} SIGTERM-ignoring nodes (median of {n})",
              f"{figures['teardown_s']:.1f} s; slice B answered "
              f"{figures['other_slice_calls_answered_during_teardown']:.0f} calls meanwhile")]
    for name, by in samples.items():
        key = name.lower().replace("+", "_")
        figures[f"{key}_idle_median_ms"] = statistics.median(by["idle"]) * 1000
        if by["teardown"]:
            figures[f"{key}_during_teardown_median_ms"] = \
                statistics.median(by["teardown"]) * 1000
            figures[f"{key}_during_teardown_max_ms"] = max(by["teardown"]) * 1000
            table.append((f"slice B {name}: idle / during teardown (median, max)",
                          f"{figures[f'{key}_idle_median_ms']:.1f} ms / "
                          f"{figures[f'{key}_during_teardown_median_ms']:.1f} ms, "
                          f"{figures[f'{key}_during_teardown_max_ms']:.0f} ms"))
    figures["table"] = table
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stubborn", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 stubborn nodes, 1 round")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.quick:
        args.stubborn, args.rounds = 2, 1
    rounds, samples = measure(args.stubborn, args.rounds)
    print(f"teardown of a slice with {args.stubborn} SIGTERM-ignoring nodes, "
          f"{args.rounds} rounds")
    for total, answered, before_end in rounds:
        print(f"  teardown {total:5.1f} s; slice B's calls answered meanwhile: {answered} "
              f"({before_end} before the teardown ended)")
    print(f"{'slice B call':24} {'idle median':>12} {'during teardown':>26}")
    for name, by in samples.items():
        idle = statistics.median(by["idle"]) * 1000
        during = by["teardown"]
        shown = (f"median {statistics.median(during) * 1000:7.1f} ms, max "
                 f"{max(during) * 1000:7.0f} ms" if during else "-")
        print(f"{name:24} {idle:9.1f} ms  {shown:>26}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
