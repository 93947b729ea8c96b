"""The reclamation report used to count a notice for slices without a client endpoint,
where nobody is told anything: `forced (1 notices)` for a node taken at once. And a node the
client gave back (DeleteNodes) while its notice was being delivered was reported "gone", not
"early": the countdown wrote back the row it had read before the callback."""
from __future__ import annotations

import datetime as dt
import threading

from elasticslice.emulator.adminclient import AdminClient
from tests.helpers import holds_for, wait_for
from tests.elasticslice.emulator.helpers import Session, dynamic_slice, ok


def test_revoke_from_a_slice_without_endpoint_counts_no_notice(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    detail = next(iter(s.status(urn, cred)["details"].values()))
    node_id = detail["component_urn"].rsplit("+", 1)[-1]
    assert AdminClient(emulator.dir).call("Revoke", nodes=[node_id]) == {node_id: "reclaiming"}
    report = wait_for(lambda: (r := AdminClient(emulator.dir).call("Report"))
                      and r[0]["released_at"] and r, timeout=20, what="node taken")
    assert [(r["node_id"], r["outcome"], r["notifications"]) for r in report] == [
        (node_id, "forced", 0)]


def test_a_node_given_back_during_its_notice_is_reported_early_not_gone(
        emulator_factory, endpoint_factory):
    emulator = emulator_factory(max_wait=5, notify_interval=0.2)
    ep = endpoint_factory(emulator, early=False)   # the answer itself does not release it
    s, urn, cred = dynamic_slice(emulator, ep)
    details = s.status(urn, cred)["details"].values()
    node_id = next(d["component_urn"] for d in details
                   if d["client_id"] == "n2").rsplit("+", 1)[-1]

    def give_back(params: dict) -> None:   # the client drains at once, then DeleteNodes,
        ep.on_pending = None               # and answers once the node has left the slice
        ok(s.cm.DeleteNodes({"slice_urn": urn, "credentials": [cred], "nodes": ["n2"]}))
        wait_for(lambda: AdminClient(emulator.dir).call("Report")[0]["outcome"] == "early",
                 timeout=30, what="the node released")
    ep.on_pending = give_back
    AdminClient(emulator.dir).call("Revoke", nodes=[node_id])
    report = wait_for(lambda: (r := AdminClient(emulator.dir).call("Report"))
                      and r[0]["outcome"] not in ("", "pending", None) and r, timeout=30,
                      what="the reclamation to end")
    assert [(r["node_id"], r["outcome"]) for r in report] == [(node_id, "early")]
    told = ep.methods().count("NotifyDeletePending")

    def stays_early() -> None:   # broke: the countdown put the row back to pending, told
        rows = AdminClient(emulator.dir).call("Report")   # the client again and, at the
        assert [(r["node_id"], r["outcome"]) for r in rows] == [(node_id, "early")]
        assert ep.methods().count("NotifyDeletePending") == told   # deadline, said "gone"
    holds_for(stays_early, 1.5)   # several countdown rounds (every 0.2 s)


# Honest accounting: early is decided by when the answer or the DeleteNodes arrives, and the
# deadline takes the node whatever callback is still in flight. These used to be reported
# "early" (the countdown judged by when it had *sent* the notice, and a DeleteNodes after the
# deadline counted as the client's own early release), and a client that held the callback
# held its node past the deadline until the emulator's call timed out.

def _revoked_node(emulator, ep):
    s, urn, cred = dynamic_slice(emulator, ep)
    details = s.status(urn, cred)["details"].values()
    node_id = next(d["component_urn"] for d in details
                   if d["client_id"] == "n2").rsplit("+", 1)[-1]
    return s, urn, cred, node_id


def _past_deadline(emulator) -> None:
    """Wait until the (one) reclamation's deadline has passed."""
    deadline = dt.datetime.fromisoformat(
        AdminClient(emulator.dir).call("Report")[0]["deadline"].replace("Z", "+00:00"))
    wait_for(lambda: dt.datetime.now(dt.timezone.utc) > deadline + dt.timedelta(seconds=0.3),
             timeout=30, what="the deadline to pass")


def _outcome(emulator) -> str:
    return wait_for(lambda: (r := AdminClient(emulator.dir).call("Report"))
                    and r[0]["outcome"] not in ("", "pending", None) and r[0]["outcome"],
                    timeout=30, what="the reclamation to end")


def test_a_delete_nodes_that_arrives_after_the_deadline_is_reported_forced(
        emulator_factory, endpoint_factory):
    emulator = emulator_factory(max_wait=2, notify_interval=0.2)
    ep = endpoint_factory(emulator, early=False)
    s, urn, cred, node_id = _revoked_node(emulator, ep)

    def late_give_back(params: dict) -> None:   # the client drains past the deadline,
        ep.on_pending = None                    # then gives the node back
        _past_deadline(emulator)
        s.cm.DeleteNodes({"slice_urn": urn, "credentials": [cred], "nodes": ["n2"]})
    ep.on_pending = late_give_back
    AdminClient(emulator.dir).call("Revoke", nodes=[node_id])
    assert _outcome(emulator) == "forced"


def test_an_early_answer_that_arrives_after_the_deadline_is_reported_forced(
        emulator_factory, endpoint_factory):
    emulator = emulator_factory(max_wait=2, notify_interval=0.2)
    ep = endpoint_factory(emulator, early=True)   # answers max_wait_time 0, but late

    def answer_late(params: dict) -> None:
        ep.on_pending = None
        _past_deadline(emulator)
    ep.on_pending = answer_late
    _, _, _, node_id = _revoked_node(emulator, ep)
    AdminClient(emulator.dir).call("Revoke", nodes=[node_id])
    assert _outcome(emulator) == "forced"


def test_at_the_deadline_the_node_is_taken_while_the_client_holds_the_callback(
        emulator_factory, endpoint_factory):
    emulator = emulator_factory(max_wait=2, notify_interval=0.2)
    ep = endpoint_factory(emulator, early=True)
    release = threading.Event()
    ep.on_pending = lambda params: release.wait(60)   # a client that never answers
    _, _, _, node_id = _revoked_node(emulator, ep)
    try:
        AdminClient(emulator.dir).call("Revoke", nodes=[node_id])
        assert _outcome(emulator) == "forced"
        # taken while the callback was still in flight: the emulator's call did not time out
        assert emulator.server.reclaimer.callbacks.failures == 0
    finally:
        release.set()
