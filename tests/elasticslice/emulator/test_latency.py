"""``serve --latency cloudlab``: CloudLab's pace (scaled here), the CM's calls and the boots;
the default stays fast."""
from __future__ import annotations

from elasticslice.emulator.pace import CLOUDLAB_BOOT
from elasticslice.emulator.store import Holder
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session, ok

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
