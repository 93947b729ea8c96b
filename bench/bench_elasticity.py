"""Elasticity by simulation: our scaling policy against static, the seed, Parsl- and Dask-like.

    .venv/bin/python bench/bench_elasticity.py [--quick]

The manager's real policy code (:func:`elasticslice.managers.policy.decide`) runs on a
virtual clock (``bench/elastic``: no sleeping) against the emulator's model of a CM: other
tenants' load, reclaims of our newest nodes (LIFO: ``ours_lifo``; ours: CLIENT, the nodes our
values put lowest) with a countdown, nodes that boot for 5 minutes, and a slice whose last
node CloudLab refuses to take (every policy keeps one node).
The work is a campaign of the WfFormat workflows in ../shared/workloads/wfinstances (or
examples/workflows): copies of each, in waves. Each policy meets the same work under three
tenant-load patterns: ``steady`` (40% of the pool), ``bursty`` (the emulator's seeded load
model around 60%, redrawn every 20 minutes) and ``reclaim50`` (12 minutes in, while the
first wave is at its widest, the tenants take half of our nodes, for an hour). Reported
per pattern and policy: makespan, makespan over the lower bound (max of the critical path
and work / peak cores), node-hours held, idle node-hours (ready, running nothing),
revocations, units lost (cut by a revocation and run again) and their core-hours. Plots: nodes held, units running and tenant load over time, a panel per policy.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from elastic.policies import DaskAdaptive, Ours, ParslBlocks, SeedDefaults, Static  # noqa: E402
from elastic.sim import Policy, Result, SimConfig, simulate  # noqa: E402
from elastic.tenants import patterns  # noqa: E402
from elastic.workload import campaign, workflow_files  # noqa: E402

from elasticslice.managers.policy import PolicyConfig  # noqa: E402
from elasticslice.pilots.managerdaemon import default_policy  # noqa: E402

log = logging.getLogger(__name__)
RESULTS = Path(__file__).resolve().parent / "results"
HOUR = 3600.0


def cluster_defaults(max_nodes: int) -> PolicyConfig:
    """The pilot cluster's policy as shipped (``ElasticCluster``'s defaults, from
    :func:`elasticslice.pilots.managerdaemon.default_policy`; ``run`` keeps idle pilots 60 s and
    one node at least)."""
    return dataclasses.replace(default_policy(max_nodes), minthreshold=1, maxthreshold=max_nodes,
                               idle_timeout=60.0,
                               enable_delete=True)


def our_config(max_nodes: int) -> PolicyConfig:
    """Our policy as proposed for elastic pilots (docs/manager-policy.md, "Should the
    defaults change?"): the cluster's defaults with idle pilots given back after 10 s and no
    node kept without work (``minthreshold`` 0)."""
    return dataclasses.replace(cluster_defaults(max_nodes), idle_timeout=10.0, minthreshold=0)


def policies(max_nodes: int) -> list[Policy]:
    """Ours under CLIENT (``manage``/``run`` register CLIENT where the CM offers it), the
    same under LIFO, the cluster as shipped, and the baselines."""
    return [Ours(our_config(max_nodes), reclaim_policy="CLIENT"),
            Ours(our_config(max_nodes), name="ours_lifo"),
            Ours(cluster_defaults(max_nodes), name="ours_cluster_defaults",
                 reclaim_policy="CLIENT"),
            Static(max_nodes), SeedDefaults(max_nodes), ParslBlocks(max_nodes),
            DaskAdaptive(max_nodes)]


def scenario(quick: bool) -> tuple[SimConfig, list[Any], float]:
    """(config, tasks, when the 50% reclaim starts)."""
    config = SimConfig()
    if quick:
        waves, copies = [0.0, 1.5 * HOUR], 4
    else:
        waves, copies = [0.0, 2.5 * HOUR, 5 * HOUR], 24
    tasks = campaign(workflow_files(), waves, copies=copies, time_scale=2.0,
                     max_cores=config.cores_per_node)
    return config, tasks, 0.2 * HOUR   # the first wave at its widest


def simulate_all(quick: bool) -> tuple[SimConfig, list[Result]]:
    config, tasks, reclaim_at = scenario(quick)
    results = []
    for i in range(len(patterns(config.total_nodes, reclaim_at=reclaim_at))):
        for policy in policies(config.max_nodes):
            # patterns and policies keep state: fresh ones for every run
            pattern = patterns(config.total_nodes, reclaim_at=reclaim_at)[i]
            results.append(simulate(config, tasks, pattern, policy))
    return config, results


def figures(results: list[Result]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by = {(r.pattern, r.policy): r for r in results}
    for r in results:
        key = f"elastic_{r.pattern}_{r.policy}"
        out[f"{key}_makespan_h"] = round(r.makespan / HOUR, 3)
        out[f"{key}_makespan_over_lower_bound"] = round(r.ratio, 3)
        out[f"{key}_node_hours"] = round(r.node_hours, 2)
        out[f"{key}_idle_node_hours"] = round(r.idle_node_hours, 2)
        out[f"{key}_revocations"] = r.revocations
        out[f"{key}_units_lost"] = r.units_lost
        out[f"{key}_lost_core_hours"] = round(r.lost_core_hours, 2)
        out[f"{key}_units_cut_floor"] = r.cut_floor
        out[f"{key}_finished"] = r.finished
        out[f"elastic_{r.pattern}_lower_bound_h"] = round(r.lower_bound / HOUR, 3)
    for pattern in sorted({r.pattern for r in results}):
        ours = by[(pattern, "ours")]
        for peer in ("static", "seed", "parsl", "dask"):
            other = by[(pattern, peer)]
            out[f"ratio_elastic_{pattern}_ours_over_{peer}_node_hours"] = round(
                ours.node_hours / other.node_hours, 3)
        best = min(by[(pattern, "parsl")], by[(pattern, "dask")], key=lambda r: r.node_hours)
        out[f"elastic_{pattern}_ours_vs_best_peer_goal_met"] = bool(
            ours.node_hours <= best.node_hours + 1e-9 and ours.makespan <= best.makespan + 1e-9
            and ours.units_lost <= min(by[(pattern, p)].units_lost for p in ("parsl", "dask")))
        lifo = by[(pattern, "ours_lifo")]
        # CLIENT cutting none counts as one: the ratio is then a lower bound, not a division
        # by zero (and None only when neither cut any)
        out[f"elastic_{pattern}_units_cut_lifo_over_client"] = (
            round(lifo.units_lost / max(ours.units_lost, 1), 3)
            if ours.units_lost or lifo.units_lost else None)
        out[f"elastic_{pattern}_goal_met"] = bool(
            ours.ratio <= 1.2 and ours.node_hours < by[(pattern, "static")].node_hours
            and ours.node_hours < by[(pattern, "seed")].node_hours)
    return out


def table(results: list[Result]) -> list[tuple[str, str]]:
    rows = []
    for r in results:
        rows.append((f"elasticity {r.pattern}: {r.policy}",
                     f"makespan {r.makespan / HOUR:5.2f} h ({r.ratio:4.2f}x bound), "
                     f"{r.node_hours:6.1f} node-h held, {r.idle_node_hours:5.1f} idle, "
                     f"{r.revocations:3d} revoked, {r.units_lost:3d} units cut (re-run, "
                     f"{r.lost_core_hours:4.1f} core-h lost)"
                     + ("" if r.finished else " (UNFINISHED)")))
    return rows


def plot(config: SimConfig, results: list[Result], quick: bool = False) -> list[str]:
    """One PNG per pattern: a panel per policy (nodes held, units running in nodes' worth,
    tenant load as a share of the pool). Paths relative to bench/results; a quick run's are
    named ``*-quick.png`` (not kept: the README shows the full run's)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(parents=True, exist_ok=True)
    paths = []
    for pattern in dict.fromkeys(r.pattern for r in results):
        runs = [r for r in results if r.pattern == pattern]
        fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.8 * len(runs)), sharex=True)
        for ax, r in zip(axes, runs):
            t = [s.t / HOUR for s in r.samples]
            share = ax.twinx()
            share.fill_between(t, [s.tenants / config.total_nodes for s in r.samples],
                               color="0.85", step="post", label="tenant load (share)")
            share.set_ylim(0, 1)
            share.set_ylabel("tenants", fontsize=7)
            ax.set_zorder(share.get_zorder() + 1)
            ax.patch.set_visible(False)
            ax.step(t, [s.held for s in r.samples], where="post", label="nodes held")
            ax.step(t, [s.running_units / config.cores_per_node for s in r.samples],
                    where="post", label="units running / cores per node")
            ax.set_ylim(0, config.max_nodes * 1.15)
            ax.set_ylabel("nodes", fontsize=7)
            ax.set_title(f"{r.policy}: {r.node_hours:.0f} node-h, makespan "
                         f"{r.ratio:.2f}x bound, {r.units_lost} units cut", fontsize=8)
        axes[0].legend(loc="upper right", fontsize=7)
        axes[-1].set_xlabel("hours (virtual)")
        fig.suptitle(f"elasticity, tenant load {pattern}", fontsize=10)
        fig.tight_layout()
        path = RESULTS / f"elasticity_{pattern}{'-quick' if quick else ''}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path.name)
    return paths


def run(quick: bool = False) -> dict[str, Any]:
    config, results = simulate_all(quick)
    out = figures(results)
    out["table"] = table(results)
    out["plots"] = plot(config, results, quick)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller campaign")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from table import print_table
    out = run(quick=args.quick)
    print_table(out["table"])
    print("plots: " + ", ".join(out["plots"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
