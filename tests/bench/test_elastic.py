"""The elasticity simulator of bench/elastic: the clock, the reclaims, the bound, and that
our policy really is the manager's ``decide``."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from elastic.policies import (DaskAdaptive, Ours, ParslBlocks,  # noqa: E402
                              SeedDefaults, Static)
from elastic.sim import SimConfig, simulate  # noqa: E402
from elastic.tenants import Reclaim, Steady  # noqa: E402
from elastic.workload import (SimTask, campaign, critical_path, lower_bound,  # noqa: E402
                              work_bound, workflow_files)

from elasticslice.managers import policy as policy_module  # noqa: E402
from elasticslice.managers.policy import PolicyConfig  # noqa: E402

CONFIG = SimConfig(total_nodes=40, cores_per_node=4, max_nodes=4, boot_delay=60.0,
                   max_wait=120.0)


def flat(count: int, runtime: float, arrival: float = 0.0) -> list[SimTask]:
    return [SimTask(f"t{i}", 1, runtime, (), arrival) for i in range(count)]


def test_lower_bound_is_the_chain_or_the_work_over_the_peak_cores() -> None:
    chain = [SimTask("a", 1, 10.0, (), 5.0), SimTask("b", 1, 20.0, ("a",), 5.0)]
    assert critical_path(chain) == 35.0
    assert work_bound(flat(8, 10.0), peak_cores=2) == 40.0
    assert lower_bound(chain + flat(8, 10.0), peak_cores=2) == 55.0  # (80 + 30) / 2


def test_our_policy_is_the_managers_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = policy_module.decide

    def spy(observed, config):  # the real function, counted
        assert observed.demand is None   # the cores, not a copy of the cores-to-nodes step
        calls.append(policy_module.wanted_count(observed, config))
        return real(observed, config)

    import elastic.policies
    monkeypatch.setattr(elastic.policies, "decide", spy)
    ours = Ours(PolicyConfig(maxthreshold=4, enable_delete=True, idle_timeout=0.0,
                             delete_cooldown=0.0, add_cooldown=0.0, max_delete_per_cycle=4))
    result = simulate(CONFIG, flat(16, 600.0), Steady("steady", 40, load=0.0), ours)
    assert result.finished and calls
    assert max(calls) == 4   # 16 one-core units, 4 cores a node
    assert result.adds == 3 and result.gives_back == 3   # up to 4 nodes, back to 1
    assert result.makespan >= result.lower_bound


def test_a_drained_node_loses_no_unit_that_could_finish_before_the_deadline() -> None:
    """Units of 100 s, a countdown of 120 s: the draining policy lets them finish and starts
    nothing new on the node; the static one keeps using it and loses what runs at the end."""
    tasks = flat(64, 100.0)
    kept = PolicyConfig(minthreshold=4, maxthreshold=4)
    drained = simulate(CONFIG, tasks, Reclaim("r", 40, load=0.0, at=30.0, hold=10_000.0),
                       Ours(kept))
    static = simulate(CONFIG, tasks, Reclaim("r", 40, load=0.0, at=30.0, hold=10_000.0),
                      Static(4))
    assert drained.revocations == static.revocations == 2
    assert drained.units_lost == 0
    assert static.units_lost > 0
    assert drained.finished and static.finished


@pytest.mark.parametrize("make", [lambda: Static(4), lambda: SeedDefaults(4),
                                  lambda: ParslBlocks(4), lambda: DaskAdaptive(4)])
def test_every_baseline_finishes_the_workflows_within_the_cap(make) -> None:
    tasks = campaign(workflow_files()[:3], [0.0, 1800.0], time_scale=1.0, max_cores=4)
    result = simulate(CONFIG, tasks, Steady("steady", 40, load=0.25), make())
    assert result.finished
    assert result.makespan >= result.lower_bound
    assert max(s.held for s in result.samples) <= CONFIG.max_nodes


def test_under_client_a_reclamation_takes_the_idle_node_not_the_busy_one() -> None:
    """Two nodes, one running a unit far longer than the countdown: LIFO takes the first
    node (it runs the unit, which is cut), CLIENT with our values the idle one."""
    kept = PolicyConfig(minthreshold=2, maxthreshold=2)
    runs = {}
    for reclaim in ("LIFO", "CLIENT"):
        runs[reclaim] = simulate(CONFIG, flat(1, 1000.0),
                                 Reclaim("r", 40, load=0.0, at=30.0, hold=10_000.0),
                                 Ours(kept, reclaim_policy=reclaim))
    assert runs["LIFO"].revocations == runs["CLIENT"].revocations == 1
    assert runs["LIFO"].units_lost == 1
    assert runs["CLIENT"].units_lost == 0
    assert runs["CLIENT"].makespan < runs["LIFO"].makespan


def test_placing_by_end_leaves_half_the_nodes_free_of_long_work_for_client() -> None:
    """Four nodes of 4 cores, 24 units of 1,000 s and 1,000 of 30 s (a countdown of 120 s),
    half the nodes reclaimed at 30 s. Longest first and best fit puts long units on every
    node: any two victims cut 8. Placed by end, the long work takes the two nodes it needs
    to end with the rest; CLIENT takes the other two and cuts nothing, LIFO the long ones."""
    tasks = [SimTask(f"long{i}", 1, 1000.0, (), 0.0) for i in range(24)]
    tasks += [SimTask(f"short{i}", 1, 30.0, (), 0.0) for i in range(1000)]
    kept = PolicyConfig(minthreshold=4, maxthreshold=4)
    runs = {}
    for placement in ("best_fit", "by_end"):
        for reclaim in ("LIFO", "CLIENT"):
            ours = Ours(kept, reclaim_policy=reclaim)
            ours.placement = placement
            runs[placement, reclaim] = simulate(
                CONFIG, tasks, Reclaim("r", 40, load=0.0, at=30.0, hold=10_000.0), ours)
    assert runs["best_fit", "CLIENT"].units_lost == runs["best_fit", "CLIENT"].cut_floor == 8
    assert runs["by_end", "CLIENT"].units_lost == runs["by_end", "CLIENT"].cut_floor == 0
    assert runs["by_end", "LIFO"].units_lost == 8
    assert all(r.finished for r in runs.values())
    assert runs["by_end", "CLIENT"].makespan <= runs["best_fit", "CLIENT"].makespan
