"""Troy's own unit channel (``DaskFramework(unit_channel=True)``, the default), tried the way
an attacker would: a stranger, a member of the same CA without the worker's token, a member
with another worker's token, a hostile node forging other units' results or sending what is
not data, idle connections; and units on it end to end (latency path, cancel while sent,
a unit that returns to an agent that was told to drop it)."""
from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest

import troy
from elasticslice.rpc.pki import make_ca
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask import DaskFramework, wire
from troy.frameworks.dask.link import MAX_UNKNOWN, Links
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import member, nodes

WAIT = 60


class Seen:
    """What the channel told its framework."""

    def __init__(self) -> None:
        self.events: list[tuple[str, list]] = []
        self.closed: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def on_events(self, addr: str, events: list) -> None:
        with self.lock:
            self.events.append((addr, events))

    def on_closed(self, addr: str, why: str) -> None:
        with self.lock:
            self.closed.append((addr, why))


@pytest.fixture
def plain_links():
    seen = Seen()
    links = Links("t", "127.0.0.1", 0, None, seen.on_events, seen.on_closed)
    links.start()
    yield links, seen
    links.close()


@contextmanager
def one_pilot(tmp_path: Path, size: int) -> Iterator[tuple[Any, troy.Pilot]]:
    """A session's Dask framework (units on the channel) with one running pilot of
    ``size`` cores: ``(framework, pilot)``."""
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        fw = s.add_framework("dask", sandbox=str(tmp_path / "sb"))
        pilot = fw.submit_pilot({"size": size})
        assert pilot.wait_running(WAIT) is State.RUNNING
        yield fw, pilot


def connect(links: Links, token: str | None = None) -> socket.socket:
    host, port = links.address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    if token is not None:
        s.sendall(wire.pack(["hello", token]))
        assert wire.read_frame(s) == ["ok"]
    return s


def closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(WAIT)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, ssl.SSLError):
        return True


def test_a_node_cannot_report_units_it_was_not_sent(plain_links) -> None:
    links, seen = plain_links
    ta, tb = links.expect("tcp://a:1", None), links.expect("tcp://b:1", None)
    a, b = connect(links, ta), connect(links, tb)
    assert links.send_units("tcp://a:1", [["k1", "u1", {"executable": "/bin/true"}, None]])
    assert wire.read_frame(a)[0] == "units"
    result = [0, None, None, 1.0, 2.0, [], None, None]
    # b forges u1's end (its key and id are right), and claims a's address: dropped
    b.sendall(wire.pack(["events", [["end", "u1", result, "k1"]]]))
    # a sends an event for a key it never got: dropped; then u1's real end
    a.sendall(wire.pack(["events", [["end", "u9", result, "k9"], ["end", "u1", result, "k1"]]]))
    wait_for(lambda: seen.events, WAIT, what="a's event")
    time.sleep(0.2)
    assert seen.events == [("tcp://a:1", [["end", "u1", "tcp://a:1", result, "k1"]])]
    # a second end of the same key is a forgery too: it ended
    a.sendall(wire.pack(["events", [["end", "u1", result, "k1"]]]))
    time.sleep(0.2)
    assert len(seen.events) == 1
    assert links.keys("tcp://a:1") == set()


