"""One chaos run: a small WfCommons workflow on an elastic cluster of real pilots while the
seeded fault schedule plays, then the invariants (``chaos_run(...) -> RunResult``)."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

from bench.chaos.invariants import Watch, figures_of, held_by, settle
from bench.chaos.schedule import KILLS, Fault, make_schedule
from bench.chaos.world import World

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent.parent
WORKFLOW = REPO / "examples" / "workflows" / "helloworld-forkjoin-10-chameleon.json"


@dataclasses.dataclass
class RunResult:
    """The figures of one run (see docs/chaos.md)."""

    seed: int
    seconds: float = 0.0
    units: int = 0
    units_done: int = 0
    units_lost: int = 0
    units_requeued: int = 0
    duplicate_runs: int = 0
    kills: int = 0
    faults_injected: int = 0
    faults_skipped: int = 0
    emulator_calls_faulted: int = 0
    nodes_leaked: int = 0
    duplicate_adds: int = 0
    slice_lapses: int = 0
    nodes_peak_cm: int = 0
    injected: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (self.error is None and self.units_lost == 0 and self.nodes_leaked == 0
                and self.duplicate_adds == 0 and self.slice_lapses == 0)


class Player:
    """Plays the schedule in a thread from ``start`` until it ends or ``stop``."""

    def __init__(self, world: World, schedule: list[Fault], result: RunResult) -> None:
        self.world, self.schedule, self.result = world, schedule, result
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-player", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        began = time.monotonic()
        for fault in self.schedule:
            if self._stop.wait(max(0.0, began + fault.at - time.monotonic())):
                return
            try:
                done = self.world.inject(fault)
            except Exception as err:  # a fault that could not be done is a finding too
                log.exception("chaos: %s failed", fault.describe())
                self.result.error = f"{fault.kind.value} failed: {err}"
                done = False
            r = self.result
            if done:
                r.faults_injected += 1
                r.kills += fault.kind in KILLS
                r.injected.append(fault.describe())
                log.warning("chaos: %s", fault.describe())
            else:
                r.faults_skipped += 1


def chaos_run(seed: int, directory: Path, pki: Path, *, workflow: Path = WORKFLOW,
              time_scale: float = 0.05, timeout: float = 180.0,
              maxthreshold: int = 3) -> RunResult:
    """Run the workflow under the faults of ``make_schedule(seed)`` in ``directory``."""
    import troy
    from troy.workload.files import load_workload
    result = RunResult(seed)
    began = time.monotonic()
    world = World(directory, pki, seed, maxthreshold=maxthreshold)
    watch = Watch(world.db)
    player = Player(world, make_schedule(seed), result)
    slice_urn = ""
    try:
        world.start()
        cluster = world.cluster
        assert cluster is not None and world.server is not None
        slice_urn = world.server.slice_urn()
        watch.start()
        workload = load_workload(workflow, time_scale=time_scale, max_cores=4)
        player.start()
        try:
            troy.execute_workload(cluster.session, workload, cluster.overlay(),
                                  bind_mode="late", timeout=timeout)
        except troy.TroyError as err:
            result.error = f"the workflow: {err}"
        player.stop()
        result.units = len(workload.tasks)
        result.units_done = sum(1 for t in workload.tasks.values()
                                if t.state is troy.State.DONE)
        stats = cluster.session.unit_stats()
        result.units_lost = stats.lost + (result.units - result.units_done)
        result.units_requeued, result.duplicate_runs = stats.requeued, stats.duplicates
        manager = cluster.manager
        assert manager is not None
        result.nodes_leaked = settle(world.db, manager, slice_urn)
        result.__dict__.update(figures_of(watch.stop(), manager, slice_urn, maxthreshold))
    except Exception as err:
        log.exception("chaos run %d", seed)
        result.error = result.error or f"{type(err).__name__}: {err}"
    finally:
        player.stop() if player._thread.is_alive() else None
        if watch._thread.is_alive():
            watch.stop()
        try:
            world.close()
        except Exception as err:
            log.exception("chaos run %d: closing", seed)
            result.error = result.error or f"closing: {err}"
        left = held_by(world.db, slice_urn) if slice_urn else []
        result.nodes_leaked += len(left or [])
        result.emulator_calls_faulted = world.emulator_calls_faulted
        result.seconds = round(time.monotonic() - began, 1)
    return result
