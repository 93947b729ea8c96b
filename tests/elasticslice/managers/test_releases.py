"""One way back (issue 35): every node given back is a row of the state's ``to_release``,
and only the actuator gives them back, on the cycle's ``release_nodes`` job.

Before, a policy victim went back on the cycle's thread (``delete_nodes``), a drained node
on a pool of its own ("node-release", ``Actuator.give_back``), and a revoked node whose
delete commands finished not at all; a manager that died between deciding and DeleteNodes
forgot what it had decided.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from elasticslice.managers import SimpleElasticSliceManager
from elasticslice.managers.background import Background
from elasticslice.managers.hosted import HostedSystem
from tests.elasticslice.managers.helpers import cm_nodes, with_policy
from tests.helpers import wait_for


class EarlyManager(SimpleElasticSliceManager):
    """The base manager releasing a revoked node early (``release_early``), as the pilots'
    and Parsl's do; with the pool Parsl's manager once made (the one the early releases went
    on) as a hosted system's thread, unused."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pool = Background("node-release", threads=2)

        class Pool(HostedSystem):
            def threads(self) -> list[Background]:
                return [pool]
        super().__init__(*args, hosted=Pool(), **kwargs)


def spy_deletes(manager: Any) -> list[tuple[str, tuple[str, ...]]]:
    """Every DeleteNodes the manager's CM object makes: (thread name, client_ids)."""
    cm = manager.cms[0]
    real, seen = cm.delete_nodes, []

    def delete_nodes(client_ids: list[str]) -> str:
        seen.append((threading.current_thread().name, tuple(client_ids)))
        return real(client_ids)
    cm.delete_nodes = delete_nodes
    return seen


def gone_reasons(manager: Any) -> dict[str, str]:
    return {n.client_id: n.gone_reason for n in manager.state.nodes(include_gone=True)
            if n.gone_at is not None}


def test_a_drained_node_and_a_policy_victim_go_back_one_way_on_the_release_job(
        emulator, make_manager, tmp_path: Path) -> None:
    manager = make_manager(emulator, cls=EarlyManager, maxthreshold=4, enable_delete=True,
                           policy=with_policy(max_delete_per_cycle=1))
    manager.manage_once()
    assert [n.client_id for n in manager.state.nodes()] == [f"node-{i}" for i in (1, 2, 3, 4)]
    seen = spy_deletes(manager)
    url = manager.cmlist[0]
    drained = manager.state.node(url, "node-2")
    [entry] = manager.notices.pending([{"node_id": drained.node_id, "client_id": "node-2",
                                        "max_wait_time": 300}], manager.clock())
    assert entry.fresh
    manager.set_demand(2)  # node-1, node-3, node-4 count: one too many
    manager.start()
    manager.release_early(drained.node_id, "node-2", "drained")  # from a drain's thread, at once
    wait_for(lambda: len(cm_nodes(emulator, tmp_path)) == 2, timeout=60,
             what="node-2 and a victim given back")
    [victim] = {"node-3", "node-4"} - set(cm_nodes(emulator, tmp_path))
    assert sorted(c for _, cids in seen for c in cids) == ["node-2", victim]
    assert {name.rsplit("_", 1)[0] for name, _ in seen} == {"cycle-release_nodes"}, seen
    wait_for(lambda: not manager.state.to_release.rows(), timeout=30, what="nothing left to release")
    manager.stop()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("node-release")]
    assert gone_reasons(manager) == {"node-2": "released early", victim: "given back"}
    # the book's bookkeeping stays: the countdown was answered max_wait_time 0 from then on
    [revocation] = manager.state.pending_deletes()
    assert revocation.released is not None and revocation.outcome == "early"


def test_what_a_dead_manager_asked_is_given_back_by_the_next_on_its_state(
        emulator, make_manager, tmp_path: Path) -> None:
    first = make_manager(emulator, maxthreshold=3)
    first.manage_once()
    url = first.cmlist[0]
    node_3 = first.state.node(url, "node-3")
    assert first.actuator.ask_release([node_3], "policy", "surplus") == 1
    first.state.to_release.ask(url, "node-9", node_id=None, source="notice", reason="drained",
                            now=first.clock())  # a node it no longer holds
    first.close()  # died before the DeleteNodes
    assert sorted(cm_nodes(emulator, tmp_path)) == ["node-1", "node-2", "node-3"]
    second = make_manager(emulator, maxthreshold=3, state_dir=tmp_path / "state")
    assert [r.client_id for r in second.state.to_release.rows()] == ["node-3", "node-9"]
    seen = spy_deletes(second)
    second.manage_once()
    assert "node-3" not in cm_nodes(emulator, tmp_path)
    assert seen == [(threading.current_thread().name, ("node-3",))]  # node-9: dropped
    assert second.state.to_release.rows() == []
    assert gone_reasons(second) == {"node-3": "given back"}


