"""Nodes as pilots, end to end: the emulator's nodes run real Troy node agents that join the
cluster's Dask scheduler over TLS; the manager scales to Troy's demand, drains a revoked
node's pilot against the notice's deadline and releases it early, requeues the units of a
node taken without notice, gives idle nodes back, and survives its own crash."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import troy
from elasticslice.pilots.timeline import run_timeline
from tests.elasticslice.rpc.endpointkit import Callers, call
from tests.helpers import holds_for, scrape_metrics, wait_for
from tests.elasticslice.managers.helpers import admin, cm_nodes, reclaim_outcome
from tests.elasticslice.pilots.helpers import (Run, assert_nothing_lost, busy_added_node,
                                             closed_gate, node_of, ran_on, sleepers)

pytestmark = pytest.mark.slow


def test_the_slice_grows_under_demand_and_idle_nodes_go_back(emulator, make_cluster, witness,
                                                              tmp_path: Path) -> None:
    # stock-image nodes, as on CloudLab: each builds the agent's environment from the
    # wheelhouse and enrols with its token before its pilot joins
    cluster = make_cluster(emulator, stock=True, maxthreshold=5, idle_timeout=1.0)
    assert not cluster.helper.has_environment  # the nodes build it
    # 24 cores, 8 a node; no unit ends before the test looked (broke: on a loaded machine
    # two had ended by the time the third pilot came up, and 2 nodes were wanted)
    gate = closed_gate(witness)
    run = Run(cluster, sleepers(witness, 6, 3.0, cores=4, gate=gate))
    wait_for(lambda: len(cluster.pilots()) == 3, timeout=120, what="3 pilots under demand")
    snap = cluster.snapshot()
    assert snap.nodes_held == 3 and snap.pilot_cores == (8, 8, 8) and snap.nodes_wanted == 3
    gate.unlink()
    stats = assert_nothing_lost(cluster, run, witness, 6)
    assert stats["nodes_peak"] == 3  # what the demand asked for, not maxthreshold
    nodes = {line for lines in ran_on(witness).values() for line in lines}
    assert len(nodes) >= 2 and nodes <= set(cluster.manager.node_helper.known_client_ids)
    # Idle: back down to minthreshold (the initial node stays); no busy node was taken.
    wait_for(lambda: len(cm_nodes(emulator, tmp_path)) == 1
             and len(cluster.manager.state.nodes()) == 1, timeout=120,
             what="idle nodes given back")
    assert [r.initial for r in cluster.manager.state.nodes()] == [True]
    assert cluster.stats()["units_requeued"] == 0
    assert len(cluster.pilots()) == 1


def test_a_revoked_node_is_released_early_and_one_taken_without_notice_has_its_units_requeued(
        emulator_factory, make_cluster, witness_for, tmp_path: Path) -> None:
    """One cluster, two revocations (they were two tests, each with a cluster of its own):
    1. with a notice (30 s): the node is drained and released early, nothing is lost; the
       metrics and the report's timeline say so;
    2. then CloudLab cannot wait (its max_wait_time 0, set on the running emulator): a busy
       node goes without notice, its units are requeued and run elsewhere, nothing lost."""
    emulator = emulator_factory(max_wait=30, notify_interval=0.3)
    witness = witness_for(emulator)
    started = time.time()
    cluster = make_cluster(emulator, maxthreshold=3, idle_timeout=None, metrics_port=0)
    run = Run(cluster, sleepers(witness, 12, 3.0, cores=4))
    victim = busy_added_node(cluster, run)
    node_id = node_of(cluster, victim).node_id
    survivors = [p for p in cluster.pilots() if p.worker_name != victim]
    admin(emulator).call("Revoke", nodes=[node_id])
    wait_for(lambda: reclaim_outcome(emulator, node_id), timeout=120,
             what="the reclamation to end")
    # its units could finish well before the 30 s deadline: the node went back early
    assert reclaim_outcome(emulator, node_id) == "early"
    # CloudLab's values (sent before the notice) reached Troy's pilots
    wait_for(lambda: all(p.value is not None for p in survivors), timeout=60,
             what="the resource values on the pilots")
    stats = assert_nothing_lost(cluster, run, witness, 12)
    assert (stats["revocations"], stats["early_releases"], stats["forced_releases"]) == \
        (1, 1, 0), stats
    assert victim not in cm_nodes(emulator, tmp_path)
    # the metrics endpoint reports it, as a scraper reads it
    assert cluster.metrics_url.startswith("http://127.0.0.1:")
    got = scrape_metrics(cluster.metrics_url)
    plain = {name: value for (name, labels), value in got.items() if not labels}
    assert (plain["elasticslice_notices_total"], plain["elasticslice_early_releases_total"],
            plain["elasticslice_forced_releases_total"]) == (1, 1, 0), got
    assert (plain["elasticslice_units_queued"], plain["elasticslice_units_running"],
            plain["elasticslice_units_lost_total"]) == (0, 0, 0), got
    assert got[("elasticslice_nodes_held", ())] == len(cluster.manager.state.nodes())
    assert got[("elasticslice_cm_call_duration_seconds_count", (("method", "DeleteNodes"),))] >= 1
    assert got[("elasticslice_cycle_last_success_age_seconds",
                (("method", "update_sliver_status"),))] >= 0
    # the report's timeline (what troy plot marks): the victim's pilot by its node, and its
    # notice, drain and early release in that order
    timeline = run_timeline(cluster, started)
    assert {v["node"] for v in timeline["pilots"].values()} >= {victim, *(
        p.worker_name for p in survivors)}
    # each pilot at its node's own manifest address (the box's nodes on networks of their
    # own; on the shared network, the fallback, all at 127.0.0.1)
    hosts = {v["node"]: v["host"] for v in timeline["pilots"].values()}
    if emulator.control_address == "127.0.0.1":
        assert set(hosts.values()) == {"127.0.0.1"}, hosts
    else:
        assert len(set(hosts.values())) == len(hosts), hosts
        assert all(h.startswith(emulator.control_address.rsplit(".", 2)[0] + ".")
                   and h != emulator.control_address for h in hosts.values()), hosts
    mine = [(e["kind"], e.get("why")) for e in timeline["events"] if e["node"] == victim]
    assert mine == [("notice", None), ("drain", None), ("release", "early")], timeline
    assert all(started <= e["time"] for e in timeline["events"])

    # 2. a node taken without notice (this was test_a_node_taken_without_notice_has_its_
    # units_requeued, on an emulator of max_wait 0 from the start)
    emulator.server.ctx.settings.max_wait = 0  # CloudLab cannot wait: max_wait_time 0
    before = cluster.stats()
    witness = witness_for(emulator)  # the units' indexes start again at 0
    # the units are still there when the victim goes: they end once it has gone
    gate = closed_gate(witness)
    run = Run(cluster, sleepers(witness, 8, 6.0, cores=4, gate=gate))
    victim = busy_added_node(cluster, run)
    node_id = node_of(cluster, victim).node_id
    admin(emulator).call("Revoke", nodes=[node_id])
    wait_for(lambda: reclaim_outcome(emulator, node_id), timeout=120,
             what="the reclamation to end")
    assert reclaim_outcome(emulator, node_id) == "forced"
    gate.unlink()
    stats = assert_nothing_lost(cluster, run, witness, 8)
    # what ran there ran again elsewhere: requeued by Troy, or rerun by Dask when the node
    # went before its last notice arrived (as on CloudLab: at max_wait_time 0 "the node may
    # already be gone"); Troy counts both
    assert all(victim not in nodes for nodes in ran_on(witness).values())
    assert stats["units_requeued"] - before["units_requeued"] >= 1, (before, stats)
    assert (stats["revocations"] - before["revocations"],
            stats["early_releases"] - before["early_releases"],
            stats["forced_releases"] - before["forced_releases"]) == (1, 0, 1), (before, stats)


def foreign_notices_change_nothing(cluster: Any, emulator: Any, tmp_path: Path) -> None:
    """Notices that name a node we do not hold (mismatched ids, a node_id without its
    client_id, strangers) drain nothing, change nothing and count apart."""
    manager = cluster.manager
    one, two, three = sorted(manager.state.nodes(), key=lambda r: r.client_id)
    cm = Callers(emulator.dir, tmp_path).cm(manager.endpoint_url)

    def notify(method: str, items: list[dict[str, Any]]) -> Any:
        return call(manager.endpoint_url, cm, method, {"nodelist": items})

    strangers = [
        {"node_id": "pc999", "client_id": one.client_id, "max_wait_time": 60},  # our client_id
        {"node_id": one.node_id, "client_id": two.client_id, "max_wait_time": 60},  # swapped
        {"node_id": "pc998", "client_id": "node-99", "max_wait_time": 60},     # neither
    ]
    answer = notify("NotifyDeletePending", strangers)
    assert answer["code"] == 0
    assert [n["max_wait_time"] for n in answer["value"]] == [0, 0, 0]  # we do not hold them
    bare = notify("NotifyDeletePending", [{"node_id": two.node_id, "max_wait_time": 60}])
    assert bare["value"] == [{"node_id": two.node_id, "max_wait_time": 0}]  # no client_id
    complete = notify("NotifyDeleteComplete", [
        {"node_id": "pc997", "client_id": two.client_id},
        {"node_id": two.node_id, "client_id": one.client_id}])
    assert complete["code"] == 0
    held = [one.client_id, two.client_id, three.client_id]

    def untouched() -> None:
        pilots = cluster.pilots()
        assert len(pilots) == 3 and not any(p.draining for p in pilots), pilots
        assert manager.drains == {}
        assert sorted(r.client_id for r in manager.state.nodes()) == held
        assert len(cm_nodes(emulator, tmp_path)) <= 3  # no replacement for a phantom
    holds_for(untouched, seconds=3.0)
    stats = manager.stats()
    assert (stats["revocations"], stats["early_releases"], stats["forced_releases"]) == \
        (0, 0, 0), stats
    assert stats["foreign_notices"] == 6  # each distinct (node_id, client_id), apart
    assert manager.state.pending_deletes() == []


def crash(manager: Any) -> None:
    """Stop a manager as a crash would: its cycle and endpoint die, nothing is cleaned up
    (the endpoint stays registered at the CM, notices in memory are lost)."""
    manager.cycle.stop()
    if manager.endpoint_server is not None:
        manager.endpoint_server.stop()


def test_foreign_notices_change_nothing_and_a_manager_restarted_mid_workflow_resumes(
        emulator, make_cluster, witness, tmp_path: Path) -> None:
    """Mid-workflow, three busy pilots:

    1. a notice counts only for a node we hold whose node_id AND client_id match our
       manifest (this was tests/elasticslice/pilots/test_notice_trust.py, on a cluster of
       its own). Before, notices were trusted by client_id alone: a NotifyDeletePending
       naming an unknown node_id with our client_id drained our pilot for good (and the
       manager then held more nodes than its maxthreshold); a NotifyDeleteComplete naming
       an unknown node_id with our client_id killed a running pilot; notices about nodes we
       do not hold were counted as revocations and early releases. Now they are answered
       max_wait_time 0, drain nothing, change nothing, and are counted apart;
    2. the manager crashes and another takes over: the workflow resumes on the same
       pilots, nothing added twice, nothing requeued."""
    cluster = make_cluster(emulator, maxthreshold=3, idle_timeout=None)
    gate = closed_gate(witness)   # mid-workflow until the new manager runs
    run = Run(cluster, sleepers(witness, 12, 4.0, cores=4, gate=gate))
    wait_for(lambda: len(cluster.pilots()) == 3 and all(p.busy for p in cluster.pilots()),
             timeout=120, what="3 busy pilots")
    before = {p.id for p in cluster.pilots()}
    old = cluster.manager
    foreign_notices_change_nothing(cluster, emulator, tmp_path)
    cluster.set_bounds(2, 3)   # as CloudLabCluster.adapt(minimum=2) does
    assert (old.minthreshold, old.maxthreshold) == (2, 3)
    crash(old)
    assert ran_on(witness) == {}  # mid-workflow: no unit ended
    manager = cluster.replace_manager()
    old.state.close()
    # the bounds are the cluster's policy's: the new manager has them (it had the
    # constructor's before, and an adapt's bounds were lost with the old manager)
    assert (manager.minthreshold, manager.maxthreshold) == (2, 3)
    wait_for(lambda: manager.cycle.methods["add_nodes"].runs >= 3, timeout=60,
             what="the new manager's cycle")
    gate.unlink()
    stats = assert_nothing_lost(cluster, run, witness, 12)
    held = cm_nodes(emulator, tmp_path)
    assert len(held) == 3 and len(set(held)) == 3  # no duplicate adds
    assert sorted(r.client_id for r in manager.state.nodes()) == sorted(held)
    assert before <= {p.id for p in cluster.pilots()}  # the same pilots carried on
    assert stats["units_requeued"] == 0 and stats["duplicates"] == 0, stats
    assert troy.State.DONE is run.state
