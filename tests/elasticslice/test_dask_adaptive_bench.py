"""bench/bench_adaptive.py's simulation: the trace runs to its end under both scalings, and
Dask's target through our policy changes direction less often than Dask's own Adaptive."""
from __future__ import annotations

import sys

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))

from bench_adaptive import Steps, simulate_flapping  # noqa: E402
from elastic.sim import Action  # noqa: E402


def test_steps_count_the_turns_of_the_node_count() -> None:
    steps = Steps()
    for at, action in [(1, Action(add=2)), (2, Action(add=1)), (3, Action(delete=("a",))),
                       (4, Action()), (5, Action(add=1))]:
        steps.record(at, action)
    assert steps.changes() == 2


def test_adapt_through_the_policy_flaps_less_than_dask_adaptive_defaults() -> None:
    figures = simulate_flapping()   # the trace the bench reports (docs/dask.md)
    ours = figures["CloudLabCluster.adapt"]
    dask = figures["dask Adaptive (defaults)"]
    assert ours["direction_changes_per_hour"] < dask["direction_changes_per_hour"]
    assert ours["adds"] < dask["adds"]
