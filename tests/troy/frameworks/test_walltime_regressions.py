"""A pilot's walltime, or its cancel, on the ``local`` framework: its units go to another pilot.

Broke under the suite's load (a fresh-clone run): the pilot's killed unit was requeued by its
thread while the pilot was still RUNNING (the timer thread had not yet set it DONE), and the
next placement put the unit back on it; it ran on, on a pilot that then ended DONE, and never
moved. The pilot now takes no unit from the moment its walltime is over; the same for a
canceled pilot (seen in a suite run: its killed unit went back onto the pilot being canceled,
which then ended CANCELED with the unit running on it)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import troy
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import running_pilot
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.local import LocalFramework


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["walltime", "cancel"])
def test_a_pilots_unit_moves_even_when_the_pilot_ends_late(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str) -> None:
    framework = LocalFramework(f"fw-{ending}", sandbox=str(tmp_path / "sandbox"))
    cancel = framework._cancel_pilot

    def slow_to_end(pilot: troy.Pilot) -> None:  # the ending thread, descheduled under load
        cancel(pilot)
        time.sleep(1.0)

    monkeypatch.setattr(framework, "_cancel_pilot", slow_to_end)
    gate, runs = tmp_path / "gate", tmp_path / "runs"
    try:
        first = framework.submit_pilot(troy.PilotDescription(
            size=1, walltime=1.0 if ending == "walltime" else None))
        assert first.wait_running(30) is State.RUNNING
        u = framework.submit_unit(CUD(executable="/bin/sh", arguments=[
            "-c", f"echo run >> {runs}; while [ ! -e {gate} ]; do sleep 0.02; done"]))
        wait_for(lambda: u.state is State.RUNNING and u.pilot == first.id and runs.exists(),
                 30, what="the unit on the first pilot")
        if ending == "cancel":
            first.cancel()
            assert first.state is State.CANCELED
        spare = running_pilot(framework, 1)
        wait_for(lambda: first.state in (State.DONE, State.CANCELED), 30, what="the pilot over")
        wait_for(lambda: u.state is State.RUNNING and u.pilot == spare.id, 30,
                 what="the unit on the spare pilot")
        gate.touch()
        assert u.wait(30) is State.DONE and runs.read_text() == "run\nrun\n"
    finally:
        gate.touch()
        framework.close()
