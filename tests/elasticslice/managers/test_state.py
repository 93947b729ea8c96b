"""The manager's state in real SQLite: restarts, history, notices, intents, the cycle."""
from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from elasticslice.managers.ownership import own_slice, owns_slice
from elasticslice.managers.policy import NodeState
from elasticslice.managers.state import (
    DB_NAME, SCHEMA_VERSION, CycleRecord, ManagerState, NodeRecord, StateError,
)

CM = "https://cm.a:12369/protogeni/xmlrpc/cm"
CM2 = "https://cm.b:12369/protogeni/xmlrpc/cm"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def state(state_dir: Path):
    st = ManagerState.open(state_dir)
    yield st
    st.close()


def test_open_creates_private_directory_and_file(state, state_dir):
    assert state_dir.stat().st_mode & 0o777 == 0o700
    assert (state_dir / DB_NAME).stat().st_mode & 0o777 == 0o600
    assert state.get_meta("schema_version") == str(SCHEMA_VERSION)


def test_everything_survives_reopen(state_dir):
    st = ManagerState.open(state_dir)
    st.set_slice("urn:publicid:IDN+emulab.net+slice+e1", 1000.0)
    st.set_sliver(CM, "urn:sliver", 900.0, "ready")
    st.upsert_node(CM, "node1", now=1.0, node_id="pc1", hostname="pc1.a", state="ready",
                   initial=True)
    st.revocations.add(CM, "pc1", "node1", deadline=500.0, now=2.0)
    st.set_values(CM, {"pc1": 0.25}, now=3.0)
    intent = st.begin_intent("add", CM, ["node2", "node3"], now=4.0)
    st.cycle_log.record_run("renew", started=5.0, finished=6.0, error=None, next_run=3605.0)
    st.set_meta("endpoint", "https://127.0.0.1:1234/")
    st.close()

    st = ManagerState.open(state_dir)
    try:
        assert st.slice().urn.endswith("slice+e1") and st.slice().expires == 1000.0
        assert [(s.cm, s.urn, s.expires, s.status) for s in st.slivers()] == [
            (CM, "urn:sliver", 900.0, "ready")]
        assert st.nodes() == [NodeRecord(CM, "node1", "pc1", "pc1.a", "ready", True, 1.0,
                                         value=0.25, pending_deadline=500.0)]
        assert [(i.id, i.kind, i.client_ids) for i in st.open_intents()] == [
            (intent, "add", ("node2", "node3"))]
        assert st.cycle_log.records()["renew"].next_run == 3605.0
        assert st.get_meta("endpoint") == "https://127.0.0.1:1234/"
    finally:
        st.close()


def test_node_history_records_state_changes_only(state):
    state.upsert_node(CM, "n1", now=10.0, state=NodeState.NOTREADY)
    state.upsert_node(CM, "n1", now=11.0, state="notready", node_id="pc7")  # no change
    state.upsert_node(CM, "n1", now=12.0, state=NodeState.CHANGING)
    state.upsert_node(CM, "n1", now=13.0, state="ready", note="booted")
    state.mark_gone(CM, "n1", now=20.0, reason="deleted")
    state.mark_gone(CM, "n1", now=21.0, reason="again")   # already gone: no new entry
    assert state.history(CM, "n1") == [(10.0, "notready", "added"), (12.0, "changing", ""),
                                       (13.0, "ready", "booted"), (20.0, "gone", "deleted")]
    assert state.nodes() == []
    gone = state.nodes(include_gone=True)[0]
    assert (gone.node_id, gone.gone_at, gone.gone_reason, gone.added_at) == (
        "pc7", 20.0, "deleted", 10.0)


def test_a_gone_node_seen_again_comes_back(state):
    state.upsert_node(CM, "n1", now=1.0, state="ready")
    state.mark_gone(CM, "n1", now=2.0, reason="deleted")
    rec = state.upsert_node(CM, "n1", now=3.0, state="notready")
    assert rec.gone_at is None and rec.added_at == 3.0
    assert state.history(CM, "n1")[-1] == (3.0, "notready", "back")


def test_nodes_filter_by_cm_and_find_by_node_id(state):
    state.upsert_node(CM, "a", now=1.0, node_id="pc1")
    state.upsert_node(CM2, "b", now=2.0, node_id="pc1")
    state.upsert_node(CM2, "c", now=3.0, node_id="pc2", added_at=0.5)
    assert [n.client_id for n in state.nodes(CM2)] == ["c", "b"]
    assert state.find_node("pc1", cm=CM).client_id == "a"
    assert state.find_node("pc2").client_id == "c"
    assert state.find_node("pc9") is None
    state.mark_gone(CM2, "b", now=4.0, reason="x")
    assert state.find_node("pc1").client_id == "a"   # the live one first


