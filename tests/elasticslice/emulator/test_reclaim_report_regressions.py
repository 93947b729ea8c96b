"""The reclamation report used to count a notice for slices without a client endpoint,
where nobody is told anything: `forced (1 notices)` for a node taken at once."""
from __future__ import annotations

from elasticslice.emulator.adminclient import AdminClient
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session


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
