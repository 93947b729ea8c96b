"""The cost of ``elasticslice run``'s split by trust: the local channel and the memory of
each side.

    .venv/bin/python bench/bench_split.py [--quick] [--repeats 51]

The manager daemon (credentials, CA key) and the workload's process (Troy, Dask) speak over
a UNIX socket (``elasticslice.channel``). With real objects, in one process with threads:

- a ``pilots`` frame of 10, 100 and 1,000 pilots from a ``connect``-ed workload end to a
  ``ChannelServer`` in a temporary state directory: the time from ``send`` (encode, check,
  write) until the server's handler has the checked message (read, decode, check), median
  over the repeats; then the same frame into a ``RemoteWorkload`` (the daemon's end: its
  handler also builds the pilots it keeps). The frame's size in bytes, and how many such
  pilots fit in one frame (``MAX_FRAME``) against the ``MAX_PILOTS`` the protocol allows;
- ``RemoteWorkload.refresh()`` (the daemon asks the workload for its pilots before a
  decision and waits for them) against a real ``WorkloadLink`` reporting a small framework
  of 10, 100 or 1,000 pilots and a session whose ``demand()`` is a ``troy.Demand``: the round
  trip, median over the repeats.

Then, in child processes: the resident set size (``VmRSS`` of ``/proc/self/status``) of a
Python that imports the manager daemon's side (daemon, manager, helper, ProtoGENI client)
against one that imports the workload's (``WorkloadCluster``, Troy, distributed), a bare
Python for reference, and whether the daemon's side loads Dask, distributed, Parsl or
cloudpickle (it must not: the check is a figure); the same for ``CloudLabProvider``'s split
(its daemon's side: ``elasticslice.parsl.daemon``, its manager, its node helper, the
ProtoGENI client, which must load no Parsl, ZeroMQ, dill or cloudpickle; the provider's
side: the provider and Parsl's HighThroughputExecutor). And the Parsl frames: a ``blocks``
frame of 100 blocks (worker commands as Parsl writes them) encoded and decoded. Goals (in the rows and as ``goal_*``
figures): a 1,000-pilot frame handled in < 20 ms, a refresh round trip (100 pilots) < 5 ms,
no Dask in the daemon. Prints a table; exits 0. ``run(quick)`` is the harness's entry
(``python -m bench --only split``; quick: 7 repeats, one child per side).
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import troy  # noqa: E402
from elasticslice.channel import (MAX_FRAME, MAX_PILOTS, Channel,  # noqa: E402
                                  ChannelError, ChannelServer, connect, decode, encode)
from elasticslice.pilots.link import WorkloadLink  # noqa: E402
from elasticslice.pilots.remote import RemoteWorkload  # noqa: E402
from troy.states import State  # noqa: E402
from table import print_table  # noqa: E402  (bench/table.py; this folder is on sys.path)

SIZES = (10, 100, 1000)
REFRESH_SIZES = (10, 100, 1000)
WAIT = 10.0   # seconds any one frame or answer may take before the benchmark gives up
GOAL_FRAME_MS = 20.0     # a 1,000-pilot frame, send -> handled
GOAL_REFRESH_MS = 5.0    # RemoteWorkload.refresh() round trip, of a 100-pilot cluster
REFRESH_GOAL_SIZE = 100
#: what the daemon's process must never load (it decodes nothing a node sends)
FORBIDDEN = ("distributed", "dask", "parsl", "cloudpickle")
DAEMON_IMPORTS = ("elasticslice.pilots.daemon", "elasticslice.pilots.manager",
                  "elasticslice.pilots.helper", "elasticslice.rpc.client")
WORKLOAD_IMPORTS = ("elasticslice.pilots.workload", "troy", "distributed")
#: CloudLabProvider's split: what its daemon must never load, and each side's imports
PARSL_FORBIDDEN = ("parsl", "zmq", "dill", "cloudpickle", "distributed")
PARSL_DAEMON_IMPORTS = ("elasticslice.parsl.daemon", "elasticslice.parsl.manager",
                        "elasticslice.parsl.node", "elasticslice.parsl.remote",
                        "elasticslice.rpc.client")
PARSL_PROVIDER_IMPORTS = ("elasticslice.parsl.provider",
                          "parsl.executors.high_throughput.executor")
#: a worker command as HTEX writes it (``launch_cmd`` formatted), for the blocks frame
PARSL_COMMAND = ("process_worker_pool.py --debug  --max_workers_per_node=2 -a 100.64.0.1 "
                 "-p 0 -c 1.0 -m None --poll 10 --port=54321 --cert_dir /local/parsl/curve "
                 "--logdir=/home/user/runinfo/000/cloudlab --block_id={i} --hb_period=30 "
                 "--hb_threshold=120 --drain_period=None --cpu-affinity none "
                 "--mpi-launcher=mpiexec --available-accelerators")


# ---------------------------------------------------------------------------- pilots
@dataclass
class BenchPilot:
    """A pilot as the link reads one of a Troy framework (what ``WorkloadLink._entry``
    reads)."""

    id: str
    worker_name: str
    state: State
    size: int
    busy: bool
    idle_since: float | None


def pilots(count: int) -> list[BenchPilot]:
    """``count`` running pilots of 8 cores on nodes named as a slice's client ids, half of
    them busy, the others idle since a few minutes."""
    now = time.time()
    return [BenchPilot(f"pilot.{i:04d}", f"node-{i}", State.RUNNING, 8, i % 2 == 0,
                       None if i % 2 == 0 else now - 60.0 - i * 0.137)
            for i in range(count)]


def entries(count: int) -> list[dict[str, Any]]:
    """The ``pilots`` frame's entries of :func:`pilots`, as the link makes them."""
    return [WorkloadLink._entry(p, {}) for p in pilots(count)]


