"""bench_drain's slow-CM cases: CloudLab revokes busy pilots while the CM holds our call.

The pilots manager (``ElasticCluster``) on an emulator in this process, three nodes of 8
cores running 3 s units of 4 cores. Then the CM turns slow (AddNodes takes 30 s) or busy
(every AddNodes answers BUSY and the client backs off, 5 s to 60 s as the client's default
retry policy does). CloudLab revokes one busy node (15 s notice, countdown every second);
its replacement's AddNodes is then held by the CM, and 2 s into it a second busy node is
revoked. Measured as the CM sees it (its callback log): each NotifyDeletePending's answer
time; from the manager's records: from the first notice until nothing new can start on the
doomed pilot, units started there after the notice, and how each reclamation ended.
"""
from __future__ import annotations

import logging
import re
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import troy
from elasticslice.config import load_config
from elasticslice.emulator import EmulatorServer, init_emulator
from elasticslice.managers.policy import PolicyConfig
from elasticslice.pilots import ElasticCluster
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.transport import RetryPolicy

ANSWER = re.compile(r"NotifyDeletePending to \S+ \(\d+ nodes\) in (\d+) ms")
INTERVALS = {m: 0.5 for m in ("ensure_slice", "ensure_sliver", "update_sliver_status",
                              "update_available", "get_system_state", "add_nodes",
                              "delete_nodes", "set_system_state")}
CASES = {"slow": ("AddNodes 30 s", {"slow": {"AddNodes": 30.0}}),
         "busy": ("AddNodes BUSY, back-off", {"busy": {"AddNodes": 1.0}})}


