"""bench/goals.py: issue 22's goals table from one run's figures (pass, miss, not run)."""
from __future__ import annotations

import sys

import pytest

from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
goals = pytest.importorskip("goals")  # bench/goals.py
sys.path.remove(str(REPO / "bench"))
Goal = goals.Goal


def rows_by_key(results, registry):
    return {r["figure"]: r for r in goals.evaluate(results, registry)}


def test_a_number_goal_passes_or_misses_by_its_direction():
    registry = {"a_ms": Goal("x", "a", "<=", 25.0, "ms"), "b_ms": Goal("x", "b", "<", 50.0, "ms"),
                "c": Goal("x", "c", ">=", 1.0, "x")}
    rows = rows_by_key({"x": {"a_ms": 25.0, "b_ms": 50.0, "c": 0.99}}, registry)
    assert [rows[k]["status"] for k in ("a_ms", "b_ms", "c")] == ["pass", "miss", "miss"]
    assert rows["a_ms"]["now_text"] == "25 ms" and rows["a_ms"]["goal_text"] == "<= 25 ms"


def test_a_goal_given_by_other_figures_takes_the_best_of_them():
    registry = {"lat_ms": Goal("t", "latency", "<=", "peer_ms", "ms", goal_label="the peer's"),
                "ours_h": Goal("e", "node-h", "<=", ("p_h", "d_h"), "node-h")}
    results = {"t": {"lat_ms": 11.4, "peer_ms": 2.1}, "e": {"ours_h": 72.0, "p_h": 73.3,
                                                            "d_h": 71.3}}
    rows = rows_by_key(results, registry)
    assert rows["lat_ms"]["status"] == "miss" and rows["lat_ms"]["goal"] == 2.1
    assert rows["lat_ms"]["goal_text"] == "<= the peer's (2.1 ms)"
    assert rows["ours_h"]["goal"] == 71.3 and rows["ours_h"]["status"] == "miss"


def test_a_goal_shows_the_figure_that_bounds_it_when_the_run_has_it():
    registry = {"r": Goal("t", "r", ">=", 3.5, "x", bound=("floor_over_peer", "floor / peer"))}
    row = rows_by_key({"t": {"r": 3.2, "floor_over_peer": 3.37}}, registry)["r"]
    assert row["status"] == "miss" and row["goal"] == 3.5   # shown, never the goal itself
    assert row["goal_text"] == ">= 3.5 (floor / peer: 3.37)"
    for results in ({"t": {"r": 3.2}}, {"t": {"error": "failed"}}, {}):
        assert rows_by_key(results, registry)["r"]["goal_text"] == ">= 3.5"


def test_a_ratio_absent_is_derived_from_the_medians_and_says_so():
    registry = {"ratio": Goal("t", "r", ">=", 1.0, "x", derive=("num", ("d1", "d2")))}
    row = rows_by_key({"t": {"num": 120.0, "d1": 506.0, "d2": 300.0}}, registry)["ratio"]
    assert row["now"] == pytest.approx(120 / 506) and row["status"] == "miss"
    assert "of medians" in row["now_text"]


def test_missing_figures_are_not_run_never_an_error():
    registry = {"a": Goal("x", "a", "<=", 1.0, "ms"), "b": Goal("y", "b", "<=", 1.0, "ms"),
                "c": Goal("z", "c", "<=", 1.0, "ms"), "d": Goal("x", "d", "<=", "gone", "ms")}
    rows = rows_by_key({"x": {"a": "text", "d": 0.5}, "y": {"error": "bench_y: failed"}},
                       registry)
    assert {k: r["status"] for k, r in rows.items()} == dict.fromkeys("abcd", "not run")
    assert rows["b"]["now_text"] == "bench_y failed"
    assert rows["c"]["now_text"] == "bench_z not run"
    text = goals.render(list(rows.values()))
    assert "0 pass, 0 miss, 4 not run (of 4)" in text


def test_the_registry_has_issue_22s_rows_and_the_table_has_every_one():
    keys = set(goals.GOALS)
    for key in ("ratio_troy_dask_over_dask_map_null", "troy_dask_latency_ms",
                "rspec_parse_manifest_2000_nodes_ms", "rspec_parse_advertisement_5000_nodes_ms",
                "manager_cycle_cpu_ms_1000_nodes", "manager_cycle_cpu_ms_5000_nodes",
                "elastic_reclaim50_ours_node_hours", "stock_pilot_joined_s",
                "slow_cm_answer_p99_ms"):
        assert key in keys
    text = goals.render(goals.evaluate({"meta": {}}))
    assert text.count("| not run") == len(keys)
    assert text.splitlines()[1].split("|")[-1].strip() == "pass/miss"


