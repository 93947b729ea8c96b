"""The chaos suite (bench/chaos): its schedule is seeded, and one run with every kind of
fault keeps the invariants (nothing lost, no leaked node, no duplicate add, no lapse)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import Kind, chaos_run, make_schedule
from bench.chaos.__main__ import main
from tests.elasticslice.conftest import emulator_pki  # noqa: F401 (the fixture)


def test_the_same_seed_replays_the_same_schedule() -> None:
    assert make_schedule(7) == make_schedule(7)
    assert make_schedule(7) != make_schedule(8)
    kinds = {f.kind for seed in range(10) for f in make_schedule(seed)}
    assert kinds == set(Kind)  # every fault is drawn by some seed
    assert all(0 < f.at <= 12.0 for f in make_schedule(3))


def test_one_chaos_run_keeps_the_invariants(emulator_pki: Path, tmp_path: Path) -> None:
    # seed 1: manager restart, pilot SIGKILL, faulty answers, a zero-notice revocation,
    # an emulator restart and a dropped callback endpoint, all mid-workflow
    kinds = {f.kind for f in make_schedule(1)}
    assert {Kind.MANAGER_RESTART, Kind.PILOT_KILL, Kind.EMULATOR_RESTART} <= kinds
    result = chaos_run(1, tmp_path / "run", emulator_pki)
    assert result.error is None, result
    assert result.units == 10 and result.units_done == 10, result
    assert (result.units_lost, result.nodes_leaked, result.duplicate_adds,
            result.slice_lapses) == (0, 0, 0, 0), result
    assert result.kills >= 2 and result.faults_injected >= 4, result.injected


def test_bad_arguments_are_one_line(capsys, tmp_path: Path) -> None:
    for argv in (["--runs", "0"], ["--workflow", str(tmp_path / "nope.json")]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "--runs must be at least 1" in err or "no such file" in err
