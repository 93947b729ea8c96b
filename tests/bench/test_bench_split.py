"""bench/bench_split.py, the cost of ``elasticslice run``'s split by trust: a quick run through
the harness (``python -m bench --quick --only split``) makes every figure, and the manager
daemon's side loads no Dask. Timings are the benchmark's to report, never asserted here."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow   # a subprocess of ours, and children of its own

SIZES = (10, 100, 1000)
REFRESH_SIZES = (10, 100, 1000)


def test_a_quick_run_makes_every_figure_and_the_daemon_loads_no_dask(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "split",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())["split"]
    assert "error" not in figures, figures
    for n in SIZES:
        for key in (f"split_pilots_frame_{n}_channel_ms", f"split_pilots_frame_{n}_handled_ms"):
            assert figures[key] > 0, key
    for n in REFRESH_SIZES:
        assert figures[f"split_refresh_{n}_pilots_ms"] > 0
        assert isinstance(figures[f"split_refresh_{n}_pilots_late"], int)
    assert figures["split_pilots_frame_1000_bytes"] > 1000 * 50   # ~100 B a pilot
    assert 0 < figures["split_pilots_per_max_frame"] <= figures["split_max_pilots"]
    for side in ("bare", "daemon", "workload"):
        assert figures[f"split_{side}_rss_mib"] > 0 and figures[f"split_{side}_modules"] > 0
    # the check: the manager daemon's imports load none of Dask's, Parsl's, cloudpickle
    assert figures["split_daemon_loads"] == []
    assert figures["split_daemon_imports_no_dask"] is True
    assert figures["goal_daemon_imports_no_dask"] is True
    # and the probe does see them where they are (the check is not vacuous)
    assert {"dask", "distributed"} <= set(figures["split_workload_loads"])
    assert {"goal_1000_pilots_frame_under_20_ms", "goal_refresh_under_5_ms"} <= set(figures)
    assert "== split" in proc.stdout
    assert "daemon's side loads Dask, distributed, Parsl or cloudpickle" in proc.stdout
    # CloudLabProvider's split: its daemon's imports load no Parsl, ZeroMQ or pickler, where
    # the provider's side does load Parsl (the probe sees it)
    assert figures["split_parsl_daemon_loads"] == []
    assert figures["goal_parsl_daemon_imports_no_parsl"] is True
    assert figures["split_parsl_daemon_rss_mib"] > 0
    assert figures["split_parsl_provider_rss_mib"] > 0
    assert 0 < figures["split_parsl_blocks_frame_100_bytes"] < (1 << 20)
    assert "Parsl daemon's side loads Parsl, ZeroMQ" in proc.stdout
