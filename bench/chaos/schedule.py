"""The seeded fault schedule of one chaos run: what goes wrong, when, for how long.

``make_schedule(seed)`` draws the same list for the same seed (``random.Random(seed)``, no
other source), so a run that broke an invariant is replayed with ``--runs 1 --seed S``. The
targets (which pilot dies, which node is revoked) are drawn from ``Fault.pick`` among the
candidates sorted by name at that moment.
"""
from __future__ import annotations

import dataclasses
import random
from enum import Enum


class Kind(str, Enum):
    """What a fault does (see docs/chaos.md)."""

    MANAGER_RESTART = "manager_restart"    # the manager's threads die; a new one from its state
    PILOT_KILL = "pilot_kill"              # SIGKILL of one node agent (a Dask worker process)
    EMULATOR_FAULTS = "emulator_faults"    # a fraction of calls answer BUSY, 503 or slowly
    REVOKE_SHORT = "revoke_short"          # CloudLab takes a node back with a short notice
    REVOKE_NOW = "revoke_now"              # ... with no notice (max_wait_time 0)
    EMULATOR_RESTART = "emulator_restart"  # the emulator stops and starts (same dir and port)
    CALLBACK_DROP = "callback_drop"        # the manager's callback endpoint refuses for a while
    REBOOT = "reboot"                      # CloudLab reboots a node holding a pilot
    CM_BUSY = "cm_busy"                    # one CM of several answers BUSY to every call


KILLS = frozenset({Kind.MANAGER_RESTART, Kind.PILOT_KILL, Kind.EMULATOR_RESTART, Kind.REBOOT})


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: ``at`` seconds after the workflow starts; ``duration`` for the ones that
    last (faulty answers, a dropped callback); ``rate`` of faulty answers; ``pick`` chooses
    the target among the sorted candidates (a node of any CM; the CM of ``cm_busy``)."""

    at: float
    kind: Kind
    duration: float = 0.0
    rate: float = 0.0
    pick: int = 0

    def describe(self) -> str:
        extra = f" for {self.duration:.1f}s" if self.duration else ""
        rate = f" at {self.rate:.0%}" if self.rate else ""
        return f"{self.at:5.1f}s {self.kind.value}{rate}{extra}"


def make_schedule(seed: int, window: float = 12.0, sites: int = 1) -> list[Fault]:
    """The faults of one run, ordered by time, within ``window`` seconds of the start:
    every run restarts the manager, kills a pilot, turns on faulty answers, revokes a node
    (short or zero notice), drops the callback endpoint and reboots a node holding a pilot;
    one run in two also restarts the emulator. With several CMs (``sites``), one of them
    also answers BUSY to every call for a few seconds (down, as far as the manager can
    tell), and the revoked and rebooted nodes are drawn from every CM's. (The reboot, then
    the CM's outage, are drawn last: the other faults of a seed are what they were before
    they existed.)"""
    rng = random.Random(seed)

    def when(lo: float = 1.0) -> float:
        return round(rng.uniform(lo, window), 2)

    faults = [
        Fault(when(), Kind.MANAGER_RESTART),
        Fault(when(2.0), Kind.PILOT_KILL, pick=rng.randrange(1 << 30)),
        Fault(when(0.5), Kind.EMULATOR_FAULTS, duration=round(rng.uniform(3.0, 8.0), 2),
              rate=round(rng.uniform(0.1, 0.3), 2)),
        Fault(when(2.0), rng.choice([Kind.REVOKE_SHORT, Kind.REVOKE_NOW]),
              pick=rng.randrange(1 << 30)),
        Fault(when(), Kind.CALLBACK_DROP, duration=round(rng.uniform(2.0, 5.0), 2)),
    ]
    if rng.random() < 0.5:
        faults.append(Fault(when(3.0), Kind.EMULATOR_RESTART))
    faults.append(Fault(when(2.0), Kind.REBOOT, pick=rng.randrange(1 << 30)))
    if sites > 1:
        faults.append(Fault(when(0.5), Kind.CM_BUSY, duration=round(rng.uniform(3.0, 8.0), 2),
                            pick=rng.randrange(1 << 30)))
    return sorted(faults, key=lambda f: (f.at, f.kind.value))
