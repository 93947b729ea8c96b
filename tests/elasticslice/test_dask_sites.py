"""Dask's ``adapt`` spans sites (issue 37, item 3): a ``CloudLabCluster`` on a box of two
CMs (utah, whose inventory is two nodes, and wisc) holds a sliver at each; Dask's adaptive
target grows it at utah until utah is full, then at wisc, the workers there join the one
scheduler and run tasks; idle, it shrinks, each added node given back at the CM that holds
it, each sliver keeping its first node (docs/dask.md)."""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

from tests.elasticslice.gates import gated
from tests.elasticslice.managers.helpers import FAST_INTERVALS, FAST_POLICY
from tests.elasticslice.pilots.helpers import Witness, pilot_image
from tests.elasticslice.sitesbox import UTAH_NODES, held_per_cm, small_first_site
from tests.helpers import holds_for, wait_for

pytestmark = pytest.mark.slow


def test_adapt_grows_at_the_second_cm_when_the_first_is_full_and_shrinks_at_each(
        tmp_path: Path, monkeypatch) -> None:
    from dask.distributed import Client

    from elasticslice.dask import CloudLabCluster
    from troy.frameworks.dask.framework import scheduler_workers
    monkeypatch.setenv("ELASTICSLICE_CREDENTIAL_CACHE_DIR", str(tmp_path / "cache"))

    with small_first_site(tmp_path / "box") as box:
        witness = Witness(box.control_address)
        # utah fills up to its last free node (no share of it kept free: the manager's
        # seed option, which decides over the policy's), then wisc grows
        cluster = CloudLabCluster(config=box.config_path, state_dir=tmp_path / "dask",
                                  minimum=1, maximum=4, disk_image=pilot_image(box),
                                  node_python="python3", intervals=FAST_INTERVALS,
                                  margin=1.0, policy=FAST_POLICY, idle_timeout=3.0,
                                  manager_options={"percent_available_minimum": 0.0})
        try:
            with Client(cluster) as client:
                cluster.adapt(minimum=1, maximum=4, target_duration="1s")
                gate = witness.gate("grow")
                futures = client.map(lambda i, url=gate.url, ran=witness.url: gated(
                    i * i, url, f"{ran}/ran/{i}"), range(64))

                def four_workers() -> dict[str, str | None] | None:
                    found = cluster.worker_sites()
                    return found if len(found) == 4 and all(found.values()) else None
                sites = wait_for(four_workers, timeout=50, what="four workers, with sites")
                assert collections.Counter(sites.values()) == {"utah": 2, "wisc": 2}
                held = held_per_cm(box, tmp_path / "look")
                assert {k: len(v) for k, v in held.items()} == {"utah": UTAH_NODES, "wisc": 2}
                site_of = {cid: site for site, cids in held.items() for cid in cids}
                first = {site_of[r.client_id]: r.client_id
                         for r in cluster.manager.state.nodes() if r.initial}
                added_at_wisc = [cid for cid in held["wisc"] if cid != first["wisc"]]
                # every worker runs tasks before any may end: the wisc ones too
                wait_for(lambda: sum(bool(keys) for keys in client.processing().values())
                         == 4, timeout=30, what="tasks running on each of the four workers")
                gate.open()
                results = client.gather(futures)
                assert results == [i * i for i in range(64)]
                ran = {node for nodes in witness.ran().values() for node in nodes}
                assert ran == set(site_of) and set(added_at_wisc) <= ran, (ran, held)
                # the results are the client's now: none stays on a worker. (In the box a
                # node cannot reach another cluster's nodes: a retiring worker's results
                # could move only to a worker at its own site, and Dask's retirement may
                # pick one at the other; test_dask_cluster.py checks that, at one site,
                # none is computed again after a give-back.)
                client.cancel(futures)
                del futures
                # idle: back to each sliver's first node, each added node given back at
                # the CM that holds it (minimum 1, but a sliver keeps one node at each CM)
                kept = {site: [cid] for site, cid in first.items()}
                wait_for(lambda: held_per_cm(box, tmp_path / "look") == kept, timeout=40,
                         what="the added nodes given back at their CMs")
                wait_for(lambda: len(scheduler_workers(client)) == 2, timeout=30,
                         what="the given-back nodes' workers gone")

                def still_kept() -> None:
                    assert held_per_cm(box, tmp_path / "look") == kept
                holds_for(still_kept, 2.0, 0.5)   # and it stays so: no node comes back
                assert cluster.nodes() == 2
        finally:
            cluster.close()
            witness.close()
        assert held_per_cm(box, tmp_path / "look") == {"utah": [], "wisc": []}
