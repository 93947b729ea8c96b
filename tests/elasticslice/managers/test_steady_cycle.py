"""A steady slice's cycle reads an unchanged SliverStatus or advertisement once (issue 36:
most of a 1,000-node cycle was reading the same answers again), and still sees every change:
one at the CM that the manager did not make, and one in its own state with the CM's answer
unchanged."""
from __future__ import annotations

from pathlib import Path

from tests.elasticslice.managers.helpers import POOL, client_for, load
from tests.helpers import wait_for


def _ready(manager, count: int) -> bool:
    manager.update_sliver_status()
    nodes = manager.state.nodes()
    return len(nodes) == count and all(n.state == "ready" for n in nodes)


def test_an_unchanged_answer_is_not_read_again(emulator, make_manager) -> None:
    manager = make_manager(emulator, maxthreshold=3)
    manager.manage_once()
    wait_for(lambda: _ready(manager, 3), timeout=30, what="three nodes ready")
    cm = manager.cms[0]
    first, second = cm.sliver_status(), cm.sliver_status()
    assert second.nodes is first.nodes   # only its time differs: the same records
    assert [n.client_id for n in second.nodes] == ["node-1", "node-2", "node-3"]
    digest, text = cm.advertisement(available=True)
    assert text is not None and "<rspec" in text
    assert cm.advertisement(available=True, since=digest) == (digest, None)
    assert cm.discover_resources(available=True) == text   # the plain call reads it whole


def test_a_change_at_the_cm_the_manager_did_not_make_is_seen(emulator, make_manager,
                                                            tmp_path: Path) -> None:
    manager = make_manager(emulator, maxthreshold=3)
    manager.manage_once()
    wait_for(lambda: _ready(manager, 3), timeout=30, what="three nodes ready")
    manager.update_sliver_status()   # the same answer again: nothing to do
    with client_for(emulator, tmp_path / "other") as other:   # the same user, elsewhere
        other.cm().delete_nodes(["node-3"])
    manager.update_sliver_status()
    assert [n.client_id for n in manager.state.nodes()] == ["node-1", "node-2"]
    gone = manager.state.node(manager.cms[0].url, "node-3")
    assert gone is not None and gone.gone_reason == "not in the sliver any more"
    # availability too: the advertisement changed, so it is read and counted again
    before = manager.availability[manager.cms[0].url]["*"].available
    load(emulator, POOL - 30)
    manager.update_available()
    after = manager.availability[manager.cms[0].url]["*"].available
    assert after <= before - 30   # (the tenants took 40 of them)


def test_a_node_gone_while_cloudlab_s_notice_of_it_is_open_was_taken_back(
        emulator, make_manager, tmp_path: Path) -> None:
    """Regression (a loaded suite run): CloudLab took a revoked node early and the cycle's
    SliverStatus came before NotifyDeleteComplete; the node was recorded as gone for no
    known reason ("not in the sliver any more") where its notice said why."""
    manager = make_manager(emulator, maxthreshold=3)
    manager.manage_once()
    wait_for(lambda: _ready(manager, 3), timeout=30, what="three nodes ready")
    url = manager.cms[0].url
    node = manager.state.node(url, "node-3")
    # what a NotifyDeletePending of node-3 records (the endpoint's notice handler)
    manager.state.revocations.add(url, node.node_id, "node-3", deadline=node.added_at + 600,
                                  now=node.added_at)
    with client_for(emulator, tmp_path / "other") as other:   # CloudLab takes it
        other.cm().delete_nodes(["node-3"])
    manager.update_sliver_status()
    gone = manager.state.node(url, "node-3")
    assert gone is not None and gone.gone_reason == "taken back by CloudLab"


def test_a_change_in_the_managers_own_state_is_checked_against_the_same_answer(
        emulator, make_manager) -> None:
    manager = make_manager(emulator, maxthreshold=2)
    manager.manage_once()
    wait_for(lambda: _ready(manager, 2), timeout=30, what="two nodes ready")
    manager.update_sliver_status()
    url = manager.cms[0].url
    # the manager's state says node-2 went (as a crash between a DeleteNodes and its record
    # could leave it), while the CM's answer is the very same: it is found in the sliver again
    manager.state.mark_gone(url, "node-2", now=manager.clock() - 5.0, reason="test")
    assert [n.client_id for n in manager.state.nodes()] == ["node-1"]
    manager.update_sliver_status()
    assert [n.client_id for n in manager.state.nodes()] == ["node-1", "node-2"]