def test_a_cancel_waits_for_its_own_agent_s_ack_alone(plain_links) -> None:
    """A cancel returns once the agent it went to acked it. Another node's ack of the same
    number, or an agent's ack sent before the cancel (a node acking ahead, so that cancels
    return before it dropped the units), does not end the wait; after one wait timed out,
    that agent's cancels do not wait until it acks again; an ack that numbers nothing
    closes the connection."""
    links, seen = plain_links
    ta, tb = links.expect("tcp://a:1", None), links.expect("tcp://b:1", None)
    a, b = connect(links, ta), connect(links, tb)
    assert links.send_units("tcp://a:1", [["k1", "u1", {"executable": "/bin/true"}, None]])
    assert wire.read_frame(a)[0] == "units"
    a.sendall(wire.pack(["events", [["ack", "", 1, ""]]]))   # ahead of any cancel
    time.sleep(0.2)
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(links.cancel("tcp://a:1", ["u1"], 30)))
    waiter.start()
    assert wire.read_frame(a) == ["cancel", ["u1"], 1]
    b.sendall(wire.pack(["events", [["ack", "", 1, ""]]]))   # not b's cancel
    time.sleep(0.3)
    assert not done and waiter.is_alive()
    a.sendall(wire.pack(["events", [["ack", "", 1, ""]]]))
    waiter.join(WAIT)
    assert done == [True]
    # an agent that does not ack: one cancel waits its time out, the next ones not at all
    # (a workload's cancels on a node that hung), until it acks again
    assert links.cancel("tcp://a:1", ["u2"], 0.3) is False
    t0 = time.monotonic()
    assert links.cancel("tcp://a:1", ["u3"], 30) is False
    assert time.monotonic() - t0 < 5
    assert [wire.read_frame(a) for _ in range(2)] == [["cancel", ["u2"], 2],
                                                      ["cancel", ["u3"], 3]]
    a.sendall(wire.pack(["events", [["ack", "", 3, ""]]]))
    wait_for(lambda: not links._links["tcp://a:1"].stalled, WAIT, what="the ack read")
    waiter = threading.Thread(target=lambda: done.append(links.cancel("tcp://a:1", ["u4"], 30)))
    waiter.start()
    assert wire.read_frame(a) == ["cancel", ["u4"], 4]
    time.sleep(0.2)
    assert waiter.is_alive()   # it waits again
    a.sendall(wire.pack(["events", [["ack", "", 4, ""]]]))
    waiter.join(WAIT)
    assert done == [True, True]
    a.sendall(wire.pack(["events", [["ack", "", "1", ""]]]))
    assert closed_by_peer(a)
    assert not seen.events   # acks are not unit events


def test_a_token_is_for_one_connection_and_unknown_ones_are_refused(plain_links) -> None:
    links, seen = plain_links
    token = links.expect("tcp://a:1", None)
    s = connect(links)
    s.sendall(wire.pack(["hello", "0" * 64]))
    assert closed_by_peer(s)
    first = connect(links, token)
    again = connect(links)
    again.sendall(wire.pack(["hello", token]))   # replayed: used already
    assert closed_by_peer(again)
    assert links.connected("tcp://a:1")
    first.close()
    wait_for(lambda: seen.closed, WAIT, what="the close reported")
    assert seen.closed[0][0] == "tcp://a:1"


@pytest.mark.parametrize("frame", [
    msgpack.packb(["events", [msgpack.ExtType(1, b"x")]], use_bin_type=True),
    msgpack.packb(["events", [["end", "u1", [0, msgpack.Timestamp(1), None, 1.0, 2.0, [],
                                             None, None], "k1"]]], use_bin_type=True),
    b"\xc1\xc1\xc1",                                  # not msgpack
    msgpack.packb({"events": []}, use_bin_type=True),  # not a list
    msgpack.packb(["units", []], use_bin_type=True),   # a node may not send units
    msgpack.packb(["events", [["end", "u1"]]], use_bin_type=True),
], ids=["extension", "timestamp", "garbage", "map", "units", "short-event"])
def test_what_is_not_plain_data_closes_the_connection(plain_links, frame: bytes) -> None:
    links, seen = plain_links
    a = connect(links, links.expect("tcp://a:1", None))
    links.send_units("tcp://a:1", [["k1", "u1", {"executable": "/bin/true"}, None]])
    a.sendall(wire.HEADER.pack(len(frame)) + frame)
    assert closed_by_peer(a)
    wait_for(lambda: seen.closed, WAIT, what="the connection closed")
    assert seen.events == [] and seen.closed[0][0] == "tcp://a:1"


def test_a_pickle_in_a_result_stays_bytes(plain_links) -> None:
    import pickle
    links, seen = plain_links
    a = connect(links, links.expect("tcp://a:1", None))
    links.send_units("tcp://a:1", [["k1", "u1", {"executable": "/bin/true"}, None]])
    wire.read_frame(a)
    bomb = pickle.dumps(Path("/"))
    a.sendall(wire.pack(["events", [["end", "u1", [0, bomb, None, 1.0, 2.0, [], None, None],
                                     "k1"]]]))
    wait_for(lambda: seen.events, WAIT, what="the end event")
    assert seen.events[0][1][0][3][1] == bomb   # data, never loaded


def test_an_oversized_frame_is_refused_unread(plain_links) -> None:
    links, seen = plain_links
    a = connect(links, links.expect("tcp://a:1", None))
    a.sendall(wire.HEADER.pack(wire.MAX_FRAME + 1))
    assert closed_by_peer(a)
    s = connect(links)
    s.sendall(wire.HEADER.pack(wire.HELLO_MAX + 1))   # a hello may not be large either
    assert closed_by_peer(s)


