"""The notice book on its own (real SQLite state, real holdings): what counts as a
revocation, its one deadline, what is counted apart, how a revocation ends."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elasticslice.managers.base import TrackedState
from elasticslice.managers.helpers import SimpleElasticSliceHelper
from elasticslice.managers.holdings import Holdings
from elasticslice.managers.notices import NoticeBook
from elasticslice.managers.state import ManagerState

CM = "https://cm.a:12369/protogeni/xmlrpc/cm"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Remembering(SimpleElasticSliceHelper):
    """A helper that remembers the nodes it was told left."""

    def __init__(self) -> None:
        super().__init__()
        self.gone: list[dict[str, Any]] = []

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        self.gone.append(node)


@pytest.fixture
def world(tmp_path: Path) -> Any:
    state = TrackedState(ManagerState.open(tmp_path / "state"))
    for cid, nid in (("node-1", "pc1"), ("node-2", "pc2")):
        state.upsert_node(CM, cid, now=0.0, node_id=nid, state="ready")
    clock, woken, mail, helper = Clock(), [], [], Remembering()
    holdings = Holdings(state, helper, clock=clock, notify=lambda s, b: mail.append(s),
                        post=lambda fn, *args: fn(*args))
    book = NoticeBook(state, holdings=holdings, clock=clock,
                      wake=lambda *m: woken.append(m), notify=lambda s, b: mail.append(s))
    yield book, state, clock, woken, mail, helper.gone
    state.close()


def item(node_id: str, client_id: str | None, wait: int) -> dict[str, Any]:
    out: dict[str, Any] = {"node_id": node_id, "max_wait_time": wait}
    if client_id is not None:
        out["client_id"] = client_id
    return out


def test_only_a_node_we_hold_with_both_ids_matching_is_a_revocation(world) -> None:
    book, state, clock, woken, mail, _ = world
    entries = book.pending([item("pc1", "node-1", 60), item("pc9", "node-1", 60),
                            item("pc2", "node-1", 60), item("pc8", None, 60)], clock())
    assert [e.ours for e in entries] == [True, False, False, False]
    assert [p.node_id for p in state.pending_deletes()] == ["pc1"]
    assert book.counts() == {"revocations": 1, "early": 0, "forced": 0, "foreign": 3}
    assert woken and mail == ["node node-1 revoked"]
    book.pending([item("pc9", "node-1", 50)], clock())   # the same stranger again: once
    assert book.counts()["foreign"] == 3


def test_one_deadline_from_the_first_notice_and_the_countdown_only_brings_it_earlier(
        world) -> None:
    book, state, clock, *_ = world
    [first] = book.pending([item("pc1", "node-1", 60)], clock())
    assert first.fresh and first.revocation.deadline == 1060.0
    clock.now = 1010.0
    [later] = book.pending([item("pc1", "node-1", 55)], clock())  # would be 1065: no
    assert not later.fresh and not later.hurried and later.revocation.deadline == 1060.0
    clock.now = 1020.0
    [sooner] = book.pending([item("pc1", "node-1", 30)], clock())
    assert sooner.hurried and sooner.revocation.deadline == 1050.0
    assert state.revocations.get("pc1").first_seen == 1000.0


def test_released_by_the_deadline_is_early_and_taken_before_is_forced(world) -> None:
    book, state, clock, _, _, gone = world
    book.pending([item("pc1", "node-1", 60), item("pc2", "node-2", 60)], clock())
    assert book.release(["pc1"], "drained") == ["pc1"] and book.released("pc1")
    assert book.release(["pc1"], "again") == []
    assert book.counts()["early"] == 1   # as soon as released: the CM takes it early
    clock.now = 1005.0
    book.complete([item("pc1", "node-1", 0), item("pc2", "node-2", 0)], clock())
    assert book.counts() == {"revocations": 2, "early": 1, "forced": 1, "foreign": 0}
    assert state.nodes() == [] and sorted(n["client_id"] for n in gone) == ["node-1", "node-2"]
    # CloudLab's late word about nodes we held is answered, not counted as foreign
    book.pending([item("pc1", "node-1", 0)], clock())
    book.complete([item("pc2", "node-2", 0)], clock())
    assert book.counts() == {"revocations": 2, "early": 1, "forced": 1, "foreign": 0}


def test_a_node_taken_before_its_notice_reached_us_is_still_one_forced_revocation(
        world) -> None:
    """At max_wait_time 0 CloudLab may take the node first: we see it gone from the sliver,
    then its notice and its complete arrive. What broke: neither counted (the node was no
    longer held), and the run's summary said no revocation."""
    book, state, clock, *_ = world
    [rec] = [r for r in state.nodes() if r.client_id == "node-1"]
    book.holdings.forget(rec, clock(), "not in the sliver any more")
    clock.now = 1001.0
    [late] = book.pending([item("pc1", "node-1", 0)], clock())
    assert not late.ours   # nothing to drain: it is gone
    book.complete([item("pc1", "node-1", 0)], clock())
    book.pending([item("pc1", "node-1", 0)], clock())   # CloudLab says it again: once
    assert book.counts() == {"revocations": 1, "early": 0, "forced": 1, "foreign": 0}
    # the same machine given to us again and taken again is another revocation
    state.upsert_node(CM, "node-3", now=1002.0, node_id="pc1", state="ready")
    [rec] = [r for r in state.nodes() if r.client_id == "node-3"]
    book.holdings.forget(rec, 1003.0, "not in the sliver any more")
    clock.now = 1004.0
    book.complete([item("pc1", "node-3", 0)], clock())
    assert book.counts() == {"revocations": 2, "early": 0, "forced": 2, "foreign": 0}


def test_a_notice_that_cannot_wait_is_forced_and_complete_for_a_stranger_changes_nothing(
        world) -> None:
    book, state, clock, *_ = world
    [taken] = book.pending([item("pc1", "node-1", 0)], clock())
    assert taken.ours and taken.fresh
    assert state.revocations.get("pc1").outcome == "forced"
    book.complete([item("pc2", "node-1", 0), item("pc7", "node-2", 0)], clock())
    assert [r.client_id for r in state.nodes()] == ["node-1", "node-2"]  # nothing gone
    assert book.counts() == {"revocations": 1, "early": 0, "forced": 1, "foreign": 2}


def test_values_are_recorded_for_the_nodes_we_hold_only(world) -> None:
    from elasticslice.managers.endpoint import ResourceValue
    book, state, clock, woken, *_ = world
    book.values([ResourceValue("pc1", 0.25, "node-1"), ResourceValue("pc2", 0.5),
                 ResourceValue("pc9", 0.1), ResourceValue("pc2", 0.9, "node-1")])
    assert state.values() == {"pc1": 0.25, "pc2": 0.5}
    assert ("set_system_state",) in woken