def test_issue_36s_ratios_are_rows_and_a_quick_runs_figures_fill_them():
    """Milliseconds move between machines: issue 36's goals are ratios taken in one run."""
    for key, goal in (("rspec_parse_manifest_2000_over_libxml2", 2.0),
                      ("rspec_parse_advertisement_5000_over_libxml2", 2.0),
                      ("manager_cycle_cpu_1000_over_manifest_parse", 1.5),
                      ("manager_cycle_cpu_5000_over_manifest_parse", 1.5),
                      ("ratio_troy_dask_over_dask_map_null", 1.2),
                      ("ratio_troy_dask_bundled_true_over_parsl", 3.5)):
        assert goals.GOALS[key].goal == goal, key
    rows = rows_by_key({"rspec": {"rspec_parse_manifest_2000_over_libxml2": 6.0,
                                  "rspec_parse_advertisement_5000_over_libxml2": 1.9}},
                       goals.GOALS)
    assert rows["rspec_parse_manifest_2000_over_libxml2"]["status"] == "miss"
    assert rows["rspec_parse_advertisement_5000_over_libxml2"]["status"] == "pass"


def test_an_unknown_direction_is_refused():
    with pytest.raises(ValueError, match="op must be one of"):
        Goal("x", "a", "=<", 1.0, "ms")


def test_a_bundled_figure_is_taken_against_the_floor_measured_on_either_side_of_it():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        bench_troy = pytest.importorskip("bench_troy")
    finally:
        sys.path.remove(str(REPO / "bench"))
    # in a round's order, each bundled figure sits between the two floors of its bracket
    order = [name for name, _, _ in bench_troy.throughputs(None, bench_troy.sizes(True))]
    for figure, (before, after) in bench_troy.BRACKETS.items():
        assert order.index(before) + 1 == order.index(figure) == order.index(after) - 1
    # a machine slowing down through a round (the floor 1,000/s, then 800/s) does not read
    # as Troy being slower: 900/s between them is the floor's pace then
    samples = {name: [1.0] for name in order}
    floors = iter([1000.0, 800.0, 800.0, 800.0, 800.0])
    for name in order:
        if name == bench_troy.FLOOR or name.startswith("spawn_floor_true_after_"):
            samples[name] = [next(floors)]
    samples["troy_dask_bundled_true_tasks_per_s"] = [900.0]
    samples["troy_local_bundled_true_tasks_per_s"] = [720.0]
    for key in ("troy_dask_latency_ms", "dask_latency_ms", "parsl_htex_latency_ms"):
        samples[key] = [1.0]
    figures = bench_troy.figures_of(samples, 1)
    assert figures["ratio_troy_dask_bundled_true_over_floor"] == pytest.approx(1.0)
    assert figures["ratio_troy_local_bundled_true_over_floor"] == pytest.approx(0.9)
    # the thread floor and Parsl are still the best peer of the same round
    assert figures["ratio_troy_dask_bundled_true_over_parsl"] == pytest.approx(900.0)
    # and the floor itself over Parsl, what bounds the bundled rows against Parsl
    assert figures["ratio_spawn_floor_over_parsl"] == pytest.approx(1000.0)
    rows = rows_by_key({"troy": figures}, goals.GOALS)
    assert rows["ratio_troy_dask_bundled_true_over_parsl"]["goal_text"] == \
        ">= 3.5 (spawn floor / Parsl: 1,000)"


def test_the_memory_kept_per_task_sees_workloads_a_session_keeps(monkeypatch, tmp_path):
    """The figure counts what a session still holds after its workloads were let go: a
    session that kept them (as the unit service's units did through their callbacks) reads
    their tasks too: about 700 bytes a task more (the units it keeps: about 1,000)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        bench_troy = pytest.importorskip("bench_troy")
    finally:
        sys.path.remove(str(REPO / "bench"))
    import troy
    from troy.overlay import OverlayManager
    with troy.Session(store_path=tmp_path / "troy.sqlite") as session:
        session.add_framework("local", sandbox=str(tmp_path / "sandbox"))
        overlay = troy.Overlay([{"size": 2, "framework": "local"}])
        OverlayManager(session).manage_overlay(overlay)
        engines = type("E", (), {"sessions": {"local": session},
                                 "overlays": {"local": overlay}})()
        try:
            freed = bench_troy.kept_bytes_per_task(engines, 500, "auto")
            kept: list = []
            pipeline = bench_troy.pipeline

            def keeping(e, kind, n, bundle):   # the workloads stay referenced
                real = troy.Workload
                monkeypatch.setattr(troy, "Workload", lambda: kept.append(real()) or kept[-1])
                try:
                    return pipeline(e, kind, n, bundle)
                finally:
                    monkeypatch.setattr(troy, "Workload", real)
            monkeypatch.setattr(bench_troy, "pipeline", keeping)
            held = bench_troy.kept_bytes_per_task(engines, 500, "auto")
        finally:
            overlay.cancel()
    assert len(kept) == 3
    assert 0 < freed < 2000 and held - freed > 400, (freed, held)
