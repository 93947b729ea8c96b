"""ProtoGENI client throughput against the emulator (CloudLab in a box) over real TLS.

    .venv/bin/python bench/bench_rpc.py [--calls 400] [--nodes 1000] [--quick]

Measures GetVersion calls per second over one keep-alive connection and with a new TLS
connection per call, then SliverStatus / AddNodes / DeleteNodes times on a slice of
``--nodes`` nodes. Prints a table; exits 0. ``run(quick)`` is the harness's entry
(``python -m bench --only rpc``; quick: 100 calls, 100 nodes).
"""
from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticslice.config import load_config  # noqa: E402
from elasticslice.emulator import EmulatorServer, init_emulator  # noqa: E402
from elasticslice.rpc.client import ProtoGeniServer  # noqa: E402
from elasticslice.rspec import NodeSpec, add_nodes_args, build_request  # noqa: E402
from table import print_table  # noqa: E402  (bench/table.py; this folder is on sys.path)


def _rate(fn, calls: int) -> tuple[float, float]:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    return calls / elapsed, elapsed / calls * 1000


def _timed(fn) -> tuple[object, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _wait_ready(server: ProtoGeniServer, count: int, timeout: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        status = server.sliver_status()
        if status.ready and len(status.nodes) == count:
            return time.perf_counter() - start
        time.sleep(0.5)
    raise SystemExit(f"sliver did not reach {count} ready nodes within {timeout} s")


def measure(calls: int, nodes: int) -> tuple[dict[str, float], list[tuple[str, str]]]:
    """The figures (names carry their unit) and the table's rows."""
    figures: dict[str, float] = {}
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-rpc-") as tmp:
        root = Path(tmp)
        inventory = root / "inventory.ini"
        inventory.write_text("[inventory]\ndefault_hardware_type = bench\n"
                             "images = UBUNTU22-64-STD\n\n"
                             f"[bench]\ncount = {nodes + 50}\ncores = 8\n"
                             "memory = 65536\nprefix = bn\n")
        d = init_emulator(root / "emu")
        os.environ["ELASTICSLICE_CREDENTIAL_CACHE_DIR"] = str(root / "cache")
        with EmulatorServer(d, port=0, inventory=inventory, boot_delay=0.5):
            cfg = load_config(d / "elasticslice.conf")
            with ProtoGeniServer(cfg) as server:
                t = server.transport
                sa = server.sa_url
                t.call(sa, "GetVersion")  # warm up: TLS context, first connection
                rate, ms = _rate(lambda: t.call(sa, "GetVersion"), calls)
                figures["getversion_keepalive_calls_per_s"] = rate
                rows.append(("GetVersion, one keep-alive connection",
                             f"{rate:8.0f} calls/s  ({ms:.2f} ms/call)"))
                n_new = max(50, calls // 4)
                rate, ms = _rate(lambda: t.call(sa, "GetVersion", keep_alive=False), n_new)
                figures["getversion_new_tls_connection_calls_per_s"] = rate
                rows.append(("GetVersion, new TLS connection per call",
                             f"{rate:8.0f} calls/s  ({ms:.2f} ms/call)"))

                server.register_slice(expiration=dt.datetime.now(dt.timezone.utc)
                                      + dt.timedelta(hours=2))
                server.create_sliver(build_request([NodeSpec(client_id="n0")]))
                _wait_ready(server, 1, 60)
                more = [NodeSpec(client_id=f"n{i}") for i in range(1, nodes)]
                _, took = _timed(lambda: server.add_nodes(add_nodes_args(more)))
                figures[f"addnodes_{len(more)}_nodes_one_call_s"] = took
                rows.append((f"AddNodes, {len(more)} nodes in one call", f"{took:8.2f} s"))
                boot = _wait_ready(server, nodes, 300)
                figures[f"all_{nodes}_nodes_ready_s"] = boot
                rows.append((f"until all {nodes} nodes ready (boot delay 0.5 s)",
                             f"{boot:8.2f} s"))
                samples = [_timed(server.sliver_status)[1] for _ in range(5)]
                figures[f"sliverstatus_{nodes}_node_slice_ms"] = \
                    statistics.median(samples) * 1000
                rows.append((f"SliverStatus, {nodes}-node slice (median of 5)",
                             f"{statistics.median(samples) * 1000:8.0f} ms"))
                _, took = _timed(lambda: server.add_nodes(add_nodes_args(
                    [NodeSpec(client_id="extra")])))
                figures[f"addnodes_1_node_to_{nodes}_node_slice_ms"] = took * 1000
                rows.append((f"AddNodes, 1 node to a {nodes}-node slice",
                             f"{took * 1000:8.0f} ms"))
                victims = [f"n{i}" for i in range(1, min(101, nodes // 2))]
                _, took = _timed(lambda: server.delete_nodes(victims))
                figures[f"deletenodes_{len(victims)}_nodes_one_call_ms"] = took * 1000
                rows.append((f"DeleteNodes, {len(victims)} nodes in one call",
                             f"{took * 1000:8.0f} ms"))
                _wait_ready(server, nodes + 1 - len(victims), 60)
                server.delete_slice()
    return figures, rows


def run(quick: bool = False) -> dict[str, Any]:
    calls, nodes = (100, 100) if quick else (400, 1000)
    figures, rows = measure(calls, nodes)
    return {"calls": calls, "nodes": nodes, **figures, "table": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="100 calls, 100 nodes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print_table(run(quick=True)["table"] if args.quick else measure(args.calls, args.nodes)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
