"""Concurrent CM calls on one sliver: many real clients over TLS, each in its own thread.

Regressions of issue 7 §2: the CM read the sliver before taking its lock and wrote a stale
copy back (duplicate LAN addresses, LANs listing interfaces of deleted nodes, a deleted
sliver coming back with a node).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import parse
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session, ok, proxy

ONE_NODE = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="n1"><interface client_id="n1:if0"/></node>
  <link client_id="lan0"><interface_ref client_id="n1:if0"/></link>
</rspec>
"""


def _together(emu: Any, calls: list[Callable[[Any], dict]]) -> list[dict]:
    """Run each call with its own CM client in its own thread, all released at once."""
    clients = [proxy(emu, "cm") for _ in calls]
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(timeout=60)
        try:
            results[i] = calls[i](clients[i])
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client never got an answer"
    assert all(isinstance(r, dict) for r in results), results
    return results


def _manifest(s: Session, urn: str, cred: str):
    return parse(ok(s.cm.Resolve({"urn": urn, "credentials": [cred]}))["manifest"])


def _lan_ips(manifest, lan: str) -> list[str]:
    link = next(li for li in manifest.links if li.client_id == lan)
    ifaces = {i.client_id: i for n in manifest.nodes for i in n.interfaces}
    return [ifaces[ref].ip for ref in link.interfaces if ref in ifaces]


def test_simultaneous_add_nodes_on_one_lan_never_share_an_address(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    args = {"slice_urn": urn, "credentials": [cred]}
    calls = [lambda cm, i=i: cm.AddNodes({**args, "nodes": {
        f"x{i}": {"lans": ["lan0"]}}}) for i in range(30)]
    answers = _together(emulator, calls)
    assert [a["code"] for a in answers] == [0] * 30, [a["output"] for a in answers]
    for answer in answers:  # every manifest handed out is consistent in itself
        ips = _lan_ips(parse(answer["value"]), "lan0")
        assert len(ips) == len(set(ips)), Counter(ips).most_common(3)
    final = _manifest(s, urn, cred)
    assert len(final.nodes) == 32
    ips = _lan_ips(final, "lan0")
    assert len(ips) == 32 and len(set(ips)) == 32, Counter(ips).most_common(3)
    link = final.links[0]
    assert sorted(link.interfaces) == sorted(i.client_id for n in final.nodes
                                             for i in n.interfaces)


def test_mixed_add_and_delete_nodes_leave_each_lan_with_its_nodes_interfaces(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    args = {"slice_urn": urn, "credentials": [cred]}
    doomed = {f"d{i}": {"lans": ["lan0"]} for i in range(25)}
    ok(s.cm.AddNodes({**args, "nodes": doomed}))
    calls: list[Callable[[Any], dict]] = []
    for i in range(25):
        calls.append(lambda cm, i=i: cm.AddNodes({**args, "nodes": {
            f"a{i}": {"lans": ["lan0"]}}}))
        calls.append(lambda cm, i=i: cm.DeleteNodes({**args, "nodes": [f"d{i}"]}))
    answers = _together(emulator, calls)
    assert [a["code"] for a in answers] == [0] * 50, [a["output"] for a in answers]
    final = _manifest(s, urn, cred)
    expected = {"n1", "n2"} | {f"a{i}" for i in range(25)}
    assert {n.client_id for n in final.nodes} == expected
    link = final.links[0]
    mine = [i.client_id for n in final.nodes for i in n.interfaces]
    assert sorted(link.interfaces) == sorted(mine)  # no stale, no missing, no duplicate
    ips = _lan_ips(final, "lan0")
    assert len(ips) == len(set(ips)) == 27
    assert len(s.status(urn, cred)["details"]) == 27


def test_delete_slice_racing_add_nodes_never_leaves_a_deleted_sliver_holding_nodes(emulator):
    s = Session(emulator)
    store = emulator.server.ctx.store
    outcomes: Counter[str] = Counter()
    for attempt in range(25):
        urn, cred, _ = s.create(f"race{attempt}", rspec=ONE_NODE)
        args = {"slice_urn": urn, "credentials": [cred]}
        wait_for(lambda: s.status(urn, cred)["status"] == "ready", timeout=20,
                 what="sliver ready")
        delete_first = attempt % 2 == 0  # both orders

        def delete(cm: Any) -> dict:
            if not delete_first:
                time.sleep(0.002 * (attempt % 5))
            return cm.DeleteSlice(args)

        def add(cm: Any) -> dict:
            if delete_first:
                time.sleep(0.002 * (attempt % 5))
            return cm.AddNodes({**args, "nodes": {"late": {"lans": ["lan0"]}}})

        deleted, added = _together(emulator, [delete, add])
        outcomes[f"delete {deleted['code']}, add {added['code']}"] += 1
        assert deleted["code"] in (GeniCode.SUCCESS, GeniCode.BUSY), deleted
        status = s.cm.SliverStatus(args)
        held = [n.client_id for n in store.nodes(slice_urn=urn)]
        if deleted["code"] == GeniCode.SUCCESS:
            # the delete won: nothing of the sliver may come back
            assert status["code"] == GeniCode.SEARCHFAILED, (attempt, status)
            assert held == [], (attempt, held)
            assert added["code"] in (GeniCode.SUCCESS, GeniCode.SEARCHFAILED), added
        else:  # BUSY: AddNodes came first and its node still boots; the sliver is whole
            assert added["code"] == GeniCode.SUCCESS, added
            assert sorted(status["value"]["details"][k]["client_id"]
                          for k in status["value"]["details"]) == ["late", "n1"]
            ok(s.cm.DeleteSlice({**args, "cancel": True, "blocking": True}))
    assert sum(outcomes.values()) == 25, outcomes
