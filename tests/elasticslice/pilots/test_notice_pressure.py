"""CloudLab's notices are answered at once, whatever the CM does to the manager's own calls.

The pilots manager on the emulator while the CM takes 30 s in AddNodes, or answers BUSY
and the client backs off: every NotifyDeletePending is answered while that call is still
in flight, the doomed pilot starts no unit after the notice, and its drain has the
notice's deadline. Before, one lock was held through every cycle method, RPCs and
back-offs included, and the endpoint's handlers took it too: the answer waited for the
AddNodes (CloudLab's call had given up by then) and the node went by force.
"""
from __future__ import annotations

import logging
import ssl
import threading
import time
import xmlrpc.client
from pathlib import Path
from typing import Any

import pytest

from elasticslice.rpc.transport import RetryPolicy
from tests.elasticslice.managers.helpers import admin, reclaim_outcome
from tests.elasticslice.pilots.helpers import (Run, assert_nothing_lost, closed_gate,
                                               sleepers)
from tests.elasticslice.rpc.endpointkit import Callers
from tests.helpers import wait_for

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)

CALL_TIMEOUT = 20.0  # a CM's call that waits longer than this has failed


class _Timeout(xmlrpc.client.SafeTransport):
    def make_connection(self, host: Any) -> Any:
        conn = super().make_connection(host)
        conn.timeout = CALL_TIMEOUT
        return conn


def as_cm(emulator: Any, tmp: Path, url: str, method: str, items: list[dict]) -> Any:
    """Call the manager's endpoint as the CM does (its certificate)."""
    ctx: ssl.SSLContext = Callers(emulator.dir, tmp).cm(url)
    proxy = xmlrpc.client.ServerProxy(url, transport=_Timeout(context=ctx))
    try:
        return getattr(proxy, method)({"nodelist": items})
    finally:
        proxy("close")()