def test_a_row_whose_deletenodes_may_have_reached_the_cm_waits_for_the_reconcile(
        emulator, make_manager, tmp_path: Path) -> None:
    first = make_manager(emulator, maxthreshold=2)
    first.manage_once()
    url = first.cmlist[0]
    first.actuator.ask_release([first.state.node(url, "node-2")], "policy", "surplus")
    first.state.begin_intent("delete", url, ["node-2"], now=first.clock())
    first.server.cm().delete_nodes(["node-2"])  # the CM took it; the manager died here
    first.close()
    second = make_manager(emulator, maxthreshold=2, state_dir=tmp_path / "state")
    seen = spy_deletes(second)
    assert second.release_nodes() == 0 and seen == []  # not asked twice
    second.update_sliver_status()  # the reconcile: node-2 is not there
    assert second.release_nodes() == 0 and seen == []
    assert second.state.to_release.rows() == []
    assert gone_reasons(second) == {"node-2": "deleted (reconciled)"}


def test_a_sliver_s_every_node_is_never_asked_of_the_cm_at_once(
        emulator, make_manager, tmp_path: Path) -> None:
    manager = make_manager(emulator, maxthreshold=2)
    manager.manage_once()
    url = manager.cmlist[0]
    nodes = manager.state.nodes(url)
    manager.actuator.ask_release(nodes[:1], "notice", "drained")
    manager.actuator.ask_release(nodes[1:], "policy", "surplus")
    assert manager.release_nodes() == 1  # CloudLab refuses a sliver's every node
    assert cm_nodes(emulator, tmp_path) == ["node-1"]
    # the revoked node stays (CloudLab takes it by its deadline anyway), still asked
    assert [r.client_id for r in manager.state.to_release.rows()] == ["node-1"]


def test_a_manager_started_again_resumes_the_drains_it_had_not_finished() -> None:
    """A daemon SIGKILLed while a revoked node drained: CloudLab's next notice for it is not
    new, so nothing would drain it again and the node would be taken at the deadline (its
    work lost with it). The next manager starts again the drains of the revocations not yet
    released whose deadline is to come, and those only."""
    from types import SimpleNamespace as NS

    from elasticslice.managers.core import Manager
    from elasticslice.managers.records import PendingDelete
    revocations = [
        PendingDelete("cm", "n1", "c1", deadline=200.0, first_seen=0.0),   # was draining
        PendingDelete("cm", "n2", "c2", deadline=200.0, first_seen=0.0, released=50.0),
        PendingDelete("cm", "n3", "c3", deadline=90.0, first_seen=0.0),    # its deadline past
        PendingDelete("cm", "n4", None, deadline=200.0, first_seen=0.0),   # whose node?
    ]
    started: list[PendingDelete] = []
    manager = NS(clock=lambda: 100.0, notices=NS(open=lambda: revocations),
                 client_endpoint=NS(releaser=NS(start=started.extend)))
    assert Manager.resume_releases(manager) == 1
    assert [r.node_id for r in started] == ["n1"]


def test_a_status_asked_before_a_give_back_does_not_bring_the_node_back(
        emulator, make_manager, tmp_path: Path) -> None:
    """A SliverStatus asked before a DeleteNodes and answered after it lists the node given
    back: the node stays gone, for the reason it went (a fresh-clone run once saw the
    observer bring it back, then lose it "not in the sliver any more")."""
    manager = make_manager(emulator, maxthreshold=3, enable_delete=True)
    manager.manage_once()
    assert [n.client_id for n in manager.state.nodes()] == ["node-1", "node-2", "node-3"]
    cm = manager.cms[0]
    real = cm.sliver_status
    manager.actuator.ask_release([manager.state.node(cm.url, "node-3")], "policy", "idle")

    def answered_after_the_give_back() -> Any:
        status = real()
        assert len(manager.actuator.release()) == 1   # DeleteNodes while it is on its way
        return status

    cm.sliver_status = answered_after_the_give_back
    manager.observer.sliver_status(cm)
    assert "node-3" in [n.client_id for n in manager.observer.last_status[cm.url].nodes]
    assert gone_reasons(manager) == {"node-3": "given back"}
    cm.sliver_status = real
    manager.observer.sliver_status(cm)   # the next status: the node is not there
    assert gone_reasons(manager) == {"node-3": "given back"}
    assert [n.client_id for n in manager.state.nodes()] == ["node-1", "node-2"]


def test_a_status_asked_before_an_addnodes_does_not_lose_the_new_node(
        emulator, make_manager, tmp_path: Path) -> None:
    """The other way round: a SliverStatus asked before an AddNodes and answered after it
    lacks the node just added, which is not gone (the node's pilot would be lost)."""
    manager = make_manager(emulator, maxthreshold=3, enable_delete=True)
    manager.manage_once()
    cm = manager.cms[0]
    real = cm.sliver_status

    def answered_after_an_addnodes() -> Any:
        status = real()
        assert manager.actuator.add(cm, manager.node_helper.get_add_args(1)) == 1
        return status

    cm.sliver_status = answered_after_an_addnodes
    manager.observer.sliver_status(cm)
    assert gone_reasons(manager) == {}
    [new] = [n.client_id for n in manager.state.nodes()
             if n.client_id not in ("node-1", "node-2", "node-3")]
    assert new not in [n.client_id for n in manager.observer.last_status[cm.url].nodes]
    cm.sliver_status = real
    manager.observer.sliver_status(cm)   # the next status lists it
    assert gone_reasons(manager) == {} and len(manager.state.nodes()) == 4
