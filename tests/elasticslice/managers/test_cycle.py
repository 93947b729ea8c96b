"""The cycle on APScheduler: intervals, failures retried with backoff, reset triggers, wakes."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from apscheduler.events import EVENT_JOB_MAX_INSTANCES

from elasticslice.managers.cycle import Cycle
from elasticslice.managers.state import ManagerState
from tests.helpers import wait_for


class Work:
    """Real methods: each call is counted; ``broken`` ones raise, ``changes`` return 1."""

    def __init__(self, broken: set[str] = frozenset(), changes: set[str] = frozenset()) -> None:
        self.calls: list[str] = []
        self.broken = set(broken)
        self.changes = set(changes)
        self.lock = threading.Lock()

    def __call__(self, name: str) -> Any:
        with self.lock:
            self.calls.append(name)
        if name in self.broken:
            raise RuntimeError(f"{name} is broken\nsecond line")
        return 1 if name in self.changes else None

    def count(self, name: str) -> int:
        with self.lock:
            return self.calls.count(name)


def test_run_once_runs_in_order_and_a_failure_does_not_stop_the_others(tmp_path: Path) -> None:
    work = Work(broken={"b"})
    state = ManagerState.open(tmp_path)
    cycle = Cycle(work, order=["a", "b", "c"], intervals={}, recorder=state.cycle_log)
    errors = cycle.run_once()
    assert work.calls == ["a", "b", "c"]
    assert errors == {"a": None, "b": "RuntimeError: b is broken second line", "c": None}
    record = state.cycle_log.records()["b"]
    assert record.failures == 1 and record.last_error.startswith("RuntimeError: b is broken")
    assert state.cycle_log.records()["a"].last_error is None and state.cycle_log.records()["a"].next_run
    state.close()


def test_backoff_doubles_up_to_the_interval() -> None:
    cycle = Cycle(Work(broken={"a"}), order=["a"], intervals={"a": 10}, retry_interval=1)
    delays = []
    for _ in range(6):
        cycle.run_method("a")
        delays.append(cycle.backoff("a"))
    assert delays == [1, 2, 4, 8, 10, 10]
    cycle.call = Work()
    cycle.run_method("a")
    assert cycle.methods["a"].failures == 0 and cycle.methods["a"].last_error is None


def test_a_failing_method_is_retried_while_the_others_keep_running() -> None:
    work = Work(broken={"bad"})
    cycle = Cycle(work, order=["good", "bad"], intervals={"good": 0.05, "bad": 3600},
                  retry_interval=0.05)
    cycle.start(first_delay=0)
    try:
        wait_for(lambda: work.count("bad") >= 3, timeout=30, what="bad retried")
        wait_for(lambda: work.count("good") >= 5, timeout=30, what="good running")
    finally:
        cycle.stop()
    assert cycle.methods["bad"].failures >= 3


def test_reset_triggers_run_the_listed_methods_after_a_change() -> None:
    work = Work(changes={"add"})
    cycle = Cycle(work, order=["add", "status", "other"], retry_interval=1,
                  intervals={"add": 3600, "status": 3600, "other": 3600},
                  reset_triggers={"add": ["status"]})
    cycle.start()  # first runs an hour away
    try:
        cycle.wake("add")
        wait_for(lambda: work.count("status") == 1, timeout=30, what="status triggered")
    finally:
        cycle.stop()
    assert work.calls == ["add", "status"]


def test_wake_runs_a_method_at_once_and_a_wake_while_running_runs_it_again() -> None:
    gate = threading.Event()
    work = Work()

    def call(name: str) -> Any:
        work(name)
        if name == "slow" and work.count("slow") == 2:
            gate.wait(30)
        return None

    cycle = Cycle(call, order=["slow"], intervals={"slow": 3600}, retry_interval=1)
    cycle.start(first_delay=0)
    try:
        wait_for(lambda: work.count("slow") == 1 and not cycle.methods["slow"].running,
                 what="first run")
        cycle.wake("slow")
        wait_for(lambda: cycle.methods["slow"].running, what="woken run")
        cycle.wake("slow")  # while it runs: once more afterwards
        gate.set()
        wait_for(lambda: work.count("slow") == 3, what="the rerun")
    finally:
        cycle.stop()
    assert cycle.next_run("slow") is None  # stopped


def test_stop_drops_scheduled_runs_but_not_explicit_ones() -> None:
    work = Work()
    cycle = Cycle(work, order=["a"], intervals={"a": 3600})
    cycle.stop()
    cycle._job("a")  # a run the scheduler had queued before the stop
    assert work.calls == []
    assert cycle.run_once() == {"a": None} and work.calls == ["a"]


def test_one_table_of_intervals_serves_the_seed_the_config_the_pilots_and_parsl() -> None:
    """Issue 35: the interval tables lived in four modules; the cycle's module owns them."""
    from elasticslice import parsl
    from elasticslice.managers import config, cycle
    from elasticslice.managers.manager import SimpleElasticSliceManager as M
    from elasticslice.pilots import cluster
    assert config.DEF_INTERVALS is cycle.DEF_INTERVALS and config.DEF_ORDER is cycle.DEF_ORDER
    assert M.DEF_INTERVALS == dict(cycle.DEF_INTERVALS) and M.DEF_ORDER == list(cycle.DEF_ORDER)
    assert M.DEF_INTERVAL == cycle.DEF_INTERVAL == 60
    assert cluster.DEFAULT_INTERVALS is cycle.PILOT_INTERVALS
    assert parsl.DEFAULT_INTERVALS is cycle.PARSL_INTERVALS
    for table in (cycle.PILOT_INTERVALS, cycle.PARSL_INTERVALS):
        assert set(table) == set(cycle.DEF_ORDER)


