"""The chaos suite (bench/chaos): its schedule is seeded, one run with every kind of fault
keeps the invariants (nothing lost, no leaked node, no duplicate add, no lapse), and the
emulator's callback switch it drops the CM's calls with."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import Kind, chaos_run, make_schedule
from bench.chaos.__main__ import main
from elasticslice.emulator.adminclient import AdminClient
from tests.conftest import wait_for
from tests.elasticslice.conftest import emulator_factory, emulator_pki  # noqa: F401 (fixtures)
from tests.elasticslice.emulator.test_dynamic import (  # noqa: F401 (the fixture)
    _dynamic_slice, endpoint_factory)


def test_the_same_seed_replays_the_same_schedule() -> None:
    assert make_schedule(7) == make_schedule(7)
    assert make_schedule(7) != make_schedule(8)
    kinds = {f.kind for seed in range(10) for f in make_schedule(seed)}
    assert kinds == set(Kind)  # every fault is drawn by some seed
    assert all(0 < f.at <= 12.0 for f in make_schedule(3))


def test_one_chaos_run_keeps_the_invariants(emulator_pki: Path, tmp_path: Path) -> None:
    # seed 1: a SIGKILL of the cluster's process (then the same command resumes), a pilot
    # SIGKILL, faulty answers, a revocation, an emulator restart, dropped callbacks
    kinds = {f.kind for f in make_schedule(1)}
    assert {Kind.MANAGER_RESTART, Kind.PILOT_KILL, Kind.EMULATOR_RESTART} <= kinds
    result = chaos_run(1, tmp_path / "run", emulator_pki)
    assert result.error is None, result
    assert result.units == 10 and result.units_done == 10, result
    assert (result.units_lost, result.nodes_leaked, result.duplicate_adds,
            result.slice_lapses) == (0, 0, 0, 0), result
    assert result.kills >= 2 and result.faults_injected >= 4, result.injected
    assert result.processes == 2, result  # the manager's process was killed and came back
    # from what ran: a unit that ended on its node while the cluster's process was dead
    # reran unseen by the counters (the report says 0), the records of its runs saw it
    assert result.duplicate_runs >= result.duplicate_runs_counted, result


def test_dropped_callbacks_reach_the_endpoint_only_once_the_connection_is_back(
        emulator_factory, endpoint_factory) -> None:  # noqa: F811 (the fixture)
    emulator = emulator_factory(max_wait=30, notify_interval=0.3)
    ep = endpoint_factory(emulator, early=False, user_cert=True)
    s, urn, cred = _dynamic_slice(emulator, ep)
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