class Answers(logging.Handler):
    """The CM's NotifyDeletePending calls: answer times (ms) and failures."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.ms: list[float] = []
        self.failed = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        found = ANSWER.search(text)
        if found:
            self.ms.append(float(found.group(1)))
        elif text.startswith("NotifyDeletePending to") and "failed" in text:
            self.failed += 1


def until(predicate: Any, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > end:
            raise RuntimeError(f"bench_drain: timed out waiting for {what}")
        time.sleep(0.02)
    return value


class Starts:
    """Which pilot each unit started on, and when (polling the framework's live units)."""

    def __init__(self, framework: Any) -> None:
        self.seen: set[tuple[str, str, float]] = set()
        self.stop = threading.Event()
        threading.Thread(target=self._loop, args=(framework,), daemon=True).start()

    def _loop(self, framework: Any) -> None:
        while not self.stop.wait(0.02):
            self.seen |= {(u.id, u.pilot, u.start) for u in framework.live_units()
                          if u.pilot and u.start}

    def after(self, pilot: str, when: float) -> int:
        return sum(1 for _, p, start in self.seen if p == pilot and start >= when)


def outcome(server: EmulatorServer, node_id: str) -> str | None:
    rows = [r for r in server.ctx.store.reclaims() if r.node_id == node_id]
    return rows[-1].outcome if rows and rows[-1].outcome not in (None, "", "pending") else None


def slow_cm(case: str, quick: bool) -> dict[str, Any]:
    """One case of :data:`CASES`: figures (answer_p50_ms, answer_p99_ms, ...)."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-drain-{case}-"))
    answers = Answers()
    callbacks = logging.getLogger("elasticslice.emulator.callbacks")
    callbacks.addHandler(answers)
    callbacks.setLevel(logging.INFO)
    callbacks.propagate = False
    server = EmulatorServer(init_emulator(root / "emu", port=0), port=0, boot_delay=0.2,
                            notify_interval=1.0, max_wait=15)
    server.start()
    config = load_config(server.config_path, env={
        "ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(root / "cache")})
    retry = RetryPolicy(attempts=6, base_delay=5.0, max_delay=60.0)  # the client's default
    cluster = ElasticCluster(ProtoGeniServer(config, retry=retry), root / "cluster",
                             maxthreshold=3, idle_timeout=None, margin=1.0, intervals=INTERVALS,
                             policy=PolicyConfig(add_cooldown=0.0, delete_cooldown=0.0,
                                                 max_add_per_cycle=3))
    try:
        cluster.start()
        return _run(case, quick, server, cluster, answers)
    finally:
        server.pressure.relieve()
        cluster.close()
        cluster.server.close()
        server.stop()
        callbacks.removeHandler(answers)
        shutil.rmtree(root, ignore_errors=True)


def _run(case: str, quick: bool, server: EmulatorServer, cluster: ElasticCluster,
         answers: Answers) -> dict[str, Any]:
    manager, pressure = cluster.manager, server.pressure
    work = troy.Workload()
    work.add_task({"executable": "/bin/sleep", "arguments": ["3"], "cores": 4, "runtime": 3,
                   "cardinality": 18 if quick else 36})
    done: list[Any] = []
    threading.Thread(target=lambda: done.append(troy.execute_workload(
        cluster.session, work, cluster.overlay(), bind_mode="late")), daemon=True).start()
    until(lambda: len(cluster.pilots()) == 3 and all(p.busy for p in cluster.pilots()), 180,
          "three busy pilots")
    pressure.set(**CASES[case][1])
    starts = Starts(cluster.framework)
    doomed = [r for r in sorted(manager.state.nodes(), key=lambda r: -r.added_at)][:2]
    held = {"slow": lambda: pressure.in_flight("AddNodes"),
            "busy": lambda: pressure.busy_answers("AddNodes")}[case]
    server.reclaimer.revoke([doomed[0].node_id])
    until(held, 120, "the replacement's AddNodes held by the CM")
    time.sleep(2.0)
    server.reclaimer.revoke([doomed[1].node_id])
    outcomes = [until(lambda r=r: outcome(server, r.node_id), 180, "the reclamation")
                for r in doomed]
    still_held = bool(held()) and (case == "busy" or pressure.in_flight("AddNodes"))
    pilots = {r.node_id: cluster.framework.find_pilot(r.client_id) for r in doomed}
    revocations = {r.node_id: r for r in manager.state.pending_deletes()}
    plans = {n: manager.drains.get(n) for n in pilots}
    pressure.relieve()
    until(lambda: done, 600, "the workload")
    stats = cluster.stats()
    starts.stop.set()
    ms = sorted(answers.ms)
    return {
        "answer_p50_ms": statistics.median(ms) if ms else float("nan"),
        "answer_p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else float("nan"),
        "answers": len(ms), "answers_failed": answers.failed,
        "no_dispatch_ms": [round(1000 * ((plans[n].dispatch_stopped_at or float("nan"))
                                         - revocations[n].first_seen), 1)
                           if plans[n] else None for n in pilots],
        "starts_after_notice": sum(starts.after(p.id, revocations[n].first_seen)
                                   for n, p in pilots.items() if p is not None),
        "released_after_s": [round(revocations[n].released - revocations[n].first_seen, 1)
                             if revocations[n].released else None for n in pilots],
        "outcomes": outcomes, "held_throughout": still_held,
        "units_lost": stats["units_lost"], "early": stats["early_releases"],
        "forced": stats["forced_releases"]}


def rows(case: str, r: dict[str, Any]) -> list[tuple[str, str]]:
    name = CASES[case][0]
    return [
        (f"CM {name}: notice answered p50 / p99 (goal < 200 ms)",
         f"{r['answer_p50_ms']:.0f} / {r['answer_p99_ms']:.0f} ms ({r['answers']} answered, "
         f"{r['answers_failed']} failed)"),
        (f"CM {name}: notice to no new dispatch (goal < 1 s)",
         f"{', '.join(f'{m:.0f} ms' if m is not None else '-' for m in r['no_dispatch_ms'])}; "
         f"{r['starts_after_notice']} unit(s) started after"),
        (f"CM {name}: outcome (goal early, 0 lost)",
         f"{', '.join(r['outcomes'])}, released {r['released_after_s']} s after the notice; "
         f"{r['units_lost']} lost; AddNodes held throughout: "
         f"{'yes' if r['held_throughout'] else 'no'}"),
    ]
