"""``python -m bench``, the benchmark harness: its JSON, its table and its one-line errors.
(Benchmarks are never part of ``make test``: this runs the quickest one, credentials.)"""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_quick_run_of_one_benchmark_writes_its_figures_and_prints_its_table(tmp_path):
    out = tmp_path / "figures.json"
    proc = bench("--quick", "--only", "credentials", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert results["meta"]["quick"] is True and results["meta"]["benchmarks"] == ["credentials"]
    assert results["meta"]["python"] and results["meta"]["machine"]["cpus"] >= 1
    figures = results["credentials"]
    assert figures["verify_slice_credential_ms_per_call"] > 0
    assert figures["emulator_cached_check_ms_per_call"] > 0
    assert "== credentials" in proc.stdout
    assert "verify_credential, SA-signed slice credential" in proc.stdout


def test_unknown_benchmark_is_one_line_naming_it_and_the_known_ones():
    proc = bench("--only", "no_such_bench")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "no benchmark named no_such_bench" in proc.stderr and "troy" in proc.stderr


def test_benchmark_out_of_time_is_one_line_and_a_failed_entry(tmp_path):
    out = tmp_path / "figures.json"
    proc = bench("--quick", "--only", "credentials", "--timeout", "0.01", "--json", str(out))
    assert proc.returncode == 1
    assert "python -m bench: bench_credentials: no result within 0.01 s" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(out.read_text())["credentials"] == {
        "error": "bench_credentials: no result within 0.01 s"}