def test_idle_connections_are_capped_and_the_worker_still_gets_in(plain_links) -> None:
    links, _ = plain_links
    idle = [connect(links) for _ in range(MAX_UNKNOWN)]
    time.sleep(0.3)
    extra = connect(links)
    assert closed_by_peer(extra)           # past the cap: closed at once
    for s in idle:
        s.close()
    time.sleep(0.3)
    token = links.expect("tcp://a:1", None)
    worker = connect(links, token)   # (kept open: a socket let go of closes its link)
    wait_for(lambda: links.connected("tcp://a:1"), WAIT, what="the worker's link")
    worker.close()


# ------------------------------------------------------------------ over TLS, end to end --
@pytest.fixture(scope="module")
def ca() -> tuple[bytes, bytes]:
    return make_ca("troy channel test CA", key_type="ec")


@pytest.fixture
def fw(tmp_path: Path, ca):  # noqa: ANN201
    f = DaskFramework("elastic", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                      tls=member(tmp_path / "control", ca, "control"))
    f.start()
    yield f
    f.close()


def tls_connect(fw: DaskFramework, files, token: str | None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=files.ca_file)
    ctx.check_hostname = False
    ctx.load_cert_chain(files.cert_file, files.key_file)
    host, port = fw._links.address.rsplit(":", 1)
    s = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10))
    if token is not None:
        s.sendall(wire.pack(["hello", token]))
    return s


@pytest.mark.slow
def test_over_tls_only_the_worker_itself_gets_its_units(fw, ca, tmp_path) -> None:
    with nodes(fw, ca, tmp_path, ["node-a"]):
        pa = fw.find_pilot("node-a")
        assert fw._links.connected(pa.native_id)
        # a stranger: no certificate, no TLS
        host, port = fw._links.address.rsplit(":", 1)
        plain = socket.create_connection((host, int(port)), timeout=10)
        plain.sendall(wire.pack(["hello", "0" * 64]))
        assert closed_by_peer(plain)
        # a member of the same CA with a token made for node-a: not node-a's certificate
        token = fw._links.expect("tcp://127.0.0.1:9", "node-a")
        other = member(tmp_path / "other", ca, "node-b")
        assert closed_by_peer(tls_connect(fw, other, token))
        # a certificate of the CA without a member's role
        token = fw._links.expect("tcp://127.0.0.1:9", None)
        nobody = member(tmp_path / "nobody", ca, "nobody", role=None)
        assert closed_by_peer(tls_connect(fw, nobody, token))
        assert not fw._links.connected("tcp://127.0.0.1:9")
        # node-a is untouched and runs units
        u = fw.submit_unit(CUD(executable="/bin/echo", arguments=["hi"]))
        assert u.wait(WAIT) is State.DONE and u.result.stdout.data == b"hi\n"
        assert u.pilot == pa.id and pa.state is State.RUNNING


@pytest.mark.slow
def test_a_unit_canceled_while_it_is_sent_leaves_no_process(tmp_path) -> None:
    marker = tmp_path / "never"
    with one_pilot(tmp_path, 1) as (fw, a):
        send = fw._links.send_units
        units: dict[str, troy.ComputeUnit] = {}

        def send_then_cancel(addr: str, items: list) -> bool:
            ok = send(addr, items)
            wait_for(lambda: marker.with_suffix(".started").exists(), WAIT,
                     what="the unit started")
            for item in items:
                wait_for(lambda: item[1] in units, WAIT, what="the unit known")
                units[item[1]].cancel()
            return ok

        fw._links.send_units = send_then_cancel
        u = fw.submit_unit(CUD(executable="/bin/sh", arguments=[
            "-c", f"touch {marker}.started; while [ ! -e {marker} ]; do sleep 0.02; done"]))
        units[u.id] = u
        wait_for(lambda: u.state is State.CANCELED, WAIT, what="the unit canceled")
        fw._links.send_units = send
        v = fw.submit_unit(CUD(executable="/bin/true"))   # its core is free again
        assert v.wait(WAIT) is State.DONE
        assert v.pilot == a.id


