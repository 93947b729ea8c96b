"""The goals of ``python -m bench``: issue 22's table (and later issues' rows), one row per
figure, with pass/miss.

:data:`GOALS` maps a figure's key (as its benchmark writes it to ``latest.json``) to a
:class:`Goal`: the benchmark that makes it, the measure's label, the direction (``<=``,
``<``, ``>=``, ``>``), the goal (a number, or other figures of the same run: the best of
them, e.g. "<= Parsl's latency") and the unit. A benchmark's helper adds its rows here by
key; :func:`evaluate` reads one run's results and :func:`render` prints the "Goals" table
the harness shows after the usual one (and writes into ``latest.json``/``latest.txt``).

A figure that is missing (its benchmark not run, failed, or not making that key yet) is
"not run", never an error: the table always has every row.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
PASS, MISS, NOT_RUN = "pass", "miss", "not run"


@dataclass(frozen=True)
class Goal:
    bench: str                 # bench/bench_<bench>.py makes the figure
    label: str                 # the measure, as the table says it
    op: str                    # one of OPS: figure OP goal passes
    goal: float | str | tuple[str, ...]   # a number, or figure key(s) of the same run
    unit: str                  # "x", "ms", "s", "node-h", ...
    goal_label: str = ""       # names a goal given by figures ("Parsl HTEX's")
    # when the key itself is absent: numerator / the best (largest) of the denominators,
    # from the benchmark's medians (a ratio taken inside each round is better: add the key)
    derive: tuple[str, tuple[str, ...]] | None = None
    # (figure key, label): a figure of the same benchmark shown beside the goal, where it
    # bounds what the measure can reach (the spawn floor over Parsl, for bundles that run
    # their members as the floor does): "(spawn floor / Parsl: 3.37)"
    bound: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"goal {self.label!r}: op must be one of {', '.join(OPS)}")


#: a bundle runs each member as a process of its own, as the spawn floor does; a member's
#: own process is 86-89 % of its CPU (bench/profile_spawn.py): the floor bounds bundles
_FLOOR_OVER_PARSL = ("ratio_spawn_floor_over_parsl", "spawn floor / Parsl")
_DASK_MAP_TRUE = ("dask_map_true_tasks_per_s", "dask_map_default_saturation_true_tasks_per_s")

# Issue 22's table, in its order. Keys marked "proposed" are not made by their benchmark yet:
# their helper makes them (or changes the key here), and until then the row is "not run".
GOALS: dict[str, Goal] = {
    # bench_troy (helper U): throughput and latency on 2 workers, ratios inside each round
    # (issue 36 raised the first two to 1.2 and the bundled / Parsl rows to 3.5)
    "ratio_troy_dask_over_dask_map_null": Goal(
        "troy", "Troy on Dask, one unit per task / raw Dask map, null", ">=", 1.2, "x"),
    "ratio_troy_dask_over_dask_map_true": Goal(
        "troy", "Troy on Dask, one unit per task / raw Dask map, /bin/true", ">=", 1.2, "x"),
    "ratio_troy_pipeline_dask_unbundled_over_dask_map_true": Goal(
        "troy", "whole pipeline on Dask, unbundled /bin/true / raw Dask map", ">=", 1.0, "x",
        derive=("troy_pipeline_dask_unbundled_true_tasks_per_s", _DASK_MAP_TRUE)),
    "ratio_troy_dask_bundled_true_over_floor": Goal(
        "troy", "bundled /bin/true / spawn floor, direct on Dask", ">=", 0.9, "x"),
    "ratio_troy_pipeline_dask_bundled_true_over_floor": Goal(
        "troy", "bundled /bin/true / spawn floor, whole pipeline on Dask", ">=", 0.9, "x"),
    "ratio_troy_dask_bundled_true_over_parsl": Goal(
        "troy", "bundled /bin/true / Parsl HTEX's best, direct on Dask", ">=", 3.5, "x",
        bound=_FLOOR_OVER_PARSL),
    "ratio_troy_pipeline_dask_bundled_true_over_parsl": Goal(
        "troy", "bundled /bin/true / Parsl HTEX's best, whole pipeline on Dask", ">=", 3.5,
        "x", bound=_FLOOR_OVER_PARSL),
    "troy_dask_latency_ms": Goal(
        "troy", "back-to-back latency, Troy on Dask", "<=", "parsl_htex_latency_ms", "ms",
        goal_label="Parsl HTEX's"),
    # bench_rspec (helper C): wall median of 31 parses
    "rspec_parse_manifest_2000_nodes_ms": Goal(
        "rspec", "2,000-node manifest parse", "<=", 25.0, "ms"),
    "rspec_parse_advertisement_5000_nodes_ms": Goal(
        "rspec", "5,000-node advertisement parse", "<=", 50.0, "ms"),
    # issue 36: the same parses' CPU over libxml2's own read of the document (a parser
    # target with no callbacks), round by round: milliseconds move 1.5-2x between machines
    "rspec_parse_manifest_2000_over_libxml2": Goal(
        "rspec", "2,000-node manifest parse / libxml2's own read of it", "<=", 2.0, "x"),
    "rspec_parse_advertisement_5000_over_libxml2": Goal(
        "rspec", "5,000-node advertisement parse / libxml2's own read of it", "<=", 2.0, "x"),
    # bench_manager (helper C): the manager's CPU per full cycle, median of 3
    "manager_cycle_cpu_ms_1000_nodes": Goal(
        "manager", "manager cycle CPU, 1,000 nodes", "<", 50.0, "ms"),
    "manager_cycle_cpu_ms_5000_nodes": Goal(
        "manager", "manager cycle CPU, 5,000 nodes", "<", 250.0, "ms"),
    # issue 36: a full cycle's CPU over parsing that slice's manifest, round by round
    **{f"manager_cycle_cpu_{n}_over_manifest_parse": Goal(
        "manager", f"manager cycle CPU, {n:,} nodes / parsing their manifest", "<=", 1.5, "x")
       for n in (1000, 5000)},
    # bench_elasticity (helper V): the simulation, ours against the best of the peers
    **{f"elastic_{trace}_ours_node_hours": Goal(
        "elasticity", f"elasticity node-hours held, {trace} trace, ours", "<=",
        (f"elastic_{trace}_parsl_node_hours", f"elastic_{trace}_dask_node_hours"),
        "node-h", goal_label="the best peer's (Parsl-like, Dask-like)")
       for trace in ("reclaim50", "steady", "bursty")},
    **{f"elastic_{trace}_ours_makespan_over_lower_bound": Goal(
        "elasticity", f"elasticity makespan / lower bound, {trace} trace, ours", "<=",
        (f"elastic_{trace}_parsl_makespan_over_lower_bound",
         f"elastic_{trace}_dask_makespan_over_lower_bound"),
        "x", goal_label="the best peer's")
       for trace in ("reclaim50", "steady", "bursty")},
    # units cut under LIFO / under CLIENT with our values, reclaim50 trace: at least halved
    "elastic_reclaim50_units_cut_lifo_over_client": Goal(
        "elasticity", "units cut on reclaim50, LIFO / CLIENT with our values", ">=", 2.0,
        "x"),
    # proposed, bench_cluster16 (helper U): the 16-node box cluster against raw Dask there
    "ratio_cluster16_troy_over_dask_map": Goal(
        "cluster16", "units/s through a 16-node box cluster / raw Dask map, same 16 workers",
        ">=", 1.0, "x"),
    # bench_join (helper C): ElasticCluster, node ready (as its manager sees it) -> pilot
    # joined. A CloudLab node takes minutes from AddNodes to ready (imaging, booting); 10 s
    # more is a few per cent of that, and a twelfth of agent_timeout (120 s).
    "stock_pilot_joined_s": Goal(
        "join", "node ready -> pilot joined, stock image (env built from the wheelhouse)",
        "<=", 10.0, "s"),
    "custom_pilot_joined_s": Goal(
        "join", "node ready -> pilot joined, pilot image (node_python)", "<=", 5.0, "s"),
    # bench_drain's slow-CM cases (helper C): NotifyDeletePending answered, as the CM saw it.
    # CloudLab repeats the notice about once a minute and its XML-RPC client gives up on a
    # call (the emulator: after 10 s); 200 ms is 1/50 of that, while AddNodes is held 30 s.
    "slow_cm_answer_p99_ms": Goal(
        "drain", "notice -> answer p99, CM holding AddNodes 30 s", "<=", 200.0, "ms"),
    "busy_cm_answer_p99_ms": Goal(
        "drain", "notice -> answer p99, CM answering AddNodes BUSY", "<=", 200.0, "ms"),
    # bench_addnodes (issue 33): AddNodes on the box at CloudLab's pace, the slice holding
    # 1 to 64 nodes. CloudLab's CM fetches every tarball URL of the sliver again at each
    # AddNodes: with one URL the whole slice shares, the call must not grow with the slice.
    "addnodes_shared_url_largest_over_smallest": Goal(
        "addnodes", "AddNodes time, most nodes held / fewest, one URL the slice shares",
        "<=", 1.10, "x"),
    # bench_listeners (issue 34): the CM's NotifyDeletePending while strangers hold 1,000
    # idle and 100 trickling connections on each listener of the control node.
    "listeners_notice_flooded_p99_ms": Goal(
        "listeners", "CM notice answered p99, 1,000 idle + 100 trickling connections on each "
        "listener", "<=", 200.0, "ms"),
    "listeners_notice_flooded_failed": Goal(
        "listeners", "CM notices not answered under that flood", "<=", 0.0, ""),
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def figure(results: dict[str, Any], key: str, goal: Goal) -> tuple[float | None, str]:
    """(the figure, how it was found: "" if by its key, else why it is missing/derived)."""
    figures = results.get(goal.bench)
    if not isinstance(figures, dict):
        return None, f"bench_{goal.bench} not run"
    if "error" in figures:
        return None, f"bench_{goal.bench} failed"
    if key in figures:
        value = _number(figures[key])
        return value, "" if value is not None else f"{key} is not a number"
    if goal.derive:
        top, peers = goal.derive
        num = _number(figures.get(top))
        dens = [d for d in (_number(figures.get(p)) for p in peers) if d]
        if num is not None and dens:
            return num / max(dens), "of medians"
    return None, f"no {key} in bench_{goal.bench}"


def target(results: dict[str, Any], goal: Goal) -> float | None:
    if not isinstance(goal.goal, (str, tuple)):
        return float(goal.goal)
    keys = (goal.goal,) if isinstance(goal.goal, str) else goal.goal
    figures = results.get(goal.bench) or {}
    values = [v for v in (_number(figures.get(k)) for k in keys) if v is not None]
    if not values:
        return None
    # the best of them is the hardest to meet: the smallest for <=, the largest for >=
    return min(values) if goal.op in ("<=", "<") else max(values)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}" if unit != "x" else text


def evaluate(results: dict[str, Any],
             goals: dict[str, Goal] | None = None) -> list[dict[str, Any]]:
    """One row per goal: figure, measure, now, goal, status (pass / miss / not run)."""
    rows = []
    for key, goal in (GOALS if goals is None else goals).items():
        now, how = figure(results, key, goal)
        want = target(results, goal)
        if now is None or want is None:
            status = NOT_RUN
        elif math.isnan(now):
            status = MISS
        else:
            status = PASS if OPS[goal.op](now, want) else MISS
        goal_text = f"{goal.op} {_fmt(want, goal.unit)}" if want is not None else \
            f"{goal.op} ?"
        if goal.goal_label:
            goal_text = f"{goal.op} {goal.goal_label}" + (
                f" ({_fmt(want, goal.unit)})" if want is not None else "")
        if goal.bound is not None:
            figures = results.get(goal.bench)
            bound = _number(figures.get(goal.bound[0])) if isinstance(figures, dict) else None
            if bound is not None:
                goal_text += f" ({goal.bound[1]}: {_fmt(bound, goal.unit)})"
        rows.append({"figure": key, "bench": goal.bench, "measure": goal.label,
                     "now": now, "goal": want, "op": goal.op, "unit": goal.unit,
                     "status": status,
                     "now_text": (_fmt(now, goal.unit) + (f" ({how})" if how else "")
                                  if now is not None else how),
                     "goal_text": goal_text})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """The "Goals" table: measure | now | goal | pass/miss, and a count."""
    header = ("measure", "now", "goal", "pass/miss")
    table = [header] + [(r["measure"], r["now_text"], r["goal_text"], r["status"])
                        for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    lines = ["== goals (issue 22)"]
    for row in table:
        lines.append("  " + " | ".join(f"{cell:<{w}}" for cell, w in zip(row, widths))
                     + f" | {row[3]}")
    counts = {s: sum(r["status"] == s for r in rows) for s in (PASS, MISS, NOT_RUN)}
    lines.append(f"  {counts[PASS]} pass, {counts[MISS]} miss, {counts[NOT_RUN]} not run "
                 f"(of {len(rows)})")
    return "\n".join(lines)
