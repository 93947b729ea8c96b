"""AddNodes time as a slice grows, on the box at CloudLab's pace (``--latency cloudlab``).

    .venv/bin/python bench/bench_addnodes.py [--held 1,16,64] [--samples 5]
                                             [--time-scale 0.02] [--quick]

CloudLab's CM fetches every tarball URL of the sliver again at every AddNodes (and
DeleteNodes): one ``fetchtar.proxy`` over ssh per distinct URL (protogeni/lib/GeniCM.pm.in
``SliverWorkAux``, tbsetup/tarfiles_setup.in). So an AddNodes costs one fetch per URL the
slice holds: with one tarball URL per node (how the pilots' tarballs were published) the
call slows as the slice grows; with one URL the whole slice shares it stays flat.

For each way and each count of nodes held, a fresh box (``--latency cloudlab --time-scale
S --seed 1``: calls, boots and fetches draw from seeded streams of their own, so the k-th
AddNodes draws the same CM time whatever the slice holds) gets a sliver of that many ready
nodes, then ``--samples`` times: AddNodes of one node (timed, through the real client over
TLS), DeleteNodes of it. The figures are the median AddNodes seconds (at the scaled pace:
divide by S for CloudLab's) and, per way, the ratio of the largest slice's to the
smallest's; the goal (bench/goals.py): the shared URL's ratio at most 1.10.
``run(quick)`` is the harness's entry (quick: 1 and 16 nodes, 3 samples, S = 0.01).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import http.server
import io
import logging
import os
import statistics
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticslice.config import load_config  # noqa: E402
from elasticslice.emulator import EmulatorServer, init_emulator  # noqa: E402
from elasticslice.rpc.client import ProtoGeniServer  # noqa: E402
from elasticslice.rspec import NodeSpec, build_request  # noqa: E402

TIMEOUT = 300.0
WAYS = ("per_node_url", "shared_url")


def _until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


class Tarballs:
    """Small tarballs over HTTP on 127.0.0.1, made on demand: ``url(name)``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        handler = functools.partial(_Quiet, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, name: str) -> str:
        path = self.root / f"{name}.tgz"
        if not path.exists():
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                data = f"{name}\n".encode()
                info = tarfile.TarInfo(f"local/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            path.write_bytes(buf.getvalue())
        return f"{self.base}/{name}.tgz"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def one_case(root: Path, tarballs: Tarballs, way: str, held: int, samples: int,
             scale: float) -> list[float]:
    """AddNodes seconds, ``samples`` times, on a fresh box whose slice holds ``held`` ready
    nodes, each with its own URL (``per_node_url``) or all with one (``shared_url``)."""
    def url(name: str) -> str:
        return tarballs.url(name if way == "per_node_url" else "shared")

    d = init_emulator(root / f"emu-{way}-{held}")
    os.environ["ELASTICSLICE_CREDENTIAL_CACHE_DIR"] = str(root / f"cache-{way}-{held}")
    took = []
    with EmulatorServer(d, port=0, latency="cloudlab", time_scale=scale, seed=1):
        cfg = load_config(d / "elasticslice.conf")
        with ProtoGeniServer(dataclasses.replace(cfg, slice_name=f"s{held}")) as server:
            server.register_slice(expiration=dt.datetime.now(dt.timezone.utc)
                                  + dt.timedelta(hours=2))
            specs = [NodeSpec(f"h{i}", installs=[(url(f"h{i}"), "/")]) for i in range(held)]
            server.create_sliver(build_request(specs))
            _until(lambda: server.sliver_status().ready, f"{held} nodes ready")
            for k in range(samples):
                name = f"x{k}"
                start = time.perf_counter()
                server.add_nodes({name: {"tarballs": [url(name)]}})
                took.append(time.perf_counter() - start)
                server.delete_nodes([name])
            server.delete_slice(cancel=True, blocking=True)
    return took


def measure(helds: list[int], samples: int, scale: float) -> dict[str, dict[int, list[float]]]:
    out: dict[str, dict[int, list[float]]] = {way: {} for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="bench-addnodes-") as tmp:
        root = Path(tmp)
        (root / "www").mkdir()
        tarballs = Tarballs(root / "www")
        try:
            for way in WAYS:
                for held in helds:
                    out[way][held] = one_case(root, tarballs, way, held, samples, scale)
        finally:
            tarballs.close()
    return out


def figures_of(times: dict[str, dict[int, list[float]]], scale: float,
               samples: int) -> dict[str, Any]:
    figures: dict[str, Any] = {"time_scale": scale, "samples": samples}
    table = []
    for way in WAYS:
        by_held = times[way]
        helds = sorted(by_held)
        for held in helds:
            median = statistics.median(by_held[held])
            figures[f"addnodes_{way}_{held}_held_s"] = median
            table.append((f"AddNodes, {way.replace('_', ' ')}, {held} node(s) held "
                          f"(median of {samples}, time scale {scale:g})",
                          f"{median:.3f} s ({median / scale:.0f} s at CloudLab's pace)"))
        ratio = statistics.median(by_held[helds[-1]]) / statistics.median(by_held[helds[0]])
        figures[f"addnodes_{way}_{helds[-1]}_over_{helds[0]}"] = ratio
        figures[f"addnodes_{way}_largest_over_smallest"] = ratio
        table.append((f"AddNodes, {way.replace('_', ' ')}: {helds[-1]} held / {helds[0]} held",
                      f"{ratio:.2f}x"))
    figures["table"] = table
    return figures


def run(quick: bool = False) -> dict[str, Any]:
    helds, samples, scale = ([1, 16], 3, 0.01) if quick else ([1, 16, 64], 5, 0.02)
    return figures_of(measure(helds, samples, scale), scale, samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", default="1,16,64", help="node counts held (default 1,16,64)")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=0.02)
    parser.add_argument("--quick", action="store_true", help="1 and 16 held, 3 samples")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.quick:
        figures = run(quick=True)
    else:
        helds = [int(x) for x in args.held.split(",")]
        figures = figures_of(measure(helds, args.samples, args.time_scale), args.time_scale,
                             args.samples)
    for label, value in figures["table"]:
        print(f"{label:80} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
