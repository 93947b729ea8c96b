"""The mapper as CloudLab's CM runs it (R12): AddNodes has no hardware type
(protogeni/lib/GeniCMV2.pm.in ``AddNodes`` builds its request node from five keys), and a
request node without one gets the type ``pc`` (protogeni/lib/GeniCM.pm.in: "Need some kind
of default"), the class every PC type belongs to. So a node that names no physical node and
no type may be any free node of any type; the box draws it at random (``serve --seed``
repeats the draws). (The box gave every such node the inventory's default type, m510, so a
client that forgot the type got the one it wanted anyway.)"""
from __future__ import annotations

import random

from elasticslice.emulator.pool import NodeRequest, load_inventory, pick_nodes, sync_nodes
from elasticslice.emulator.store import Store


def _draws(tmp_path, name: str, seed: int | None) -> list[str]:
    store = Store(tmp_path / f"{name}.db").open()
    inv = load_inventory(None)
    sync_nodes(store, inv)
    rng = random.Random(seed)
    try:
        return [pick_nodes(store, inv, [NodeRequest(f"n{i}")], rng=rng)[0].node_id
                for i in range(30)]
    finally:
        store.close()


def test_a_node_without_type_or_name_is_any_free_node_of_any_type(tmp_path):
    inv = load_inventory(None)
    by_id = {node: hw for hw in inv.types.values() for node in hw.node_ids()}
    picked = _draws(tmp_path, "a", seed=3)
    kinds = {by_id[node].name for node in picked}
    assert len(kinds) > 1, picked  # not the inventory's default type every time
    assert picked == _draws(tmp_path, "b", seed=3)  # --seed repeats the draws


def test_one_call_gets_distinct_free_nodes_and_a_typed_one_keeps_its_type(tmp_path):
    store = Store(tmp_path / "s.db").open()
    inv = load_inventory(None)
    sync_nodes(store, inv)
    wanted = [NodeRequest(f"n{i}") for i in range(20)] + [NodeRequest("t", "d430")]
    picked = pick_nodes(store, inv, wanted, rng=random.Random(1))
    assert len({n.node_id for n in picked}) == 21
    assert picked[-1].hardware_type == "d430"
    store.close()
