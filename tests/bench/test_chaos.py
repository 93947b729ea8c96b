"""The chaos suite (bench/chaos): its schedule is seeded, a smoke run of its entry point keeps
the invariants (nothing lost, no leaked node, no duplicate add, no lapse), and the emulator's
callback switch it drops the CM's calls with."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.chaos import Kind, make_schedule
from bench.chaos.__main__ import main
from elasticslice.emulator.adminclient import AdminClient
from tests.helpers import REPO, WORKFLOWS, wait_for
from tests.elasticslice.emulator.helpers import dynamic_slice


def last_words(run: Path) -> str:
    """The end of each cluster process' output and run.log of a failed run (the run's
    folder is gone with the test's tmp_path on CI)."""
    parts = []
    for log in sorted(run.glob("process-*.log")) + [run / "cluster" / "run.log"]:
        if log.exists():
            parts.append(f"\n--- {log.name}:\n" + log.read_text(errors="replace")[-2500:])
    return "".join(parts)


def test_the_same_seed_replays_the_same_schedule() -> None:
    assert make_schedule(7) == make_schedule(7)
    assert make_schedule(7) != make_schedule(8)
    kinds = {f.kind for seed in range(10) for f in make_schedule(seed, sites=2)}
    assert kinds == set(Kind)  # every fault is drawn by some seed
    assert all(0 < f.at <= 12.0 for f in make_schedule(3))
    # one CM: no CM outage; several: the same faults, and one CM's outage besides
    assert all(f.kind is not Kind.CM_BUSY for seed in range(10) for f in make_schedule(seed))
    two = make_schedule(7, sites=2)
    assert [f for f in two if f.kind is not Kind.CM_BUSY] == make_schedule(7)
    assert sum(f.kind is Kind.CM_BUSY for f in two) == 1


def test_a_sliver_gone_at_either_cm_is_a_lapse_and_client_ids_are_per_cm() -> None:
    """The invariants over a box of two CMs: the slice's sliver at the second CM going
    while the work runs is a lapse, as the first's is; the same client_id held at two CMs
    is two nodes, held twice at one CM a duplicate add."""
    from bench.chaos.invariants import Sample, duplicate_adds, slice_lapses
    u, far = "urn:slice", 1e12

    def at(t: float, slivers: set, held: list, ended: bool = False) -> Sample:
        return Sample(t, {u: far}, slivers, held, ended)

    both = {("utah", u), ("wisc", u)}
    assert slice_lapses([at(1, {("utah", u)}, []), at(2, both, []), at(3, both, [])], u) == 0
    assert slice_lapses([at(1, both, []), at(2, {("utah", u)}, []), at(3, both, [])], u) == 1
    assert slice_lapses([at(1, both, []), at(2, {("wisc", u)}, [])], u) == 1
    assert slice_lapses([at(1, both, []), at(2, set(), [], ended=True)], u) == 0
    per_cm = [(u, "node-1", "ms1001", "utah"), (u, "node-1", "c220g5n01", "wisc")]
    known = {"ms1001", "c220g5n01", "ms1002"}
    assert duplicate_adds([at(1, both, per_cm)], u, known, {"node-1"}, 3) == 0
    twice = per_cm + [(u, "node-1", "ms1002", "utah")]
    assert duplicate_adds([at(1, both, twice)], u, known, {"node-1"}, 3) == 1
    assert duplicate_adds([at(1, both, twice)], u, known, {"node-1"}, 2) == 2


@pytest.mark.slow
def test_a_smoke_run_of_the_entry_point_keeps_the_invariants(tmp_path: Path) -> None:
    """``python -m bench.chaos`` with a tiny workflow (5 short tasks): one seeded run, its
    line, its JSON. The measuring (20 runs of the 10-task fork-join, every fault) is
    ``make chaos``'s; docs/chaos.md has its figures."""
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--runs", "1", "--seed", "1", "--workflow",
         str(WORKFLOWS / "helloworld-chain-5-chameleon.json"), "--time-scale", "0.01",
         "--workdir", str(tmp_path / "work"), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:]
                                  + last_words(tmp_path / "work" / "run-1"))
    assert proc.stdout.startswith("run seed=1: ok "), proc.stdout
    totals = json.loads(out.read_text())["totals"]
    assert (totals["runs"], totals["runs_failed"], totals["units"]) == (1, 0, 5), totals
    assert (totals["units_lost"], totals["nodes_leaked"], totals["duplicate_adds"],
            totals["slice_lapses"]) == (0, 0, 0, 0), totals


def test_dropped_callbacks_reach_the_endpoint_only_once_the_connection_is_back(
        emulator_factory, endpoint_factory) -> None:
    emulator = emulator_factory(max_wait=30, notify_interval=0.3)
    ep = endpoint_factory(emulator, early=False, user_cert=True)
    s, urn, cred = dynamic_slice(emulator, ep)
    node_id = next(d["component_urn"] for d in s.status(urn, cred)["details"].values()
                   if d["client_id"] == "n2").rsplit("+", 1)[-1]
    callbacks = emulator.server.reclaimer.callbacks
    callbacks.fail_for(4.0)
    failed = callbacks.failures
    AdminClient(emulator.dir).call("Revoke", nodes=[node_id])
    wait_for(lambda: callbacks.failures >= failed + 2, timeout=20,
             what="the countdown's notices failing")
    assert "NotifyDeletePending" not in ep.methods()  # nothing reached the endpoint
    wait_for(lambda: "NotifyDeletePending" in ep.methods(), timeout=30,
             what="the countdown once the connection is back")


def test_bad_arguments_are_one_line(capsys, tmp_path: Path) -> None:
    for argv in (["--runs", "0"], ["--workflow", str(tmp_path / "nope.json")]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--runs must be at least 1" in err or "no such file" in err
