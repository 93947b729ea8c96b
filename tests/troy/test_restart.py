"""A session killed mid-way loses no unit: a new session on the same store recovers them."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

import troy
from tests.helpers import REPO, wait_for
from troy import State

CHILD = textwrap.dedent("""
    import sys, troy
    store, out, gate = sys.argv[1], sys.argv[2], sys.argv[3]
    s = troy.Session(store_path=store)
    s.add_framework("local").submit_pilot({"size": 2})
    w = troy.Workload()
    wait = f"n=0; while [ ! -e {gate} ] && [ $n -lt 3000 ]; do sleep 0.02; n=$((n+1)); done"
    w.add_task([{"executable": "/bin/sh", "arguments": [
        "-c", f"{wait if i >= 2 else 'true'}; echo {i} >> {out}"]} for i in range(12)])
    w.add_task({"function": print})  # a callable: cannot be re-run after a restart
    overlay = troy.Overlay([{"size": 2}])
    troy.execute_workload(s, w, overlay, bundle=False)
""")


@pytest.fixture
def gate(tmp_path):
    """A file the units wait for. The killed session's orphaned processes wait at it too, so
    it is opened when the test ends, pass or fail: none is left polling (each loop also gives
    up by itself after about a minute)."""
    path = tmp_path / "gate"
    yield path
    path.touch()


def _states(store: str) -> list[str]:
    try:
        with sqlite3.connect(store) as db:
            return [r[0] for r in db.execute("SELECT state FROM units")]
    except sqlite3.Error:
        return []


def test_restart_loses_no_unit(tmp_path, gate):
    store, out = str(tmp_path / "troy.sqlite"), tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-c", CHILD, store, str(out), str(gate)],
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:  # two units done, two waiting at the gate
        wait_for(lambda: _states(store).count("DONE") >= 2
                 and _states(store).count("RUNNING") >= 2, 30, what="two units done")
    finally:
        child.send_signal(signal.SIGKILL)  # abrupt: no close, no flush
        child.wait()
    before = _states(store)
    assert len(before) == 13 and before.count("DONE") == 2

    with troy.Session(store_path=store) as s:
        assert len(s.store.units()) == 13  # a restarted session sees every unit
        s.add_framework("local").submit_pilot({"size": 2})
        recovered = s.recover()
        gate.touch()
        assert recovered and all(u.state is not State.FAILED for u in recovered)
        us_states = [u.wait(30) for u in recovered]
        assert set(us_states) == {State.DONE}
        s.store.flush()
        records = s.store.units()
        assert len(records) == 13
        by_state: dict[State, list] = {}
        for r in records:
            by_state.setdefault(r.state, []).append(r)
        # every executable unit ends DONE; the callable is reported, not silently lost
        assert len(by_state[State.DONE]) == 12
        (lost,) = by_state[State.FAILED]
        assert not lost.persistable and "callable" in lost.error
        assert s.recover() == []  # nothing left in flight
    assert set(out.read_text().split()) == {str(i) for i in range(12)}  # at least once


CHAIN = textwrap.dedent("""
    import sys, troy
    store, out = sys.argv[1], sys.argv[2]
    s = troy.Session(store_path=store)
    s.add_framework("local").submit_pilot({"size": 2})
    w = troy.Workload(uid="chain")
    sh = lambda cmd: {"executable": "/bin/sh", "arguments": ["-c", f"{cmd} >> {out}"]}
    wait = f"n=0; while [ ! -e {sys.argv[3]} ] && [ $n -lt 3000 ]; do sleep 0.02; n=$((n+1)); done"
    heads = [w.add_task(sh(f"{wait if i else 'true'}; echo h{i}"), uid=f"h{i}") for i in range(4)]
    tails = [w.add_task(sh(f"echo t{i}"), uid=f"t{i}") for i in range(4)]
    join = w.add_task(sh("echo join"), uid="join")
    w.add_relation([troy.Relation(h, t) for h, t in zip(heads, tails)]
                   + [troy.Relation(t, join) for t in tails])
    troy.execute_workload(s, w, troy.Overlay([{"size": 2}]), bundle=False)
""")


def test_restart_resumes_a_workload_with_its_relations(tmp_path, gate):
    store, out = str(tmp_path / "troy.sqlite"), tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-c", CHAIN, store, str(out), str(gate)],
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:  # h0 and its tail t0 done; h1 and h2 waiting at the gate
        wait_for(lambda: _states(store).count("DONE") >= 2
                 and _states(store).count("RUNNING") >= 2, 30, what="h0, t0 done")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert _states(store).count("DONE") == 2

    with troy.Session(store_path=store) as s:
        s.add_framework("local").submit_pilot({"size": 2})
        s.recover()
        gate.touch()
        w = s.workloads["chain"]
        assert set(w.tasks) == {"h0", "h1", "h2", "h3", "t0", "t1", "t2", "t3", "join"}
        assert w.wait(30) is State.DONE
        assert {t.state for t in w.tasks.values()} == {State.DONE}
    lines = out.read_text().split()
    # join was held until its heads were done, and ran once (the killed session's orphaned
    # processes at the gate may still add h lines: at least once)
    assert lines.count("join") == 1
    assert lines.index("join") > max(lines.index(f"t{i}") for i in range(4))
    for i in range(4):
        assert lines.index(f"h{i}") < lines.index(f"t{i}")
