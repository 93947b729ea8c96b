"""Node ready -> the node agent's environment built, on the box's nodes.

    .venv/bin/python bench/bench_join.py [--quick]

A node booted from the STOCK image runs a start script whose first line tells the bench it
started (the node is ready: the box runs the startup command then), then builds the agent's
environment with the image's ``python3`` from the control node's wheelhouse served over HTTP
at the box's control address (:func:`elasticslice.pilots.bootstrap.env_script`), as the
experiment's user (the box runs startup commands as CloudLab does), then imports the agent
(``troy.frameworks.dask.agent``, ``distributed``: the first import compiles them). Each
step calls a small HTTP server of the bench (curl, in the image), which keeps the times.

Cases:

- the wheelhouse built on the control node from nothing (a fresh cache), then from its cache;
- a stock node, the wheelhouse already built: node ready -> environment built -> agent
  imported (median of 3 nodes; quick: 1);
- the same node's startup run a second time (a reboot): the environment is found complete;
- the same stock node building it with pip instead (``python pip.whl/pip install --no-deps
  --no-index --find-links``), what env_script does not do;
- a node booted from the custom image ``ELASTICSLICE-PILOT`` (the agent in the image,
  ``node_python``): nothing to build (``env_script(None)``), the agent imported.

Last, the whole path: an ``ElasticCluster`` adds a node; node ready (as its manager sees
it) -> the node's pilot joined (stock image: environment built, enrolled; and the custom
image with ``node_python``). ``run(quick)`` is
the harness's entry (``python -m bench --only join``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import http.server
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticslice.config import load_config  # noqa: E402
from elasticslice.emulator import EmulatorServer, init_emulator  # noqa: E402
from elasticslice.pilots.bootstrap import env_script  # noqa: E402
from elasticslice.pilots.wheelhouse import Wheelhouse  # noqa: E402
from elasticslice.rpc.client import ProtoGeniServer  # noqa: E402
from elasticslice.rspec import NodeSpec, build_request  # noqa: E402

TIMEOUT = 300.0
IMPORT = '"$py" -c "import troy.frameworks.dask.agent, distributed"'


class Clock:
    """``GET /<node>/<event>`` records when it arrived; ``/files/...`` serves files."""

    def __init__(self, files: Path, host: str = "127.0.0.1") -> None:
        self.times: dict[tuple[str, str], float] = {}
        self.cond = threading.Condition()
        clock = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(files), **kwargs)

            def do_GET(self) -> None:  # noqa: N802
                parts = self.path.strip("/").split("/")
                if parts[0] == "t" and len(parts) == 3:
                    with clock.cond:
                        clock.times[(parts[1], parts[2])] = time.monotonic()
                        clock.cond.notify_all()
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, node: str, event: str) -> float:
        deadline = time.monotonic() + TIMEOUT
        with self.cond:
            while (node, event) not in self.times:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(f"timed out waiting for {node} to say {event}")
                self.cond.wait(left)
            return self.times[(node, event)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _tell(clock: Clock, event: str) -> str:
    return f'curl -sf "{clock.url}/t/$node/{event}" >/dev/null\n'


def start_script(clock: Clock, build: str) -> str:
    """start.sh NAME: tells the clock it started, builds, tells, imports the agent, tells."""
    return ("#!/bin/sh\nnode=$1\n" + _tell(clock, "start") + build + _tell(clock, "built")
            + f"{IMPORT} || exit 1\n" + _tell(clock, "imported"))


def pip_build(wheels_url: str, pip: str, target: str = "/local/pilot/env") -> str:
    """The alternative measured: pip (from the wheelhouse's own pip wheel) in a venv."""
    host = wheels_url.split("/")[2]  # plain HTTP off loopback: pip must be told to trust it
    return (f"python3 -m venv --without-pip {target} || exit 1\n"
            f"curl -sf -o /tmp/pip.whl {wheels_url}/{pip} || exit 1\n"
            f"PIP_CONFIG_FILE=/dev/null {target}/bin/python3 /tmp/pip.whl/pip install -q "
            f"--no-cache-dir --no-deps --no-index --trusted-host {host} "
            f"--find-links {wheels_url}/index.html -r {target}.names || exit 1\n"
            f"py={target}/bin/python3\n")


def pilot_image_urn(emu_dir: Path) -> str:
    """The box's ``ELASTICSLICE-PILOT`` image (the stock image with this agent)."""
    from elasticslice.emulator.images import PILOT_IMAGE
    from elasticslice.emulator.setup import load_config as load_emulator
    cfg = load_emulator(emu_dir)
    return f"urn:publicid:IDN+{cfg.domain}+image+{cfg.project}//{PILOT_IMAGE}"


def pilot_joined(root: Path, stock: bool) -> float:
    """The whole path of ``elasticslice run``: an :class:`ElasticCluster` on a fresh box adds
    one node (its tarball fetched by the CM); node ready (as the manager sees it) -> its
    pilot joined the scheduler. ``stock``: the node builds the agent's environment from the
    wheelhouse (already built) and enrols; else the pilot image with ``node_python``."""
    from elasticslice.pilots import ElasticCluster
    d = init_emulator(root / ("emu-stock" if stock else "emu-custom"))
    emu = EmulatorServer(d, port=0, boot_delay=0.2)
    emu.start()
    client = ProtoGeniServer(load_config(d / "elasticslice.conf"))
    options: dict[str, Any] = {} if stock else {"disk_image": pilot_image_urn(d),
                                                "node_python": "python3"}
    cluster = ElasticCluster(client, root / ("cluster-stock" if stock else "cluster-custom"),
                             minthreshold=1, maxthreshold=1, idle_timeout=None,
                             intervals={"update_sliver_status": 0.2, "add_nodes": 0.5},
                             **options)
    try:
        cluster.start()
        deadline = time.monotonic() + TIMEOUT
        ready = None
        while not cluster.pilots():
            if time.monotonic() > deadline:
                raise SystemExit("timed out waiting for the pilot to join")
            if ready is None and any(r.state == "ready"
                                     for r in cluster.manager.state.nodes()):
                ready = time.monotonic()
            time.sleep(0.02)
        joined = time.monotonic()
        return joined - (ready if ready is not None else joined)
    finally:
        cluster.close()
        client.close()
        emu.stop()


class Box:
    """An emulator, a slice, and nodes added one at a time with a start script."""

    def __init__(self, root: Path, www: Path) -> None:
        self.root, self.www = root, www
        d = init_emulator(root / "emu")
        os.environ["ELASTICSLICE_CREDENTIAL_CACHE_DIR"] = str(root / "cache")
        self.emu = EmulatorServer(d, port=0, boot_delay=0.2)
        self.emu.start()
        self.pilot_image = pilot_image_urn(d)
        self.client = ProtoGeniServer(load_config(d / "elasticslice.conf"))
        self.client.register_slice(expiration=dt.datetime.now(dt.timezone.utc)
                                   + dt.timedelta(hours=2))
        self.client.create_sliver(build_request([NodeSpec("base")]))
        self.count = 0
        # what the nodes reach this machine at (its control address: nodes have networks of
        # their own), where the clock and the files are served
        self.clock = Clock(www, self.emu.ctx.boot.control_address())

    def node(self, script: str, runs: int = 1, image: str | None = None,
             extra: dict[str, bytes] | None = None) -> str:
        """Add a node whose startup runs ``script`` ``runs`` times (as NAME-1, NAME-2...)."""
        self.count += 1
        name = f"n{self.count}"
        buf = io.BytesIO()
        # the runs in a script of their own: CloudLab's AddNodes breaks on an '&' in startup
        runs_sh = "".join(f"sh /local/pilot/start.sh {name}-{i} || exit 1\n"
                          for i in range(1, runs + 1))
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path, data, mode in [("local/pilot/start.sh", script.encode(), 0o755),
                                     ("local/pilot/runs.sh", runs_sh.encode(), 0o755),
                                     *((p, d, 0o644) for p, d in (extra or {}).items())]:
                info = tarfile.TarInfo(path)
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
        (self.www / f"{name}.tar.gz").write_bytes(buf.getvalue())
        spec: dict[str, Any] = {"startup": "sh /local/pilot/runs.sh",
                                "tarballs": [f"{self.clock.url}/{name}.tar.gz"]}
        if image:
            spec["diskimage"] = image
        self.client.add_nodes({name: spec})
        return name

    def span(self, name: str, start: str = "start", end: str = "built") -> float:
        return self.clock.wait(name, end) - self.clock.wait(name, start)

    def close(self) -> None:
        self.client.close()
        self.clock.close()
        self.emu.stop()


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-join-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        house = Wheelhouse.for_python(
            subprocess.run(["/usr/bin/python3", "-c", "import sys; print(*sys.version_info[:2],"
                            " sep='.')"], capture_output=True, text=True,
                           check=True).stdout.strip(), root=root / "wheelhouse")
        out["wheelhouse_build_cold_s"] = time.perf_counter() - started
        started = time.perf_counter()
        Wheelhouse.for_python(house.python, root=root / "wheelhouse")
        out["wheelhouse_build_cached_s"] = time.perf_counter() - started
        out["wheelhouse_wheels"] = len(house.wheels)
        out["wheelhouse_mb"] = sum(w.stat().st_size for w in house.wheels) / 1e6
        www = root / "www"
        www.mkdir()
        os.symlink(house.directory, www / "wheelhouse")
        box = Box(root, www)
        clock = box.clock
        try:
            url = f"{clock.url}/wheelhouse"
            build = env_script(url, root=False)  # one wheelhouse, served as a folder
            names = [box.node(start_script(clock, build), runs=2 if i == 0 else 1)
                     for i in range(repeats)]
            builds = [box.span(f"{n}-1") for n in names]
            imports = [box.span(f"{n}-1", "start", "imported") for n in names]
            out["stock_env_built_s"] = statistics.median(builds)
            out["stock_agent_imported_s"] = statistics.median(imports)
            out["stock_second_run_env_s"] = box.span(f"{names[0]}-2")
            out["stock_second_run_imported_s"] = box.span(f"{names[0]}-2", "start", "imported")
            node_dirs = list((root / "emu" / "nodes").glob("*/root/local/pilot/env"))
            out["stock_env_mb"] = max(_du(p) for p in node_dirs) / 1e6 if node_dirs else None
            pip_name = next((house.directory / "tools").glob("pip-*.whl")).name
            listing = "".join(f"{w.name.split('-')[0]}=={w.name.split('-')[1]}\n"
                              for w in house.wheels)
            pip_node = box.node(start_script(clock, pip_build(url, f"tools/{pip_name}")),
                                extra={"local/pilot/env.names": listing.encode()})
            out["stock_pip_env_built_s"] = box.span(f"{pip_node}-1")
            out["stock_pip_agent_imported_s"] = box.span(f"{pip_node}-1", "start", "imported")
            custom = box.node(start_script(clock, env_script(None, python="python3")),
                              image=box.pilot_image)
            out["custom_image_env_s"] = box.span(f"{custom}-1")
            out["custom_image_agent_imported_s"] = box.span(f"{custom}-1", "start",
                                                            "imported")
        finally:
            box.close()
        out["stock_pilot_joined_s"] = pilot_joined(root, stock=True)
        out["custom_pilot_joined_s"] = pilot_joined(root, stock=False)
    return out


def run(quick: bool = False) -> dict[str, Any]:
    repeats = 1 if quick else 3
    f = measure(repeats)
    f["repeats"] = repeats
    f["table"] = [
        ("wheelhouse on the control node: built / from its cache",
         f"{f['wheelhouse_build_cold_s']:.1f} s / {f['wheelhouse_build_cached_s']:.2f} s "
         f"({f['wheelhouse_wheels']} wheels, {f['wheelhouse_mb']:.1f} MB)"),
        (f"stock node: ready -> env built -> agent imported (median of {repeats})",
         f"{f['stock_env_built_s']:.1f} s -> {f['stock_agent_imported_s']:.1f} s "
         f"(env {f['stock_env_mb'] or 0:.0f} MB)"),
        ("stock node, second run: env found complete -> agent imported",
         f"{f['stock_second_run_env_s']:.2f} s -> {f['stock_second_run_imported_s']:.1f} s"),
        ("stock node with pip instead: env built -> agent imported",
         f"{f['stock_pip_env_built_s']:.1f} s -> {f['stock_pip_agent_imported_s']:.1f} s"),
        ("custom image (node_python): nothing to build -> agent imported",
         f"{f['custom_image_env_s']:.2f} s -> {f['custom_image_agent_imported_s']:.1f} s"),
        ("ElasticCluster: node ready -> pilot joined, stock image (env, enrolment) / "
         "custom image",
         f"{f['stock_pilot_joined_s']:.1f} s / {f['custom_pilot_joined_s']:.1f} s"),
    ]
    return f


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one stock node, not three")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    figures = run(args.quick)
    for what, value in figures.pop("table"):
        print(f"{what:66} {value}")
    print(json.dumps({k: v for k, v in figures.items()}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