@dataclass
class BenchFramework:
    """The part of a Troy pilot framework the link uses: a fixed list of pilots."""

    listed: list[BenchPilot]
    scheduler_address: str = "tls://127.0.0.1:8786"
    values: list[dict[str, float]] = field(default_factory=list)
    callbacks: list[Callable[..., None]] = field(default_factory=list)

    def list_pilots(self) -> list[BenchPilot]:
        return list(self.listed)

    def find_pilot(self, key: str) -> BenchPilot | None:
        return next((p for p in self.listed if key in (p.worker_name, p.id)), None)

    def add_pilot_callback(self, callback: Callable[..., None]) -> None:
        self.callbacks.append(callback)

    def set_pilot_values(self, values: dict[str, float]) -> None:
        self.values.append(values)


class BenchSession:
    """A session whose demand is Troy's own ``Demand`` (a few units queued and running)."""

    def demand(self) -> troy.Demand:
        return troy.Demand(queued_cores=16, running_cores=64, max_unit_cores=1,
                           units_queued=16, units_running=64)


# ---------------------------------------------------------------------------- helpers
def _wait(event: threading.Event, what: str) -> None:
    if not event.wait(WAIT):
        raise SystemExit(f"bench_split: no {what} within {WAIT:g} s")


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` in this thread, ms."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return _median_ms(samples)


class Handled:
    """A handler's end of one measurement: when the last message was handled."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.at = 0.0
        self.count = 0

    def __call__(self, *_args: Any) -> None:
        self.at = time.perf_counter()
        self.count += 1
        self.event.set()


def _send_and_time(channel: Channel, handled: Handled, frame: list[dict[str, Any]],
                   repeats: int) -> list[float]:
    """Seconds from ``send`` until the other end's handler is done, per repeat (one more
    first, untimed)."""
    samples = []
    for i in range(repeats + 1):
        handled.event.clear()
        start = time.perf_counter()
        channel.send("pilots", pilots=frame)
        _wait(handled.event, "pilots frame handled")
        if i:
            samples.append(handled.at - start)
    return samples


# ---------------------------------------------------------------------------- measures
def channel_frames(state: Path, repeats: int) -> dict[str, list[float]]:
    """``pilots`` frames through a bare ``ChannelServer``: its handler takes the checked
    message and returns (the channel's own cost)."""
    handled = Handled()
    attached = threading.Event()
    server = ChannelServer(state, on_message=lambda _channel, message: handled(message),
                           on_attach=lambda _channel: attached.set()).start()
    try:
        workload = connect(state, on_message=lambda _m: None)
        try:
            _wait(attached, "workload attached")
            return {f"{n}": _send_and_time(workload, handled, entries(n), repeats)
                    for n in SIZES}
        finally:
            workload.close()
    finally:
        server.stop()


def remote_frames(state: Path, repeats: int) -> dict[str, list[float]]:
    """``pilots`` frames into a ``RemoteWorkload``, the daemon's end: handled once its
    pilots are kept (its ``on_change``)."""
    handled = Handled()
    remote = RemoteWorkload(state, on_change=handled).start()
    try:
        workload = connect(state, on_message=lambda _m: None)
        try:
            deadline = time.monotonic() + WAIT
            while not remote.attached:
                if time.monotonic() > deadline:
                    raise SystemExit("bench_split: the RemoteWorkload saw no workload")
                time.sleep(0.001)
            out = {}
            for n in SIZES:
                out[f"{n}"] = _send_and_time(workload, handled, entries(n), repeats)
                if len(remote.list_pilots()) != n:
                    raise SystemExit(f"bench_split: the daemon keeps "
                                     f"{len(remote.list_pilots())} pilots, not {n}")
            return out
        finally:
            workload.close()
    finally:
        remote.stop()


def refresh_round_trip(state: Path, count: int, repeats: int) -> tuple[list[float], int]:
    """``RemoteWorkload.refresh()`` against a ``WorkloadLink`` serving a framework of
    ``count`` pilots (its periodic report an hour apart: only the asked ones come).
    Seconds per round trip, and how many did not come in time."""
    remote = RemoteWorkload(state, held=lambda: [("node-0", "100.64.0.2")]).start()
    link = WorkloadLink(state, interval=3600.0).start()
    try:
        link.serve(BenchFramework(pilots(count)), BenchSession())
        deadline = time.monotonic() + WAIT
        while len(remote.list_pilots()) != count or remote.demand().running_cores != 64:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_split: the link's first report of {count} pilots "
                                 "did not come")
            time.sleep(0.002)
        samples, late = [], 0
        for i in range(repeats + 1):
            start = time.perf_counter()
            ok = remote.refresh(timeout=WAIT)
            took = time.perf_counter() - start
            if i:
                samples.append(took)
                late += not ok
        return samples, late
    finally:
        link.close()
        remote.stop()


def pilots_that_fit() -> int:
    """How many pilots of :func:`entries`' kind one frame holds within ``MAX_FRAME``."""
    low, high = 0, MAX_PILOTS
    frame = entries(MAX_PILOTS)
    while low < high:   # the largest count whose frame encodes
        mid = (low + high + 1) // 2
        try:
            encode({"type": "pilots", "pilots": frame[:mid]})
            low = mid
        except ChannelError:
            high = mid - 1
    return low


def _probe(modules: tuple[str, ...], forbidden: tuple[str, ...] = FORBIDDEN) -> str:
    return ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
            "kib = lambda k: int(status[k].split()[0])\n"
            "import json\n"
            f"forbidden = sorted({{m.split('.')[0] for m in sys.modules}} & {set(forbidden)!r})\n"
            "print(json.dumps({'rss_kib': kib('VmRSS'), 'hwm_kib': kib('VmHWM'),\n"
            "                  'modules': len(sys.modules), 'forbidden': forbidden}))\n")


def process_memory(modules: tuple[str, ...], runs: int,
                   forbidden: tuple[str, ...] = FORBIDDEN) -> dict[str, Any]:
    """A child Python that imports ``modules``: its resident set (median of ``runs``), the
    number of modules loaded, and which of :data:`FORBIDDEN` it loaded."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    seen = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _probe(modules, forbidden)], cwd=REPO,
                              env=env,
                              capture_output=True, text=True, timeout=120)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"bench_split: importing {', '.join(modules) or 'nothing'} "
                             f"failed: {last}")
        seen.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "seconds": took})
    return {"rss_mib": statistics.median(s["rss_kib"] for s in seen) / 1024,
            "hwm_mib": statistics.median(s["hwm_kib"] for s in seen) / 1024,
            "modules": seen[0]["modules"], "seconds": statistics.median(s["seconds"]
                                                                          for s in seen),
            "forbidden": sorted({m for s in seen for m in s["forbidden"]})}


# ---------------------------------------------------------------------------- run
def run(quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    """Figures of the channel and of each side's memory (quick: 7 repeats, one child per
    side; else 51 repeats, 3 children per side)."""
    repeats = repeats or (7 if quick else 51)
    runs = 1 if quick else 3
    out: dict[str, Any] = {}
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        root = Path(tmp)
        for name in ("channel", "remote", *(f"refresh{n}" for n in REFRESH_SIZES)):
            (root / name).mkdir(mode=0o700)
        bare = channel_frames(root / "channel", repeats)
        kept = remote_frames(root / "remote", repeats)
        refresh = {n: refresh_round_trip(root / f"refresh{n}", n, repeats)
                   for n in REFRESH_SIZES}

    for n in SIZES:
        channel_ms, remote_ms = _median_ms(bare[f"{n}"]), _median_ms(kept[f"{n}"])
        out[f"split_pilots_frame_{n}_channel_ms"] = round(channel_ms, 3)
        out[f"split_pilots_frame_{n}_channel_ms_max"] = round(max(bare[f"{n}"]) * 1000, 3)
        out[f"split_pilots_frame_{n}_handled_ms"] = round(remote_ms, 3)
        out[f"split_pilots_frame_{n}_handled_ms_max"] = round(max(kept[f"{n}"]) * 1000, 3)
        goal = f" (goal < {GOAL_FRAME_MS:g} ms)" if n == 1000 else ""
        rows.append((f"pilots frame, {n:,} pilots: send -> ChannelServer's handler",
                     f"{channel_ms:8.3f} ms  (max {max(bare[f'{n}']) * 1000:.2f})"))
        rows.append((f"pilots frame, {n:,} pilots: send -> RemoteWorkload keeps them{goal}",
                     f"{remote_ms:8.3f} ms  (max {max(kept[f'{n}']) * 1000:.2f})"))
    frame = entries(1000)
    data = encode({"type": "pilots", "pilots": frame})
    encode_ms = _cpu_ms(lambda: encode({"type": "pilots", "pilots": frame}), repeats)
    decode_ms = _cpu_ms(lambda: decode(data[:-1]), repeats)
    size = len(data)
    fit = pilots_that_fit()
    out.update({"split_pilots_frame_1000_bytes": size,
                "split_pilots_frame_bytes_per_pilot": round(size / 1000, 1),
                "split_pilots_frame_1000_encode_ms": round(encode_ms, 3),
                "split_pilots_frame_1000_decode_ms": round(decode_ms, 3),
                "split_pilots_per_max_frame": fit,
                "split_max_frame_bytes": MAX_FRAME, "split_max_pilots": MAX_PILOTS,
                "split_max_pilots_fit_in_a_frame": fit >= MAX_PILOTS})
    rows.append(("pilots frame, 1,000 pilots: size",
                 f"{size:8,d} B  ({size / 1000:.0f} B a pilot)"))
    rows.append(("pilots frame, 1,000 pilots: encode / decode+check, CPU in one thread",
                 f"{encode_ms:8.3f} ms / {decode_ms:.3f} ms"))
    rows.append((f"pilots per frame within MAX_FRAME ({MAX_FRAME:,} B; MAX_PILOTS "
                 f"{MAX_PILOTS:,})", f"{fit:8,d}"))
    for n, (samples, late) in refresh.items():
        ms = _median_ms(samples)
        out[f"split_refresh_{n}_pilots_ms"] = round(ms, 3)
        out[f"split_refresh_{n}_pilots_ms_max"] = round(max(samples) * 1000, 3)
        out[f"split_refresh_{n}_pilots_late"] = late
        goal = f" (goal < {GOAL_REFRESH_MS:g} ms)" if n == REFRESH_GOAL_SIZE else ""
        rows.append((f"RemoteWorkload.refresh() <-> WorkloadLink, {n:,} pilots{goal}",
                     f"{ms:8.3f} ms  (max {max(samples) * 1000:.2f}; {late} late)"))

    sides = {"bare": process_memory((), runs),
             "daemon": process_memory(DAEMON_IMPORTS, runs),
             "workload": process_memory(WORKLOAD_IMPORTS, runs)}
    for side, m in sides.items():
        out[f"split_{side}_rss_mib"] = round(m["rss_mib"], 1)
        out[f"split_{side}_modules"] = m["modules"]
        out[f"split_{side}_import_s"] = round(m["seconds"], 3)
    out["split_daemon_loads"] = sides["daemon"]["forbidden"]
    out["split_workload_loads"] = sides["workload"]["forbidden"]
    out["split_daemon_imports_no_dask"] = not sides["daemon"]["forbidden"]
    out["split_workload_over_daemon_rss_mib"] = round(
        sides["workload"]["rss_mib"] - sides["daemon"]["rss_mib"], 1)
    labels = {"bare": "a bare Python (python -c pass)",
              "daemon": "the daemon's side (daemon, manager, helper, rpc.client)",
              "workload": "the workload's side (workload, troy, distributed)"}
    for side, m in sides.items():
        rows.append((f"RSS after importing {labels[side]}",
                     f"{m['rss_mib']:8.1f} MiB  ({m['modules']} modules, "
                     f"{m['seconds']:.2f} s to start)"))
    loaded = ", ".join(sides["daemon"]["forbidden"]) or "none"
    rows.append(("daemon's side loads Dask, distributed, Parsl or cloudpickle (goal: none)",
                 f"{loaded:>8}  (workload's side: "
                 f"{', '.join(sides['workload']['forbidden']) or 'none'})"))

    parsl_sides = {"parsl_daemon": process_memory(PARSL_DAEMON_IMPORTS, runs, PARSL_FORBIDDEN),
                   "parsl_provider": process_memory(PARSL_PROVIDER_IMPORTS, runs,
                                                    PARSL_FORBIDDEN)}
    for side, m in parsl_sides.items():
        out[f"split_{side}_rss_mib"] = round(m["rss_mib"], 1)
        out[f"split_{side}_modules"] = m["modules"]
        out[f"split_{side}_import_s"] = round(m["seconds"], 3)
    out["split_parsl_daemon_loads"] = parsl_sides["parsl_daemon"]["forbidden"]
    out["split_parsl_daemon_imports_no_parsl"] = not parsl_sides["parsl_daemon"]["forbidden"]
    rows.append(("RSS after importing CloudLabProvider's daemon side (daemon, manager, "
                 "node, remote, rpc.client)",
                 f"{parsl_sides['parsl_daemon']['rss_mib']:8.1f} MiB  "
                 f"({parsl_sides['parsl_daemon']['modules']} modules)"))
    rows.append(("RSS after importing the provider's side (provider, Parsl's HTEX)",
                 f"{parsl_sides['parsl_provider']['rss_mib']:8.1f} MiB  "
                 f"({parsl_sides['parsl_provider']['modules']} modules)"))
    rows.append(("Parsl daemon's side loads Parsl, ZeroMQ, dill, cloudpickle or "
                 "distributed (goal: none)",
                 f"{', '.join(parsl_sides['parsl_daemon']['forbidden']) or 'none':>8}  "
                 f"(provider's side: {', '.join(parsl_sides['parsl_provider']['forbidden'])})"))
    blocks = [{"job_id": f"cloudlab-{i:08x}", "name": f"parsl.cloudlab.block-{i}",
               "command": PARSL_COMMAND.format(i=i), "size": 2, "block_id": str(i),
               "state": "live", "nodes": [f"parsl-{2 * i + 1}", f"parsl-{2 * i + 2}"]}
              for i in range(100)]
    data = encode({"type": "blocks", "blocks": blocks, "key_dir": "/home/user/certificates"})
    blocks_encode = _cpu_ms(lambda: encode({"type": "blocks", "blocks": blocks}), repeats)
    blocks_decode = _cpu_ms(lambda: decode(data[:-1]), repeats)
    out.update({"split_parsl_blocks_frame_100_bytes": len(data),
                "split_parsl_blocks_frame_100_encode_ms": round(blocks_encode, 3),
                "split_parsl_blocks_frame_100_decode_ms": round(blocks_decode, 3)})
    rows.append(("blocks frame, 100 blocks of 2 nodes: size, encode / decode+check",
                 f"{len(data):8,d} B  ({blocks_encode:.3f} ms / {blocks_decode:.3f} ms)"))

    out["goal_1000_pilots_frame_under_20_ms"] = \
        out["split_pilots_frame_1000_handled_ms"] < GOAL_FRAME_MS
    out["goal_refresh_under_5_ms"] = \
        out[f"split_refresh_{REFRESH_GOAL_SIZE}_pilots_ms"] < GOAL_REFRESH_MS
    out["goal_daemon_imports_no_dask"] = out["split_daemon_imports_no_dask"]
    out["goal_parsl_daemon_imports_no_parsl"] = out["split_parsl_daemon_imports_no_parsl"]
    rows.append(("goals met: 1,000-pilot frame < 20 ms, 100-pilot refresh < 5 ms, no Dask "
                 "in the daemon, no Parsl in Parsl's daemon", "  ".join(
                     ("yes" if out[k] else "NO") for k in (
                         "goal_1000_pilots_frame_under_20_ms", "goal_refresh_under_5_ms",
                         "goal_daemon_imports_no_dask",
                         "goal_parsl_daemon_imports_no_parsl"))))
    return {**out, "table": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="7 repeats, one child a side")
    parser.add_argument("--repeats", type=int, default=None, help="frames and refreshes "
                        "timed per size (default: 51; quick: 7)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print_table(run(args.quick, args.repeats)["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