def test_upsert_rejects_unknown_fields(state):
    with pytest.raises(TypeError, match="password"):
        state.upsert_node(CM, "a", now=1.0, password="x")


def test_the_countdown_only_brings_the_deadline_earlier(state):
    state.upsert_node(CM, "node1", now=0.0, node_id="pc1")
    state.revocations.add(CM, "pc1", "node1", deadline=300.0, now=0.0)
    state.revocations.add(CM, "pc1", None, deadline=240.0, now=60.0)
    later = state.revocations.add(CM, "pc1", "node1", deadline=400.0, now=70.0)
    [pd] = state.pending_deletes()
    assert pd == later
    assert (pd.deadline, pd.first_seen, pd.client_id, pd.finished) == (240.0, 0.0, "node1", None)
    assert state.node(CM, "node1").pending_deadline == 240.0
    assert state.revocations.release("pc1", now=100.0, note="drained")
    assert not state.revocations.release("pc1", now=101.0)   # once
    state.revocations.finish("pc1", now=120.0)
    [pd] = state.pending_deletes()
    assert (pd.deadline, pd.released, pd.finished, pd.outcome) == (240.0, 100.0, 120.0, "early")
    assert state.pending_deletes(open_only=True) == []
    assert state.node(CM, "node1").pending_deadline is None
    # the same machine revoked again later is another revocation, counted again
    state.revocations.add(CM, "pc1", "node1", deadline=900.0, now=800.0)
    assert state.revocations.force("pc1")
    state.revocations.finish("pc1", now=850.0)
    assert state.revocations.counts() == {"revocations": 2, "early": 1, "forced": 1}
    state.revocations.forget("pc1")
    assert state.pending_deletes() == []


def test_a_version_1_state_is_migrated_with_its_notices(state_dir):
    state_dir.mkdir(mode=0o700)
    with sqlite3.connect(state_dir / DB_NAME) as db:
        db.executescript("""
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
            INSERT INTO meta VALUES ('schema_version', '1');
            CREATE TABLE pending_deletes (cm TEXT, node_id TEXT, client_id TEXT,
                deadline REAL, first_seen REAL, last_seen REAL, finished REAL, outcome TEXT,
                PRIMARY KEY (cm, node_id));
            INSERT INTO pending_deletes VALUES ('cm', 'pc1', 'n1', 50.0, 1.0, 2.0, NULL, NULL);
            INSERT INTO pending_deletes VALUES ('cm', 'pc2', 'n2', 50.0, 1.0, 2.0, 9.0, 'gone');
            INSERT INTO meta VALUES ('pilots.revocations',
                '{"seen": ["pc2", "pc3"], "early": ["pc2"], "forced": ["pc3"]}');
        """)
    st = ManagerState.open(state_dir)
    try:
        assert st.get_meta("schema_version") == str(SCHEMA_VERSION) == "5"
        [pd] = st.pending_deletes(open_only=True)
        assert (pd.cm, pd.node_id, pd.client_id, pd.deadline) == ("cm", "pc1", "n1", 50.0)
        # the pilots manager's counts, kept apart in version 1, are the outcomes now
        assert st.revocations.counts() == {"revocations": 3, "early": 1, "forced": 1}
    finally:
        st.close()


def test_slice_ownership_is_recorded_per_state_directory(state_dir, tmp_path):
    urn = "urn:publicid:IDN+emulab.net+slice+e1"
    st = ManagerState.open(state_dir)
    assert not owns_slice(st, urn)
    own_slice(st, urn, "created", now=1.0)
    assert owns_slice(st, urn) and not owns_slice(st, urn + "x")
    first_id = st.get_meta("state_id")
    st.close()
    st = ManagerState.open(state_dir)
    other = ManagerState.open(tmp_path / "other")
    try:
        assert owns_slice(st, urn) and st.get_meta("state_id") == first_id
        assert not owns_slice(other, urn) and other.get_meta("state_id") != first_id
        other.set_slice(urn, 10.0)  # a state that recorded the slice before ownership existed
        assert owns_slice(other, urn)
    finally:
        st.close()
        other.close()


def test_values_per_cm(state):
    state.set_values(CM, {"pc1": 0.5, "pc2": 1}, now=1.0)
    state.set_values(CM2, {"pc3": 0.0}, now=1.0)
    state.set_values(CM, {"pc1": 0.1}, now=2.0)
    assert state.values(CM) == {"pc1": 0.1, "pc2": 1.0}
    assert state.values() == {"pc1": 0.1, "pc2": 1.0, "pc3": 0.0}


