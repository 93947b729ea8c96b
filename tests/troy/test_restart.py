"""A session killed mid-way loses no unit: a new session on the same store recovers them."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import troy
from tests.conftest import REPO, wait_for
from troy import State

CHILD = textwrap.dedent("""
    import sys, troy
    store, out = sys.argv[1], sys.argv[2]
    s = troy.Session(store_path=store)
    s.add_framework("local").submit_pilot({"size": 2})
    w = troy.Workload()
    w.add_task([{"executable": "/bin/sh",
                 "arguments": ["-c", f"sleep 0.2; echo {i} >> {out}"]} for i in range(12)])
    w.add_task({"function": print})  # a callable: cannot be re-run after a restart
    troy.execute_workload(s, w, bundle=False)
""")


def _states(store: str) -> list[str]:
    try:
        with sqlite3.connect(store) as db:
            return [r[0] for r in db.execute("SELECT state FROM units")]
    except sqlite3.Error:
        return []


def test_restart_loses_no_unit(tmp_path):
    store, out = str(tmp_path / "troy.sqlite"), tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-c", CHILD, store, str(out)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: _states(store).count("DONE") >= 2, 30, what="two units done")
    finally:
        child.send_signal(signal.SIGKILL)  # abrupt: no close, no flush
        child.wait()
    before = _states(store)
    assert len(before) == 13 and before.count("DONE") < 13

    with troy.Session(store_path=store) as s:
        assert len(s.store.units()) == 13  # a restarted session sees every unit
        s.add_framework("local").submit_pilot({"size": 2})
        recovered = s.recover()
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