def test_a_queued_unit_canceled_never_starts_however_late_its_cancel_travels(tmp_path) -> None:
    """Regression (the contract's cancel test failed once in a loaded suite run): a cancel
    was a frame written when the channel's loop got to it, and ``cancel()`` returned before.
    The unit ahead of it ended at once, its agent started the next queued one, the canceled
    unit, and the cancel arrived after. Now ``cancel()`` returns once the agent acked it:
    here the channel's loop is held up for 0.5 s, as a loaded control's may be."""
    gate, marker = tmp_path / "gate", tmp_path / "ran"
    with one_pilot(tmp_path, 1) as (fw, a):
        blocker = fw.submit_unit(CUD(executable="/bin/sh", arguments=[
            "-c", f"while [ ! -e {gate} ]; do sleep 0.01; done"]))
        queued = fw.submit_unit(CUD(executable="/bin/touch", arguments=[str(marker)]))
        wait_for(lambda: blocker.state is State.RUNNING, WAIT, what="the blocker running")
        wait_for(lambda: len(fw._links.unit_ids(a.native_id)) == 2, WAIT,
                 what="both units sent to the agent")
        fw._links._loop.call_soon_threadsafe(time.sleep, 0.5)   # the loop, busy
        queued.cancel()
        gate.touch()
        assert blocker.wait(WAIT) is State.DONE
        last = fw.submit_unit(CUD(executable="/bin/true"))
        assert last.wait(WAIT) is State.DONE
        assert queued.state is State.CANCELED and not marker.exists()


def test_a_unit_the_node_cannot_read_fails_alone(tmp_path, monkeypatch) -> None:
    """A function from a module only the control has (the node cannot unpickle it): that
    unit fails, naming the module; the agent's channel stays and the next unit runs (it
    used to close the channel, and the unit went round pilots for ever)."""
    (tmp_path / "only_on_control.py").write_text("def f():\n    return 1\n")
    with one_pilot(tmp_path, 1) as (fw, a):
        monkeypatch.syspath_prepend(str(tmp_path))   # after the node started: not its path
        from only_on_control import f
        u = fw.submit_unit(CUD(function=f))
        assert u.wait(WAIT) is State.FAILED
        assert "could not read the unit" in u.result.error
        assert "only_on_control" in u.result.error
        v = fw.submit_unit(CUD(executable="/bin/true"))
        assert v.wait(WAIT) is State.DONE and v.pilot == a.id
        assert u.attempts <= 1 and fw.unit_stats().lost == 0


def test_a_unit_taken_back_and_sent_again_to_the_same_agent_runs_there(tmp_path) -> None:
    """Regression (a ``troy run`` of Montage hung at 40/58 about once in 40 runs under
    load): a unit taken back from an agent while it ran there (moved to an idle pilot, the
    way queued units are) and placed on the same agent again arrived while its first attempt
    was still being killed. Both attempts were one unit id to the agent, so the second was
    killed as canceled before it started, and nothing ever said it ended."""
    gate = tmp_path / "gate"
    with one_pilot(tmp_path, 2) as (fw, a):
        u = fw.submit_unit(CUD(executable="/bin/sh", arguments=[
            "-c", f"[ -e {gate} ] && exit 0; touch {gate}; sleep 60"]))
        wait_for(lambda: u.state is State.RUNNING and gate.exists(), WAIT,
                 what="the unit's first attempt running")
        rec = fw._records[u.id]
        with fw._dispatch_lock:   # what moving a unit off a busy agent does
            fw._links.cancel(rec.addr, [u.id])
            rec.future, rec.addr = None, None
            fw._unreserve(rec)
            fw._dispatch_links([rec])   # ... and the same agent is where it goes now
        assert u.wait(WAIT) is State.DONE, u.result
        assert u.pilot == a.id and u.result.exit_code == 0
        assert fw.unit_stats().lost == 0


