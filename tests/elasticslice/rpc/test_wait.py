"""The waiting policy of `--wait`, with a scripted SliverStatus and an injected clock."""
from __future__ import annotations

import pytest

from elasticslice.rpc.cm import SliverStatus
from elasticslice.rpc.wait import (
    SliverFailedError, SliverWaitTimeout, progress_of, wait_for_nodes,
)


def status(**nodes: str) -> SliverStatus:
    return SliverStatus.from_value({"status": "changing", "state": "started", "details": {
        f"urn:s+{cid}": {"client_id": cid, "status": st, "state": "started",
                         "error": "disk died" if st == "failed" else ""}
        for cid, st in nodes.items()}})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_waits_through_changes_reporting_each_once():
    answers = iter([status(a="notready", b="notready"), status(a="notready", b="notready"),
                    status(a="changing", b="ready"), status(a="ready", b="ready")])
    clock, lines = Clock(), []
    got = wait_for_nodes(lambda: next(answers), timeout=60, report=lines.append,
                         clock=lambda: clock.now, sleep=clock.sleep)
    assert [n.status for n in got.nodes] == ["ready", "ready"]
    assert [line.split(" (")[0] for line in lines] == [
        "waiting: 0/2 ready, 2 notready", "waiting: 1/2 ready, 1 changing",
        "waiting: 2/2 ready"]
    assert clock.sleeps == [0.5, 0.75, 1.125]  # growing intervals


def test_times_out_without_sleeping_past_the_deadline():
    clock = Clock()
    with pytest.raises(SliverWaitTimeout, match=r"after 2s .*: 0/1 ready, 1 notready"):
        wait_for_nodes(lambda: status(a="notready"), timeout=2, max_interval=5,
                       clock=lambda: clock.now, sleep=clock.sleep)
    assert clock.now == 2.0


def test_only_the_given_nodes_count_and_a_failed_one_ends_the_wait():
    mixed = status(old="failed", new="ready")
    assert progress_of(mixed, ["new"]).done  # an old failed node is not waited for
    with pytest.raises(SliverFailedError, match=r"node old failed: disk died"):
        wait_for_nodes(lambda: mixed, timeout=5)
    missing = progress_of(status(old="ready"), ["old", "new"])
    assert not missing.done and missing.summary() == "1/2 ready, 1 not listed yet"
    assert not progress_of(status()).done  # a sliver with no nodes is nothing to wait for
