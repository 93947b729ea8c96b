"""Regressions found by the chaos suite (bench/chaos), each named after what broke.

Seed 14: a node agent SIGKILLed before it ever joined the scheduler left a ready node with
no pilot at all; nothing replaced it (only a pilot that had joined and ended counted as
dead) and the workflow waited forever with 9 units lost. Now a ready node whose agent never
joined within ``agent_timeout`` is replaced (the new node first) and given back.

Seed 12: a pilot lost to a revocation without notice had its running unit killed and
requeued, and its worker retired; the agent rejoined with a new worker, which got the unit
again and answered at once with no result (it still held the unit as killed): the unit
FAILED "unit result lost", and the workflow with it. The agent now forgets the units it
killed when it rejoins."""
from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

import pytest

from bench.chaos.world import agent_pids
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask.node import RECONNECT_ENV
from tests.helpers import wait_for
from tests.elasticslice.managers.helpers import cm_nodes
from tests.elasticslice.pilots.helpers import (Gate, Run, SchedulerProcess,
                                             assert_nothing_lost, closed_gate, ran_on,
                                             sleepers)

pytestmark = pytest.mark.slow


def gated_python(gate: Gate) -> str:
    """A ``node_python`` for the nodes that waits while ``gate`` is closed, then is the
    image's python3 (``exec``: same pid), so an agent can be killed before it joined, at a
    time of our choosing. The node's enrolment (``-m troy.frameworks.dask.enrol``, before
    the agent) goes through at once."""
    return shlex.join(["sh", "-c", f'case "$2" in *.enrol) ;; *) {gate.wait_command()};; '
                                   f'esac; exec python3 "$@"', "python3"])


def test_a_node_whose_agent_was_killed_before_it_joined_is_replaced_after_agent_timeout(
        emulator, make_cluster, witness, tmp_path: Path) -> None:
    gate = closed_gate(witness)
    cluster = make_cluster(emulator, maxthreshold=2, idle_timeout=None,
                           node_python=gated_python(gate),
                           # long enough for an agent to join on a loaded machine: at 3 s
                           # every replacement was replaced too (111 s, 39 s of CPU in a
                           # full run, where it takes 7 s alone)
                           manager_options={"agent_timeout": 15.0})
    run = Run(cluster, sleepers(witness, 2, 2.0, cores=4))
    scheduler = cluster.framework.scheduler_address
    pids = wait_for(lambda: agent_pids(scheduler), timeout=120, what="the first node's agent")
    assert len(pids) == 1 and not cluster.pilots()  # started, and not joined
    (first, pid), = pids.items()
    os.kill(pid, signal.SIGKILL)
    gate.unlink()  # the agents from now on join at once
    stats = assert_nothing_lost(cluster, run, witness, 2)
    assert stats["duplicates"] == 0, stats
    ran = {node for nodes in ran_on(witness).values() for node in nodes}
    assert first not in ran  # no unit ever went to the node without an agent
    wait_for(lambda: first not in cm_nodes(emulator, tmp_path), timeout=120,
             what="the node whose agent never joined given back")
    held = cm_nodes(emulator, tmp_path)
    assert held and sorted(r.client_id for r in cluster.manager.state.nodes()) == sorted(held)
    assert cluster.pilots() and all(p.worker_name in held for p in cluster.pilots())


def test_a_unit_killed_with_a_lost_pilot_runs_on_its_rejoined_agent_not_lost(
        tmp_path: Path, cluster_ca: tuple[bytes, bytes],  # noqa: F811 (the fixture)
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RECONNECT_ENV, "120")
    scheduler = SchedulerProcess(tmp_path, cluster_ca)
    ran = tmp_path / "ran"
    try:
        with scheduler.joined(tmp_path, cluster_ca, "node-x") as (_, fw, first):
            unit = fw.submit_unit(CUD(executable="/bin/sh", cores=1, arguments=[
                "-c", f"sleep 2 && echo x >> {ran}"]))
            wait_for(lambda: unit.state is State.RUNNING, 60, what="the unit to run")
            fw.lose_pilot(first, "revoked without notice")  # unit killed, worker retired
            assert unit.wait(120) is State.DONE, unit.result
            assert ran.read_text() == "x\n"  # once: the killed attempt did not end
            again = fw.find_pilot("node-x")
            assert again is not None and again.id != first.id  # on the rejoined agent
    finally:
        scheduler.proc.stop()