def test_a_unit_moved_off_a_drained_pilot_goes_to_another_site_first(tmp_path) -> None:
    """Pilots that know their site (elasticslice labels each with its node's CM): a unit
    a drain moves off a pilot goes to a pilot at another site before one at the drained
    pilot's own site, even a wider one with more free cores (CloudLab takes nodes back where
    it needs them; more may follow there). Without sites, the widest room wins."""
    gate = tmp_path / "gate"
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        fw = s.add_framework("dask", sandbox=str(tmp_path / "sb"))
        a = fw.submit_pilot(troy.PilotDescription(size=1, site="utah"))
        assert a.wait_running(WAIT) is State.RUNNING
        long = fw.submit_unit(CUD(executable="/bin/sh", runtime=600, arguments=[
            "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]), pilot=a)
        wait_for(lambda: long.state is State.RUNNING, WAIT, what="the unit running on a")
        b = fw.submit_pilot(troy.PilotDescription(size=4, site="utah"))
        c = fw.submit_pilot(troy.PilotDescription(size=1, site="wisc"))
        assert b.wait_running(WAIT) is State.RUNNING and c.wait_running(WAIT) is State.RUNNING
        plan = fw.drain_pilot(a, time.time() + 300, margin=5)
        assert plan.requeued == [long.id]
        wait_for(lambda: long.state is State.RUNNING and long.pilot != a.id, WAIT,
                 what="the unit running again")
        assert long.pilot == c.id   # wisc: not b, utah's, wider and idler
        gate.touch()
        assert long.wait(WAIT) is State.DONE and long.attempts == 2


@pytest.mark.slow
def test_queued_units_move_to_a_pilot_that_joins(tmp_path) -> None:
    """Units sent to the only pilot's agent (its backlog) run on a second pilot that joins
    while they wait: the channel takes them back, as Dask's scheduler steals work."""
    gate = tmp_path / "gate"
    with one_pilot(tmp_path, 1) as (fw, a):
        units = [fw.submit_unit(CUD(executable="/bin/sh", arguments=[
            "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])) for _ in range(3)]
        wait_for(lambda: any(u.state is State.RUNNING for u in units), WAIT,
                 what="a unit running")
        b = fw.submit_pilot({"size": 2})
        assert b.wait_running(WAIT) is State.RUNNING
        wait_for(lambda: sum(u.state is State.RUNNING for u in units) == 3, WAIT,
                 what="all three running, two of them on the new pilot")
        gate.touch()
        assert [u.wait(WAIT) for u in units] == [State.DONE] * 3
        assert sorted(u.pilot for u in units).count(b.id) == 2
        assert fw.unit_stats().lost == 0


@pytest.mark.slow
def test_a_unit_bound_to_a_pilot_whose_agent_is_still_connecting_runs_there(
        fw, ca, tmp_path) -> None:
    """Regression (the suite under load): a unit bound to an adopted pilot before its agent
    had connected was sent nowhere, then taken for one that had left that pilot: its events
    were ignored, and it waited for ever."""
    units: list[troy.ComputeUnit] = []
    open_link = fw._open_link

    def bound_first(addr: str):  # noqa: ANN202
        pilot = fw._by_addr[addr]
        units.append(fw.submit_unit(CUD(executable="/bin/echo", arguments=["here"]),
                                    pilot=pilot))
        time.sleep(0.5)   # the dispatcher has it before the agent connects
        return open_link(addr)

    fw._open_link = bound_first
    with nodes(fw, ca, tmp_path, ["node-a"]):
        pa = fw.find_pilot("node-a")
        (u,) = units
        assert u.wait(WAIT) is State.DONE and u.result.stdout.data == b"here\n"
        assert u.pilot == pa.id and u.attempts <= 1


@pytest.mark.slow
def test_a_thousand_idle_connections_and_the_node_s_own_certificate_get_nothing(
        fw, ca, tmp_path) -> None:
    """1,000 connections that never finish a handshake do not keep a node that joins from
    its channel; a task holding its node's own certificate (and key) cannot connect without
    the token only the agent was given: not with none, nor with one already used."""
    host, port = fw._links.address.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(1000)]
    try:
        with nodes(fw, ca, tmp_path, ["node-a"]):
            pa = fw.find_pilot("node-a")
            assert fw._links.connected(pa.native_id)
            u = fw.submit_unit(CUD(executable="/bin/echo", arguments=["in"]), pilot=pa)
            assert u.wait(WAIT) is State.DONE and u.result.stdout.data == b"in\n"
            own = member(tmp_path / "node-a-copy", ca, "node-a")   # the node's identity
            assert closed_by_peer(tls_connect(fw, own, "0" * 64))   # a token of its own
            token = fw._links.expect("tcp://127.0.0.1:9", "node-a")
            first = tls_connect(fw, own, token)        # the one holder of a token gets in
            assert wire.read_frame(first) == ["ok"]
            assert closed_by_peer(tls_connect(fw, own, token))      # and only once
            assert fw._links.connected(pa.native_id) and pa.state is State.RUNNING
            v = fw.submit_unit(CUD(executable="/bin/true"), pilot=pa)
            assert v.wait(WAIT) is State.DONE
    finally:
        for s in idle:
            s.close()
