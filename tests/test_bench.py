"""``python -m bench``, the benchmark harness: its JSON, its table and its one-line errors.
(Benchmarks are never part of ``make test``: this runs the quickest one, credentials.)"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow


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
    # the goals table: every row of issue 22, here all "not run" (their benchmarks were not)
    goals = results["goals"]
    assert goals and {g["status"] for g in goals} == {"not run"}
    assert "rspec_parse_manifest_2000_nodes_ms" in {g["figure"] for g in goals}
    assert "== goals (issue 22)" in proc.stdout
    assert f"0 pass, 0 miss, {len(goals)} not run (of {len(goals)})" in proc.stdout


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


def listening_addresses(pid: int) -> set[str]:
    import psutil
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    found = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
    return found


def test_parsl_peer_listens_on_loopback_only():
    """The bench's Parsl HighThroughputExecutor (interchange, workers) binds 127.0.0.1 only:
    by default it would offer every address of the machine to its workers."""
    pytest.importorskip("parsl")  # the bench extra
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from parsl_peer import ParslPeer
        with ParslPeer(1) as peer:
            peer.once()
            addresses = listening_addresses(os.getpid())
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert addresses, "the interchange listens somewhere"
    # ZeroMQ binds IPv6 sockets: 127.0.0.1 shows as ::ffff:127.0.0.1 (still only loopback)
    as_v4 = {getattr(ipaddress.ip_address(a), "ipv4_mapped", None) or ipaddress.ip_address(a)
             for a in addresses}
    assert as_v4 == {ipaddress.ip_address("127.0.0.1")}, addresses


def test_the_spawn_profile_splits_a_members_cpu_between_its_process_and_its_spawner(
        tmp_path):
    out = tmp_path / "member.svg"
    proc = subprocess.run([sys.executable, "bench/profile_spawn.py", "--members", "500",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == [
        "spawn floor", "Troy bundles of 250, 2 at a time (C runner)"]
    for line in lines[:2]:   # "...: member 490 µs + spawner 68 µs of CPU; 3,369 members/s"
        found = re.search(r"member (\d+) µs \+ spawner (\d+) µs of CPU; [\d,]+ members/s", line)
        assert found, line
        member, spawner = int(found[1]), int(found[2])
        assert member > spawner > 0   # the member's process is most of it, the spawner some
    assert out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()