class SlowJobEnd(logging.Handler):
    """A slow log sink on APScheduler's "job executed" line: it widens the window between a
    job's return and APScheduler releasing its instance (as a loaded machine does)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.in_window = threading.Event()
        self.seen = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "executed successfully" in record.getMessage():
            self.seen += 1
            if self.seen == 1:
                self.in_window.set()
                time.sleep(1.0)


@pytest.mark.parametrize("when", ["inside the run", "from another thread during the run",
                                  "from another thread after the run"])
def test_a_wake_asked_while_the_job_runs_is_not_lost_as_a_skipped_max_instances(
        when: str) -> None:
    executor_log = logging.getLogger("apscheduler.executors.default")
    slow = SlowJobEnd()
    executor_log.addHandler(slow)
    old_level = executor_log.level
    executor_log.setLevel(logging.INFO)
    running = threading.Event()
    go_on = threading.Event()
    work = Work()
    cycle: Cycle

    def call(name: str) -> Any:
        work(name)
        if work.count(name) == 1:
            if when == "inside the run":
                cycle.wake(name)
            elif when == "from another thread during the run":
                running.set()
                go_on.wait(30)
        return None

    cycle = Cycle(call, order=["ping"], intervals={"ping": 3600}, retry_interval=1)
    skipped: list[Any] = []
    cycle.start(first_delay=3600)
    cycle._scheduler.add_listener(skipped.append, EVENT_JOB_MAX_INSTANCES)
    cycle.wake("ping")
    try:
        if when == "from another thread during the run":
            wait_for(running.is_set, what="the first run")
            threading.Thread(target=cycle.wake, args=("ping",)).start()
            wait_for(lambda: cycle.methods["ping"].rerun, what="the wake noted")
            go_on.set()
        elif when == "from another thread after the run":
            wait_for(slow.in_window.is_set, what="the first run's end")
            cycle.wake("ping")
        wait_for(lambda: work.count("ping") >= 2, what="the woken run")
    finally:
        cycle.stop()
        executor_log.removeHandler(slow)
        executor_log.setLevel(old_level)
    assert work.count("ping") == 2
    assert skipped == []   # no run skipped as "maximum number of running instances"


def test_a_method_apart_runs_on_its_own_thread_while_another_is_stuck() -> None:
    """Issue 35: ``release_nodes`` gives nodes back while ``add_nodes`` waits for a slow
    AddNodes; the other methods still run one at a time, on the cycle's thread."""
    stuck, seen = threading.Event(), {}
    release = threading.Event()

    def call(name: str) -> None:
        seen.setdefault(name, set()).add(threading.current_thread().name)
        if name == "add_nodes":
            stuck.set()
            release.wait(30)

    cycle = Cycle(call, order=["add_nodes", "status", "release_nodes"],
                  intervals={"add_nodes": 3600, "status": 3600, "release_nodes": 3600})
    assert cycle.apart == ["release_nodes"]
    cycle.start(first_delay=0)
    try:
        wait_for(stuck.is_set, timeout=30, what="add_nodes stuck")
        cycle.wake("release_nodes")
        wait_for(lambda: cycle.methods["release_nodes"].runs >= 1, timeout=30,
                 what="release_nodes beside the stuck add_nodes")
        assert cycle.methods["status"].runs == 0  # behind add_nodes, as before
        release.set()
        wait_for(lambda: cycle.methods["status"].runs >= 1, timeout=30, what="status")
    finally:
        release.set()
        cycle.stop()
    assert {t.rsplit("_", 1)[0] for t in seen["release_nodes"]} == {"cycle-release_nodes"}
    assert {t.rsplit("_", 1)[0] for n in ("add_nodes", "status") for t in seen[n]} == {"cycle"}
