"""``CloudLabCluster``: Dask's idiom over the elastic slice. Fast: its arguments and the
demand-source arithmetic. Slow: one cluster lifetime against the box with real workers on
emulated nodes (adapt grows it, a revoked busy node is retired by Dask and goes back early,
idle it shrinks to the minimum without flapping, the dashboard answers)."""
from __future__ import annotations

import dataclasses
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from elasticslice.dask import CloudLabCluster
from elasticslice.pilots.manager import extra_cores
from tests.elasticslice.managers.helpers import FAST_INTERVALS, FAST_POLICY, admin, \
    reclaim_outcome
from tests.elasticslice.pilots.helpers import Witness, pilot_image
from tests.helpers import wait_for


# ---------------------------------------------------------------- fast: arguments ----------
@pytest.mark.parametrize("options, message", [
    ({"minimum": 0}, "minimum: expected an integer >= 1, got 0"),
    ({"maximum": "4"}, "maximum: expected an integer >= 1, got '4'"),
    ({"minimum": 3, "maximum": 2}, "minimum 3 is more than maximum 2"),
    ({"cores": 0}, "cores: expected an integer >= 1, got 0"),
    ({"memory": "lots"}, "memory: expected bytes or a size such as '64 GiB', got 'lots'"),
    ({"security": False}, "security: the scheduler speaks TLS only"),
    ({"image": "a", "disk_image": "b"}, "give image or disk_image, not both"),
    ({"maxthreshold": 3}, "maxthreshold: give it as maximum instead"),
])
def test_bad_arguments_are_one_clear_line_before_anything_starts(options: dict[str, Any],
                                                                   message: str) -> None:
    with pytest.raises(ValueError, match="^CloudLabCluster: ") as err:
        CloudLabCluster(**options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_memory_is_recorded_in_bytes() -> None:
    from elasticslice.dask import _memory
    assert _memory("2 GiB") == 2 * 2**30 and _memory(1000) == 1000 and _memory(None) is None


def test_extra_demand_adds_cores_and_nodes_in_cores() -> None:
    assert extra_cores([], 8) == 0
    assert extra_cores([(3, "cores"), (2, "nodes")], 8) == 3 + 16
    assert extra_cores([(2.5, "cores"), (1.2, "nodes")], 8) == 3 + 16  # rounded up
    # nothing asked, or a source with no opinion: nothing
    assert extra_cores([(0, "nodes"), (None, "cores"), (-2, "nodes")], 8) == 0
    # no node seen yet: a node counts one core, which asks for the first node
    assert extra_cores([(4, "nodes")], None) == 4


# ---------------------------------------------------------------- slow: the box ------------
def direction_changes(steps: list[tuple[float, int]]) -> list[float]:
    """When the node count's direction changed, from (time, +1/-1) steps in time order."""
    out, last = [], 0
    for at, step in steps:
        if last and step != last:
            out.append(at)
        last = step
    return out


@pytest.mark.slow
def test_adapt_grows_survives_a_revocation_and_shrinks_back(emulator_factory, tmp_path: Path,
                                                            monkeypatch) -> None:
    from dask.distributed import Client
    emulator = emulator_factory(max_wait=30, notify_interval=0.3)
    monkeypatch.setenv("ELASTICSLICE_CREDENTIAL_CACHE_DIR", str(tmp_path / "cache"))
    witness = Witness()
    cooldown = 3.0
    policy = dataclasses.replace(FAST_POLICY, add_cooldown=cooldown, delete_cooldown=cooldown,
                                 max_delete_per_cycle=1)
    cluster = CloudLabCluster(config=emulator.config_path, state_dir=tmp_path / "dask",
                              maximum=4, disk_image=pilot_image(emulator),
                              node_python="python3", intervals=FAST_INTERVALS, margin=1.0,
                              policy=policy, idle_timeout=1.0)
    try:
        with Client(cluster) as client:
            cluster.adapt(minimum=1, maximum=4, target_duration="1s")
            gate = witness.gate("work")

            def gated(i: int, url: str = gate.url) -> int:
                import time
                import urllib.error
                import urllib.request
                while True:   # the test says when the work may end
                    try:
                        urllib.request.urlopen(url, timeout=5).close()
                        break
                    except urllib.error.HTTPError:
                        time.sleep(0.05)
                time.sleep(0.3)
                return i * i

            futures = client.map(gated, range(64))
            manager = cluster.manager
            initial = manager.state.nodes()[0].client_id

            def busy_added() -> str | None:
                names = {w: i["name"] for w, i in client.scheduler_info()["workers"].items()}
                for addr, keys in client.processing().items():
                    if keys and names.get(addr) not in (None, initial):
                        return addr
                return None
            victim = str(wait_for(busy_added, timeout=120, what="a busy added node"))
            assert cluster.nodes() > 1                      # grown past one node
            name = client.scheduler_info()["workers"][victim]["name"]
            node_id = manager.state.node(manager.cmlist[0], name).node_id
            admin(emulator).call("Revoke", nodes=[node_id])
            wait_for(lambda: reclaim_outcome(emulator, node_id), timeout=60,
                     what="the reclamation to end")
            assert reclaim_outcome(emulator, node_id) == "early"
            gate.open()
            assert client.gather(futures) == [i * i for i in range(64)]
            # idle: back to the minimum
            wait_for(lambda: cluster.nodes() == 1, timeout=120, what="back to one node")
            with urllib.request.urlopen(cluster.dashboard_link, timeout=10) as page:
                assert page.status == 200
            logs = cluster.get_logs(workers=False)
            assert "Scheduler" in logs and "Manager" in logs
        stats = manager.stats()
        assert (stats["revocations"], stats["early_releases"], stats["forced_releases"]) == \
            (1, 1, 0)
        # the policy's own steps (the revocation is CloudLab's): at most one direction
        # change per cooldown
        rows = manager.state.nodes(include_gone=True)
        steps = sorted([(r.added_at, 1) for r in rows if r.added_at and not r.initial]
                       + [(r.gone_at, -1) for r in rows
                          if r.gone_at and r.node_id != node_id])
        changes = direction_changes(steps)
        assert all(b - a >= cooldown for a, b in zip(changes, changes[1:])), steps
        assert len(changes) <= 2, steps
    finally:
        cluster.close()
        witness.close()