def test_intents_open_and_finish(state):
    a = state.begin_intent("add", CM, ["n2"], now=1.0)
    d = state.begin_intent("delete", CM2, ("n9",), now=2.0)
    assert [i.id for i in state.open_intents()] == [a, d]
    state.finish_intent(a, now=3.0, outcome="done")
    state.finish_intent(a, now=9.0, outcome="failed")   # closed intents stay closed
    assert [i.id for i in state.open_intents()] == [d]
    closed = state.intents()[0]
    assert (closed.finished, closed.outcome) == (3.0, "done")
    with pytest.raises(ValueError):
        state.begin_intent("resize", CM, [], now=1.0)
    with pytest.raises(ValueError):
        state.finish_intent(d, now=1.0, outcome="maybe")


def test_cycle_records_runs_errors_and_next_run(state):
    state.cycle_log.set_next_run("add_nodes", 50.0)
    state.cycle_log.record_run("add_nodes", started=60.0, finished=61.0, error="BUSY\ntraceback...",
                     next_run=90.0)
    state.cycle_log.record_run("add_nodes", started=90.0, finished=90.5, error="BUSY again", next_run=150.0)
    rec = state.cycle_log.records()["add_nodes"]
    assert (rec.last_run, rec.last_ok, rec.next_run, rec.last_error, rec.failures, rec.runs) == (
        90.0, None, 150.0, "BUSY again", 2, 2)
    state.cycle_log.record_run("add_nodes", started=150.0, finished=151.0, error=None, next_run=450.0)
    assert state.cycle_log.records()["add_nodes"] == CycleRecord(
        "add_nodes", 150.0, 151.0, 450.0, "BUSY again", 0, last_error_at=90.5, runs=3,
        last_duration=1.0)


def test_read_only_while_a_writer_holds_it(state, state_dir):
    state.set_slice("urn:one", 1.0)
    reader = ManagerState.read_only(state_dir)
    try:
        with state.transaction():
            state.set_slice("urn:two", 2.0)
            state.upsert_node(CM, "n1", now=1.0)
            assert reader.slice().urn == "urn:one"   # sees the last committed state
            assert reader.nodes() == []
        assert reader.slice().urn == "urn:two" and len(reader.nodes()) == 1
        with pytest.raises(StateError, match="readonly"):
            reader.set_meta("k", "v")
    finally:
        reader.close()


def test_read_only_without_state_says_so(tmp_path):
    with pytest.raises(StateError, match="no manager state"):
        ManagerState.read_only(tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()


def test_newer_schema_is_refused(state_dir):
    ManagerState.open(state_dir).close()
    with sqlite3.connect(state_dir / DB_NAME) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StateError, match="version '99'"):
        ManagerState.open(state_dir)
    with pytest.raises(StateError, match="version '99'"):
        ManagerState.read_only(state_dir)


def test_garbage_file_is_one_clear_error(state_dir):
    state_dir.mkdir()
    (state_dir / DB_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateError, match="cannot open the manager state"):
        ManagerState.open(state_dir)


def test_closed_state_refuses_use(state_dir):
    st = ManagerState.open(state_dir)
    st.close()
    with pytest.raises(StateError, match="closed"):
        st.slice()


def test_concurrent_writers_from_threads(state, state_dir):
    other = ManagerState.open(state_dir)   # a second connection too
    errors: list[BaseException] = []

    def work(st: ManagerState, t: int) -> None:
        try:
            for i in range(40):
                st.upsert_node(CM, f"t{t}-n{i}", now=float(i), state="notready")
                st.upsert_node(CM, f"t{t}-n{i}", now=float(i) + 0.5, state="ready")
                iid = st.begin_intent("add", CM, [f"t{t}-n{i}"], now=float(i))
                st.finish_intent(iid, now=float(i), outcome="done")
                st.cycle_log.record_run(f"m{t}", started=float(i), finished=float(i), error=None,
                              next_run=None)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(state if t % 2 else other, t))
               for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    other.close()
    assert not errors
    assert len(state.nodes()) == 240 and all(n.state == "ready" for n in state.nodes())
    assert len(state.intents()) == 240 and not state.open_intents()
    assert {m: r.runs for m, r in state.cycle_log.records().items()} == {f"m{t}": 40 for t in range(6)}
    assert all(len(state.history(CM, n.client_id)) == 2 for n in state.nodes())


@pytest.mark.slow
def test_killed_mid_transaction_keeps_the_intent_and_loses_the_half_write(state_dir):
    # A real process writes its intent, starts a transaction and is SIGKILLed before commit.
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from elasticslice.managers.state import ManagerState
        st = ManagerState.open(Path({str(state_dir)!r}))
        st.begin_intent("add", {CM!r}, ["node2"], now=1.0)
        with st.transaction():
            st.upsert_node({CM!r}, "node2", now=2.0, state="notready")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == -signal.SIGKILL
    st = ManagerState.open(state_dir)
    try:
        assert [i.client_ids for i in st.open_intents()] == [("node2",)]
        assert st.nodes() == []
    finally:
        st.close()


