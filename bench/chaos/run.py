"""One chaos run: a small WfCommons workflow run by ``elasticslice run`` on an elastic cluster
of real pilots while the seeded fault schedule plays, then the invariants from the stores
(``chaos_run(...) -> RunResult``)."""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path

from bench.chaos.invariants import Watch, figures_of, held_by
from bench.chaos.schedule import KILLS, Fault, make_schedule
from bench.chaos.workflow import completions
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
    duplicate_runs: int = 0          # from what ran (each task's record of its runs)
    duplicate_runs_counted: int = 0  # what the cluster's report says
    processes: int = 0               # incarnations of the cluster's process
    kills: int = 0
    faults_injected: int = 0
    faults_skipped: int = 0
    emulator_calls_faulted: int = 0
    nodes_leaked: int = 0
    duplicate_adds: int = 0
    slice_lapses: int = 0
    nodes_peak_cm: int = 0
    sites: int = 1                   # CMs of the box (a sliver at each)
    nodes_peak_by_site: dict[str, int] = dataclasses.field(default_factory=dict)
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


def slice_urn_of(config_file: Path) -> str:
    from elasticslice.config import load_config
    from elasticslice.rpc.client import ProtoGeniServer
    server = ProtoGeniServer(load_config(config_file))
    try:
        return server.slice_urn()
    finally:
        server.close()


def chaos_run(seed: int, directory: Path, pki: Path, *, workflow: Path = WORKFLOW,
              time_scale: float = 0.05, timeout: float = 180.0,
              maxthreshold: int = 3, sites: tuple[str, ...] = ()) -> RunResult:
    """Run the workflow under the faults of ``make_schedule(seed)`` in ``directory``
    (``sites``: on a box of those clusters, ``pki`` made with them)."""
    result = RunResult(seed, sites=max(1, len(sites)))
    began = time.monotonic()
    world = World(directory, pki, seed, workflow=workflow, time_scale=time_scale,
                  timeout=timeout, maxthreshold=maxthreshold, sites=sites)
    watch = Watch(world.stores, world.all_ran)
    player = Player(world, make_schedule(seed, sites=max(1, len(sites))), result)
    slice_urn = ""
    try:
        world.start()
        slice_urn = slice_urn_of(world.emu_dir / "elasticslice.conf")
        watch.start()
        if not world.wait_serving():
            raise RuntimeError("the cluster's process did not serve its scheduler "
                               f"(see {directory}/process-0.log)")
        player.start()
        code = world.wait_end()
        player.stop()
        samples = watch.stop()
        if code is None:
            result.error = "the cluster's process did not end in time"
        elif code not in (0, 1):
            result.error = f"the cluster's last process exited with {code}"
        result.units = world.tasks
        result.__dict__.update(units_of(world))
        result.__dict__.update(figures_of(samples, world.state_dir / "state", slice_urn,
                                          maxthreshold))
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
        left = held_by(world.stores, slice_urn) if slice_urn else []
        result.nodes_leaked += len(left or [])
        result.emulator_calls_faulted = world.emulator_calls_faulted
        result.processes = world.incarnations
        result.seconds = round(time.monotonic() - began, 1)
    return result


def units_of(world: World) -> dict[str, int]:
    """The units' figures: the last process' report (its stats count over every process
    of the run) and each task's record of its runs."""
    try:
        report = json.loads(world.report.read_text())
        stats = report["stats"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RuntimeError(f"no report from the cluster's last process: {err}") from err
    runs = completions(world.ran)
    never = world.tasks - sum(1 for n in runs.values() if n > 0)
    done = int(report.get("tasks_done", 0))
    return {"units_done": done,
            "units_lost": int(stats.get("units_lost", 0)) + max(world.tasks - done, never),
            "units_requeued": int(stats.get("units_requeued", 0)),
            "duplicate_runs": sum(max(0, n - 1) for n in runs.values()),
            "duplicate_runs_counted": int(stats.get("duplicate_runs", 0))}
