"""The reclamation report used to count a notice for slices without a client endpoint,
where nobody is told anything: `forced (1 notices)` for a node taken at once. And a node the
client gave back (DeleteNodes) while its notice was being delivered was reported "gone", not
"early": the countdown wrote back the row it had read before the callback."""
from __future__ import annotations

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
