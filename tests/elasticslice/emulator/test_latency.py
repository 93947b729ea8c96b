"""``serve --latency cloudlab``: CloudLab's pace (scaled here), the CM's calls and the boots;
the default stays fast."""
from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path

import pytest

from elasticslice.emulator.pace import CLOUDLAB_BOOT, CLOUDLAB_FETCH, Latency
from elasticslice.emulator.store import Holder
from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import NodeSpec, build_request
from tests.helpers import spare_port, wait_for
from tests.elasticslice.emulator.helpers import Session, make_tarball, ok

SCALE = 0.002  # 180-480 s boots: 0.36-0.96 s; 10-40 s calls: 0.02-0.08 s


def test_under_the_cloudlab_profile_boots_take_their_drawn_time(emulator_factory):
    emulator = emulator_factory(latency="cloudlab", time_scale=SCALE, seed=7)
    s = Session(emulator)
    urn, cred, _ = s.create()
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {"w1": {}}}))
    ok(s.cm.DeleteNodes({"slice_urn": urn, "credentials": [cred], "nodes": ["w1"]}))
    held = [n for n in emulator.server.ctx.store.nodes() if n.holder is Holder.SLICE]
    times = [n.attrs["boot_seconds"] for n in held]
    assert len(times) == 2 and all(CLOUDLAB_BOOT[0] * SCALE <= t <= CLOUDLAB_BOOT[1] * SCALE
                                   for t in times)
    assert emulator.server.settings.latency.profile == "cloudlab"
    wait_for(lambda: s.status(urn, cred)["status"] == "ready", timeout=30, what="booted")


def test_by_default_nodes_boot_in_the_boot_delay(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    assert all("boot_seconds" not in n.attrs for n in emulator.server.ctx.store.nodes())
    wait_for(lambda: s.status(urn, cred)["status"] == "ready", timeout=30, what="booted")


def test_a_tarball_url_costs_one_fetchtar_proxy_and_wget_retries_a_refused_connection():
    """R14: tarfiles_setup runs one fetchtar.proxy per distinct URL over ssh on the ops
    server, which sleeps 1 s before ``wget --timeout=30 --waitretry=30
    --retry-connrefused`` (20 tries: waits of 1, 2, ... 19 s). Calls, boots and fetches
    draw from streams of their own: the k-th AddNodes takes the same time with --seed
    however many nodes booted before it."""
    paced, none = Latency("cloudlab", time_scale=0.1, seed=5), Latency("none")
    low, high = CLOUDLAB_FETCH
    assert all(low * 0.1 <= paced.fetch_seconds() <= high * 0.1 for _ in range(20))
    assert paced.refused_waits() == [pytest.approx(k * 0.1) for k in range(1, 20)]
    assert none.fetch_seconds() == 0 and none.refused_waits() == []
    busy = Latency("cloudlab", seed=5)
    for _ in range(64):
        busy.boot_seconds()
        busy.fetch_seconds()
    assert busy.call_seconds("AddNodes") == Latency("cloudlab", seed=5).call_seconds("AddNodes")


def _serve_after_first_refusal(emulator, port: int, root: Path) -> threading.Thread:
    """Listen on ``port`` once the CM's tarfiles step has started fetching (its staging
    folder exists) and has had time to be refused a few times."""
    def later() -> None:
        wait_for(lambda: list((emulator.dir / "tarfiles").glob(".staging-*")), timeout=60,
                 what="the tarfiles step")
        time.sleep(0.3)  # a few refusals (waits of 0.05 s, 0.1 s, ...), not a timing check
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
    servers: list[http.server.ThreadingHTTPServer] = []
    thread = threading.Thread(target=later, daemon=True)
    thread.servers = servers  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_a_refused_fetch_is_retried_under_the_cloudlab_profile_and_fails_at_once_without(
        emulator_factory, tmp_path):
    make_tarball(tmp_path / "app.tgz", {"local/app": "x"})
    port = spare_port()
    url = f"http://127.0.0.1:{port}/app.tgz"
    rspec = build_request([NodeSpec("n1", installs=[(url, "/")])])
    plain = emulator_factory()
    s = Session(plain)
    urn, cred = s.register()
    refused = s.cm.CreateSliver({"slice_urn": urn, "rspec": rspec, "credentials": [cred]})
    assert refused["code"] == GeniCode.BADARGS and "refused" in refused["output"], refused
    paced = emulator_factory(latency="cloudlab", time_scale=0.05, seed=1)
    s = Session(paced)
    urn, cred = s.register()
    thread = _serve_after_first_refusal(paced, port, tmp_path)
    try:
        ok(s.cm.CreateSliver({"slice_urn": urn, "rspec": rspec, "credentials": [cred]}))
    finally:
        thread.join(60)
        for httpd in thread.servers:  # type: ignore[attr-defined]
            httpd.shutdown()
            httpd.server_close()
