"""The running manager: its callback endpoint answers revocations, events wake the cycle."""
from __future__ import annotations

import ssl
import xmlrpc.client
from pathlib import Path
from typing import Any

from elasticslice.managers import SimpleElasticSliceHelper, SimpleElasticSliceManager
from elasticslice.managers.config import EndpointConfig
from elasticslice.rpc.codes import GeniCode
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import user_context
from tests.elasticslice.managers.helpers import admin, cm_nodes, reclaim_outcome


def ready_nodes(manager: Any, count: int) -> bool:
    nodes = manager.state.nodes()
    return len(nodes) == count and all(n.state == "ready" for n in nodes)


class MarkingHelper(SimpleElasticSliceHelper):
    """Delete commands that leave a mark (the node's id) in a directory."""

    def __init__(self, marks: Path) -> None:
        super().__init__(num_pcs=1)
        self.marks = marks

    def get_delete_commands(self, nodelist: list[dict[str, Any]]) -> list[str]:
        return [f"touch {self.marks / n['node_id']}" for n in nodelist]


def test_revocation_is_answered_and_the_node_handed_back_early(
        emulator, make_manager, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    manager = make_manager(emulator, maxthreshold=3, helper=MarkingHelper(marks),
                           endpoint=EndpointConfig())
    manager.start()
    wait_for(lambda: ready_nodes(manager, 3) and manager.registered, timeout=60,
             what="3 ready nodes and the endpoint registered")
    victim = manager.state.node(manager.cmlist[0], "node-3")
    admin(emulator).call("Revoke", nodes=[victim.node_id])
    wait_for(lambda: reclaim_outcome(emulator, victim.node_id), timeout=60,
             what="the reclamation to end")
    assert reclaim_outcome(emulator, victim.node_id) == "early"
    assert (marks / victim.node_id).exists()  # the helper's delete command ran first
    wait_for(lambda: manager.state.node(manager.cmlist[0], "node-3").gone_at is not None,
             timeout=30, what="the manager to forget node-3")
    # It grows back to maxthreshold with a fresh client_id.
    wait_for(lambda: ready_nodes(manager, 3), timeout=60, what="growing back")
    assert "node-3" not in cm_nodes(emulator, tmp_path)
    slice_urn = manager.server.slice_urn()
    assert emulator.server.ctx.store.get_endpoint(slice_urn) is not None
    manager.stop()
    assert emulator.server.ctx.store.get_endpoint(slice_urn) is None  # removed at stop


def test_endpoint_refuses_a_caller_without_the_cms_certificate(
        emulator, make_manager) -> None:
    manager = make_manager(emulator, maxthreshold=1, endpoint=EndpointConfig())
    manager.start()
    wait_for(lambda: manager.registered, timeout=60, what="the endpoint registered")
    # The user's own certificate, from the same CA: not the CM.
    proxy = xmlrpc.client.ServerProxy(manager.endpoint_url, context=user_context(emulator.dir))
    try:
        answer = proxy.NotifyDeletePending({"nodelist": [
            {"node_id": "ms1001", "client_id": "node-1", "max_wait_time": 0}]})
    except (ssl.SSLError, ConnectionError, xmlrpc.client.Fault):
        answer = None
    finally:
        proxy("close")()
    assert answer is None or answer["code"] == GeniCode.FORBIDDEN
    assert not manager.state.pending_deletes()
    assert manager.state.node(manager.cmlist[0], "node-1").gone_at is None


def test_a_demand_change_wakes_add_nodes_at_once(emulator, make_manager) -> None:
    hour = {m: 3600.0 for m in SimpleElasticSliceManager.DEF_ORDER}
    manager = make_manager(emulator, maxthreshold=6, manage_intervals=hour)
    manager.set_demand(2)
    manager.start()
    # the nodes are in the state before the run that added them has ended: wait for both
    wait_for(lambda: len(manager.state.nodes()) == 2 and manager.cycle.methods[
        "add_nodes"].runs >= 1, timeout=60, what="2 nodes, added by add_nodes")
    manager.set_demand(5)  # with hour-long intervals only the wake can do it
    wait_for(lambda: len(manager.state.nodes()) == 5, timeout=60, what="5 nodes")


def cm_context(emulator: Any) -> ssl.SSLContext:
    """What the CM presents when it calls a client endpoint (as the emulator's callbacks)."""
    ctx = ssl.create_default_context(cafile=str(emulator.dir / "ca.pem"))
    ctx.load_cert_chain(str(emulator.dir / "cm.pem"), str(emulator.dir / "cm-key.pem"))
    return ctx


def test_resource_values_are_stored_and_the_lowest_valued_node_goes_first(
        emulator, make_manager, tmp_path: Path) -> None:
    from tests.elasticslice.managers.helpers import POOL, load, with_policy
    manager = make_manager(emulator, maxthreshold=4, enable_delete=True,
                           policy=with_policy(max_delete_per_cycle=1),
                           endpoint=EndpointConfig())
    manager.start()
    wait_for(lambda: ready_nodes(manager, 4) and manager.registered, timeout=60,
             what="4 ready nodes and the endpoint registered")
    nodes = {n.client_id: n.node_id for n in manager.state.nodes()}
    values = {"node-2": 0.9, "node-3": 0.1, "node-4": 0.8}  # node-4 is the newest
    proxy = xmlrpc.client.ServerProxy(manager.endpoint_url, context=cm_context(emulator))
    try:
        answer = proxy.SetResourceValues({"nodelist": [
            {"node_id": nodes[c], "client_id": c, "value": v} for c, v in values.items()]})
    finally:
        proxy("close")()
    assert answer["code"] == GeniCode.SUCCESS
    assert manager.state.values()[nodes["node-3"]] == 0.1
    manager.stop()
    load(emulator, POOL - 4 - 10)  # CloudLab runs short: one node goes back
    assert manager.cycle.run_method("update_available")
    assert manager.cycle.run_method("delete_nodes"), manager.cycle.methods["delete_nodes"]
    assert manager.cycle.run_method("release_nodes"), manager.cycle.methods["release_nodes"]
    assert sorted(cm_nodes(emulator, tmp_path)) == ["node-1", "node-2", "node-4"], \
        (manager.last_decision, manager.availability)


def test_a_sliver_gone_behind_the_manager_is_made_again_at_once(
        emulator, make_manager, tmp_path: Path) -> None:
    """ensure_sliver runs hourly here and does not ask GetSliver while the sliver answers
    SliverStatus: the SliverStatus that finds it gone wakes it, and the sliver is made again
    with the slice's nodes, long before the hour."""
    from tests.elasticslice.managers.helpers import FAST_INTERVALS, client_for
    manager = make_manager(emulator, maxthreshold=2,
                           manage_intervals={**FAST_INTERVALS, "ensure_sliver": 3600.0})
    manager.start()
    wait_for(lambda: ready_nodes(manager, 2), timeout=60, what="2 ready nodes")
    with client_for(emulator, tmp_path / "look") as look:
        look.delete_slice(cancel=True, blocking=True)

        def made_again() -> bool:
            try:
                return len(cm_nodes(emulator, tmp_path)) == 2
            except Exception:   # (SEARCHFAILED until it is made)
                return False
        wait_for(made_again, timeout=60, what="the sliver made again with 2 nodes")
    manager.stop()