def test_a_version_2_state_is_migrated_and_keeps_its_nodes(state_dir):
    """Version 3 adds each node's manifest address (the enrolment service takes a node's
    token only from there): a version-2 file keeps its nodes, with no address yet."""
    state_dir.mkdir(mode=0o700)
    with sqlite3.connect(state_dir / DB_NAME) as db:
        db.executescript("""
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
            INSERT INTO meta VALUES ('schema_version', '2');
            CREATE TABLE nodes (cm TEXT, client_id TEXT, node_id TEXT, hostname TEXT,
                state TEXT, initial INTEGER, added_at REAL, gone_at REAL, gone_reason TEXT,
                updated REAL, PRIMARY KEY (cm, client_id));
            INSERT INTO nodes VALUES ('cm', 'node-1', 'pc1', 'pc1.a', 'ready', 1, 1.0, NULL,
                NULL, 1.0);
        """)
    st = ManagerState.open(state_dir)
    try:
        assert st.get_meta("schema_version") == "5"
        [node] = st.nodes()
        assert (node.client_id, node.state, node.ipv4) == ("node-1", "ready", None)
        st.upsert_node("cm", "node-1", now=2.0, ipv4="100.64.0.2")
        assert st.node("cm", "node-1").ipv4 == "100.64.0.2"
    finally:
        st.close()


def test_the_nodes_to_give_back_are_asked_once_and_survive_a_restart(state_dir):
    st = ManagerState.open(state_dir)
    assert st.to_release.ask(CM, "node-2", node_id="pc2", source="notice", reason="drained",
                          now=10.0)
    assert not st.to_release.ask(CM, "node-2", node_id="pc2", source="policy", reason="surplus",
                              now=11.0)  # the first ask stands
    assert st.to_release.ask(CM2, "node-3", node_id="pc3", source="policy", reason="surplus",
                          now=12.0)
    with pytest.raises(ValueError):
        st.to_release.ask(CM, "node-4", node_id=None, source="whim", reason="", now=13.0)
    st.close()
    st = ManagerState.open(state_dir)  # a manager that died before its DeleteNodes
    try:
        assert [(r.cm, r.client_id, r.node_id, r.source, r.reason, r.asked)
                for r in st.to_release.rows()] == [(CM, "node-2", "pc2", "notice", "drained", 10.0),
                                            (CM2, "node-3", "pc3", "policy", "surplus", 12.0)]
        assert [r.client_id for r in st.to_release.rows(CM2)] == ["node-3"]
        st.to_release.drop(CM, ["node-2", "node-9"])
        assert [r.client_id for r in st.to_release.rows()] == ["node-3"]
    finally:
        st.close()


def test_a_version_3_state_is_migrated_with_nothing_to_give_back(state_dir):
    state_dir.mkdir(mode=0o700)
    with sqlite3.connect(state_dir / DB_NAME) as db:
        db.executescript("""
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
            INSERT INTO meta VALUES ('schema_version', '3');
        """)
    st = ManagerState.open(state_dir)
    try:
        assert st.get_meta("schema_version") == str(SCHEMA_VERSION) == "5"
        assert st.to_release.rows() == []
    finally:
        st.close()


def test_a_version_4_state_keeps_its_values_and_takes_what_came_with_them(state_dir):
    """Version 5: a value's client_id and component_urn are kept with it (the endpoint kept
    them in memory, a second copy); a version-4 file's values stay."""
    state_dir.mkdir(mode=0o700)
    with sqlite3.connect(state_dir / DB_NAME) as db:
        db.executescript("""
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
            INSERT INTO meta VALUES ('schema_version', '4');
            CREATE TABLE node_values (cm TEXT, node_id TEXT, value REAL, updated REAL,
                PRIMARY KEY (cm, node_id));
            INSERT INTO node_values VALUES ('cm', 'pc1', 0.5, 1.0);
        """)
    st = ManagerState.open(state_dir)
    try:
        assert st.get_meta("schema_version") == "5"
        assert st.values() == {"pc1": 0.5}
        st.set_values("cm", {"pc2": 0.25}, now=2.0,
                      names={"pc2": ("node-2", "urn:publicid:IDN+x+node+pc2")})
        assert st._rows("SELECT node_id, client_id, component_urn FROM node_values "
                        "ORDER BY node_id") == [("pc1", None, None),
                                                ("pc2", "node-2", "urn:publicid:IDN+x+node+pc2")]
    finally:
        st.close()
