"""Pilots across sites (issue 37): a slice with nodes at two clusters of one box (utah and
wisc, each its own CM and node network) is one elastic cluster. The manager makes a sliver
at each CM with the real client, every node starts the product's pilot agent from the
slice's tarball, enrols at the control node's enrolment service and joins the one Dask
scheduler at the control machine's public address; each pilot knows its site (its node's
CM), the snapshot and the report say it, and units run on the pilots of both sites."""
from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticslice.emulator import EmulatorServer, init_emulator
from elasticslice.pilots.timeline import run_timeline
from troy import State
from tests.elasticslice.emulator.helpers import FAST, RunningEmulator
from tests.elasticslice.pilots.helpers import Run, Witness, closed_gate, pilot_image, \
    sleepers
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def box(tmp_path: Path) -> Iterator[RunningEmulator]:
    d = init_emulator(tmp_path / "box", 0, clusters=("utah", "wisc"))
    server = EmulatorServer(d, port=0, **FAST).start()
    yield RunningEmulator(d, server)
    server.stop()


def test_nodes_at_both_sites_join_one_scheduler_and_each_site_runs_units(
        box: RunningEmulator, make_cluster, witness_for) -> None:
    out: Witness = witness_for(box)   # at the control machine's public address
    # a sliver at each CM (the manager's ensure_sliver), one node each; no hardware type:
    # the two clusters have none in common
    cluster = make_cluster(box, minthreshold=2, maxthreshold=2, hardware_type=None,
                           disk_image=pilot_image(box), idle_timeout=None)
    manager = cluster.manager
    cm_urls = list(manager.cmlist)
    assert [u.split("/cluster/")[1].split("/")[0] for u in cm_urls] == ["utah", "wisc"]

    def site_pilots() -> dict[str, list]:
        found = collections.defaultdict(list)
        for pilot in cluster.pilots():
            if pilot.state is State.RUNNING and pilot.description.site:
                found[pilot.description.site].append(pilot)
        return found if set(found) == {"utah", "wisc"} else {}

    pilots = wait_for(site_pilots, timeout=120, what="a pilot at each site")
    # each pilot's site is its node's CM's
    held = {r.client_id: r.cm for r in manager.state.nodes()}
    for site, ps in pilots.items():
        for p in ps:
            assert held[p.worker_name].split("/cluster/")[1].startswith(site + "/")
    assert cluster.snapshot().pilot_sites == (("utah", 1), ("wisc", 1))
    timeline = run_timeline(cluster, 0.0)
    assert sorted(e.get("site") for e in timeline["pilots"].values()
                  if e.get("node") in held) == ["utah", "wisc"]
    # units that fill every pilot at once, held until the gate opens: both sites run some
    cores = min(p.size for ps in pilots.values() for p in ps)
    count = sum(p.size // cores for ps in pilots.values() for p in ps)
    gate = closed_gate(out)
    run = Run(cluster, sleepers(out, count, 0.1, cores=cores, gate=gate))

    def running() -> int:
        return sum(u.state is State.RUNNING for t in run.workload.tasks.values()
                   for u in t.units)
    wait_for(lambda: running() == count, timeout=120, what=f"{count} units running at once")
    gate.open()
    assert run.wait() is State.DONE
    ran = {node for nodes in out.ran().values() for node in nodes}
    assert {held[n].split("/cluster/")[1].split("/")[0] for n in ran} == {"utah", "wisc"}


def test_a_dask_cluster_s_workers_at_both_sites_join_one_scheduler(
        box: RunningEmulator, tmp_path: Path, monkeypatch) -> None:
    """``CloudLabCluster`` (its manager in the daemon, Troy and the scheduler here): a
    worker at each cluster, each told its site across the daemon's channel, and Dask runs
    a task on each."""
    import socket

    from dask.distributed import Client
    from elasticslice.dask import CloudLabCluster
    from tests.elasticslice.managers.helpers import FAST_INTERVALS
    monkeypatch.setenv("ELASTICSLICE_CREDENTIAL_CACHE_DIR", str(tmp_path / "cache"))
    cluster = CloudLabCluster(config=box.config_path, state_dir=tmp_path / "dask",
                              minimum=2, maximum=2, disk_image=pilot_image(box),
                              node_python="python3", intervals=FAST_INTERVALS, margin=1.0)
    try:
        with Client(cluster) as client:
            def both() -> dict[str, str | None] | None:
                found = cluster.worker_sites()
                return found if sorted(map(str, found.values())) == ["utah", "wisc"] else None
            sites = wait_for(both, timeout=120, what="a worker at each site, with its site")
            for address, site in sites.items():
                name = client.submit(socket.gethostname, workers=[address],
                                     pure=False).result(timeout=60)
                held = {r.client_id: r.cm for r in cluster.manager.state.nodes()}
                assert f"/cluster/{site}/" in held[name.split(".")[0]], (name, site)
    finally:
        cluster.close()