class StartWatch:
    """Which pilot each unit started on, and when, as the framework shows its units."""

    def __init__(self, framework: Any) -> None:
        self.framework = framework
        self.starts: set[tuple[str, str, float]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            for u in self.framework.live_units():
                if u.pilot and u.start:
                    self.starts.add((u.id, u.pilot, u.start))

    def started_on(self, pilot_id: str, after: float) -> list[str]:
        self._stop.set()
        self._thread.join(5)
        return [u for u, p, start in self.starts if p == pilot_id and start >= after]


def notices_sent(emulator: Any, node_id: str) -> int:
    """How many NotifyDeletePending the CM sent about ``node_id`` (answered or not)."""
    rows = [r for r in admin(emulator).call("Report") if r["node_id"] == node_id]
    return rows[-1]["notifications"] if rows else 0


def full_pilot(cluster: Any, client_id: str) -> Any:
    """The pilot of ``client_id`` once every core of it runs a unit that has started (a
    unit's cores are taken when it is sent; on a loaded machine its process started after
    the notice, and looked like new work the drain let through)."""
    def find() -> Any:
        pilot = cluster.manager.pilot_of(client_id)
        if pilot is None or not pilot.busy or pilot.free_cores != 0:
            return None
        units = [u for u in cluster.framework.live_units() if u.pilot == pilot.id]
        return pilot if units and all(u.start for u in units) else None
    return wait_for(find, timeout=120, what=f"the pilot of {client_id} full")


def revoke_as_cm_while(cluster: Any, emulator: Any, tmp_path: Path, busy: Any,
                       what: str) -> None:
    """The one pilot runs gated units while ``busy()`` (the CM holds our AddNodes); a
    notice for its node is answered while that lasts, its drain has the notice's
    deadline (and a countdown's earlier one), and it starts nothing afterwards."""
    manager = cluster.manager
    node = manager.state.node(manager.cmlist[0], "node-1")
    pilot = full_pilot(cluster, "node-1")
    watch = StartWatch(cluster.framework)
    item = {"node_id": node.node_id, "client_id": node.client_id, "max_wait_time": 60}
    sent = time.time()
    answer = as_cm(emulator, tmp_path, manager.endpoint_url, "NotifyDeletePending", [item])
    answered = time.time()
    assert busy(), f"the notice was answered only once {what} was over"
    assert answer["code"] == 0 and answer["value"] == [item]  # busy: not released yet
    log.info("NotifyDeletePending answered in %.0f ms while %s", (answered - sent) * 1000,
             what)
    plan = wait_for(lambda: manager.drains.get(node.node_id), what="the drain")
    revocation = manager.state.revocations.get(node.node_id)
    assert plan.deadline == revocation.deadline   # one deadline, carried unchanged
    assert sent + 60 <= revocation.deadline <= answered + 60
    sooner = as_cm(emulator, tmp_path, manager.endpoint_url, "NotifyDeletePending",
                   [{**item, "max_wait_time": 40}])   # the countdown: earlier, never later
    assert busy() and sooner["code"] == 0
    wait_for(lambda: plan.deadline == manager.state.revocations.get(node.node_id).deadline
             < revocation.deadline, what="the countdown's deadline in the drain")
    return pilot, watch, sent


def test_notices_are_answered_while_addnodes_takes_30_s(witness_for, emulator_factory,
                                                         make_cluster, tmp_path: Path) -> None:
    emulator = emulator_factory(slow={"AddNodes": 30.0})
    witness = witness_for(emulator)
    pressure = emulator.server.pressure
    cluster = make_cluster(emulator, maxthreshold=2, idle_timeout=None)
    gate = closed_gate(witness)
    run = Run(cluster, sleepers(witness, 4, 1.0, cores=4, gate=gate))
    wait_for(lambda: pressure.in_flight("AddNodes"), timeout=120, what="AddNodes in flight")
    pilot, watch, sent = revoke_as_cm_while(
        cluster, emulator, tmp_path, lambda: pressure.in_flight("AddNodes") == 1,
        "AddNodes took 30 s")
    gate.unlink()
    pressure.relieve()
    assert_nothing_lost(cluster, run, witness, 4)
    assert watch.started_on(pilot.id, after=sent) == []


def test_notices_are_answered_while_the_client_backs_off_a_busy_cm(
        witness_for, emulator_factory, make_cluster, tmp_path: Path) -> None:
    emulator = emulator_factory(busy={"AddNodes": 1.0})
    witness = witness_for(emulator)
    pressure = emulator.server.pressure
    cluster = make_cluster(emulator, maxthreshold=2, idle_timeout=None)
    # as CloudLab's clients do: seconds between tries (not the suite's fast retries)
    cluster.server.transport.retry = RetryPolicy(attempts=100, base_delay=1.0, max_delay=4.0)
    adding = cluster.manager.cycle.methods["add_nodes"]
    gate = closed_gate(witness)
    run = Run(cluster, sleepers(witness, 4, 1.0, cores=4, gate=gate))
    wait_for(lambda: adding.running and pressure.busy_answers("AddNodes") >= 3, timeout=120,
             what="add_nodes in BUSY back-off")
    runs = adding.runs
    pilot, watch, sent = revoke_as_cm_while(
        cluster, emulator, tmp_path, lambda: adding.running and adding.runs == runs,
        "the client backed off")
    gate.unlink()
    pressure.relieve()
    assert_nothing_lost(cluster, run, witness, 4)
    assert watch.started_on(pilot.id, after=sent) == []


def test_a_15_s_notice_during_a_20_s_addnodes_ends_early_with_nothing_lost(
        witness_for, emulator_factory, make_cluster, tmp_path: Path) -> None:
    """CloudLab revokes a node (its replacement's AddNodes takes 20 s), then another while
    that AddNodes is in flight: both drain, both go back early, no unit is lost."""
    emulator = emulator_factory(max_wait=15, notify_interval=1.0)
    witness = witness_for(emulator)
    pressure = emulator.server.pressure
    cluster = make_cluster(emulator, maxthreshold=3, idle_timeout=None)
    manager = cluster.manager
    gate = closed_gate(witness)
    run = Run(cluster, sleepers(witness, 6, 1.0, cores=4, gate=gate))
    for client_id in ("node-1", "node-2", "node-3"):
        full_pilot(cluster, client_id)
    pressure.set(slow={"AddNodes": 20.0})
    first, second = (manager.state.node(manager.cmlist[0], c).node_id
                     for c in ("node-2", "node-3"))
    admin(emulator).call("Revoke", nodes=[first])
    wait_for(lambda: pressure.in_flight("AddNodes"), timeout=60,
             what="the replacement's AddNodes in flight")
    admin(emulator).call("Revoke", nodes=[second])
    wait_for(lambda: notices_sent(emulator, second), timeout=60, what="the second notice")
    assert pressure.in_flight("AddNodes") == 1
    gate.unlink()
    for node_id in (first, second):
        wait_for(lambda: reclaim_outcome(emulator, node_id), timeout=120,
                 what=f"the reclamation of {node_id} to end")
        assert reclaim_outcome(emulator, node_id) == "early"
    for node_id in (first, second):  # the drain's deadline is the notice's: the first
        # notice's arrival + 15 s, or earlier where a countdown notice (received later, with
        # a max_wait_time rounded up) said so; never later (broke: recomputed after a wait)
        # (a countdown notice that came once the drain had emptied the node, or after the
        # node was given back, may still bring the record's deadline earlier: there was no
        # drain left to hurry; a fresh-clone run saw one 95 ms after the drain emptied and
        # 28 ms before the release)
        revocation = [r for r in manager.state.pending_deletes() if r.node_id == node_id][0]
        plan = manager.drains[node_id]
        over = [t for t in (plan.emptied_at, revocation.released) if t is not None]
        assert plan.deadline == revocation.deadline or (
            over and revocation.last_seen > min(over)
            and plan.deadline > revocation.deadline), (plan, revocation)
        assert revocation.deadline <= plan.deadline <= revocation.first_seen + 15
    pressure.relieve()
    stats = assert_nothing_lost(cluster, run, witness, 6)
    assert (stats["revocations"], stats["early_releases"], stats["forced_releases"]) == \
        (2, 2, 0), stats
