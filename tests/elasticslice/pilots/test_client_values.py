"""CloudLab's CLIENT policy with our values, in the box: the manager registers CLIENT where
the server offers it and values its nodes by their pilots' work, so a reclamation takes
the idle pilot's node, not a busy one (under LIFO the newest node would go: a busy one)."""
from __future__ import annotations

from pathlib import Path

import pytest

from elasticslice.pilots.values import BUSY
from tests.elasticslice.managers.helpers import admin, reclaim_outcome
from tests.elasticslice.pilots.helpers import closed_gate
from tests.helpers import wait_for
from troy.states import State

pytestmark = pytest.mark.slow


def small_inventory(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "inventory.ini"
    path.write_text(f"[inventory]\ndefault_hardware_type = m510\n\n[m510]\ncount = {count}\n"
                    "cores = 8\nmemory = 1024\nprefix = ms\n")
    return path


def test_under_client_a_reclamation_takes_the_idle_pilot_not_the_busy_one(
        emulator_factory, make_cluster, witness_for, tmp_path: Path) -> None:
    # three nodes in all: the slice holds two (the initial one and one added), one is free
    emulator = emulator_factory(max_wait=30, notify_interval=0.3,
                                inventory=small_inventory(tmp_path, 3))
    witness = witness_for(emulator)
    cluster = make_cluster(emulator, minthreshold=2, maxthreshold=2, idle_timeout=None)
    manager = cluster.manager
    wait_for(lambda: len(cluster.pilots()) == 2, timeout=120, what="two pilots")
    assert set(manager.registrar.policies.values()) == {"CLIENT"}
    rows = {r.client_id: r for r in manager.state.nodes()}
    initial = next(c for c, r in rows.items() if r.initial)
    added = next(c for c, r in rows.items() if not r.initial)
    # a long unit on the added (newest) node's pilot: LIFO would take that node
    gate = closed_gate(witness)
    unit = cluster.framework.submit_unit(
        {"executable": "/bin/sh", "arguments": ["-c", gate.wait_command()], "cores": 4,
         "runtime": 3600.0}, pilot=manager.pilot_of(added))
    wait_for(lambda: unit.state is State.RUNNING, timeout=60, what="the unit running")
    cm_url = manager.cms[0].url
    wait_for(lambda: manager.pilots._sent_values.get(cm_url, {}).get(added, 0.0) >= BUSY
             > manager.pilots._sent_values[cm_url].get(initial, 1.0), timeout=60,
             what="our values at the CM: the busy node high, the idle one low")
    # the tenants want the free node and one of ours
    admin(emulator).call("SetLoad", busy=2)
    node_ids = {c: r.node_id for c, r in rows.items()}
    wait_for(lambda: any(reclaim_outcome(emulator, n) for n in node_ids.values()),
             timeout=120, what="a reclamation")
    taken = {c for c, n in node_ids.items() if reclaim_outcome(emulator, n)}
    assert taken == {initial}   # the idle pilot's node; the busy one keeps its unit
    assert unit.state is State.RUNNING and unit.attempts <= 1
    assert cluster.stats()["units_requeued"] == 0
    gate.open()
    wait_for(lambda: unit.state in (State.DONE, State.FAILED), timeout=60,
             what="the unit to end")
    assert unit.state is State.DONE
