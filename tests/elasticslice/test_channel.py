"""The local channel between the manager daemon and the workload side: typed, versioned
JSON frames on a 0600 UNIX socket, and each way around it tried the way an attacker would
(a stranger's uid, a pickle, a frame too long, a bool for a number, a second workload)."""
from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from elasticslice import channel as ch
from tests.helpers import wait_for


class Daemon:
    """A ChannelServer and what it saw."""

    def __init__(self, state_dir: Path) -> None:
        self.messages: list[dict[str, Any]] = []
        self.detached: list[str | None] = []
        self.server = ch.ChannelServer(
            state_dir, on_message=lambda _c, m: self.messages.append(m),
            on_detach=lambda _c, why: self.detached.append(why)).start()

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def raw(state_dir: Path) -> socket.socket:
    """A bare connection to the daemon's socket, as any process of this uid could make."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with ch.socket_address(state_dir / ch.SOCKET) as address:  # pytest's paths can be too long
        sock.connect(address)
    sock.settimeout(10)
    return sock


def answer(sock: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


HELLO = b'{"type":"hello","version":%d,"role":"workload"}\n' % ch.VERSION


def test_demand_in_and_decisions_out(tmp_path: Path) -> None:
    got: list[dict[str, Any]] = []
    with Daemon(tmp_path) as daemon:
        mode = stat.S_IMODE(os.stat(tmp_path / ch.SOCKET).st_mode)
        assert mode == 0o600, oct(mode)
        link = ch.connect(tmp_path, on_message=got.append)
        link.send("demand", queued_cores=8, running_cores=4, extra_nodes=1.5)
        link.send("pilots", pilots=[{"client_id": "node-1", "pilot_id": "p-1",
                                     "state": "RUNNING", "cores": 4, "busy": False,
                                     "idle_since": 1.5, "units": 0}])
        wait_for(lambda: len(daemon.messages) == 2, what="the daemon reading both")
        assert daemon.messages[0] == {"type": "demand", "queued_cores": 8,
                                      "running_cores": 4, "extra_nodes": 1.5}
        assert daemon.server.workload is not None
        assert daemon.server.workload.peer["pid"] == os.getpid()  # the kernel's word
        daemon.server.workload.send("drain", client_id="node-1", until=1e9, margin=5)
        wait_for(lambda: got, what="the drain decision")
        assert got == [{"type": "drain", "client_id": "node-1", "until": 1e9, "margin": 5}]
        link.close()
        wait_for(lambda: daemon.detached, what="the daemon seeing the workload go")
        assert daemon.detached == ["the peer said bye"]


def test_a_state_directory_deeper_than_a_socket_address(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d" * 40] * 4)
    deep.mkdir(parents=True)
    assert len(str(deep / ch.SOCKET)) > 108
    with Daemon(deep) as daemon:
        ch.connect(deep, on_message=lambda m: None).send("demand", extra_nodes=None)
        wait_for(lambda: daemon.messages, what="the demand")
        assert daemon.messages == [{"type": "demand", "extra_nodes": None}]


STRANGER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
    except OSError as err:
        print("connect:", err.strerror)
        raise SystemExit
    s.sendall(b'{"type":"hello","version":VERSION,"role":"workload"}\\n')
    s.settimeout(10)
    print(s.recv(4096).decode().strip())
""")


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to be another user")
def test_a_stranger_cannot_attach() -> None:
    """Another uid: the socket's mode stops it; with the mode opened up (a user's mistake),
    the kernel's word about the peer does."""
    # pytest's tmp_path is under a 0700 directory: a stranger could not reach any socket
    # there. $TMPDIR (make test: 0755, the box's nodes run as nobody from it) can be.
    tmp_path = Path(tempfile.mkdtemp(prefix="es-channel-"))
    try:
        tmp_path.chmod(0o755)
        if any(not p.stat().st_mode & 0o001 for p in tmp_path.parents):
            pytest.skip(f"{tempfile.gettempdir()}: another user cannot reach it")
        _stranger(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _stranger(tmp_path: Path) -> None:
    with Daemon(tmp_path) as daemon:
        def as_nobody() -> str:
            return subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 "/usr/bin/python3", "-c", STRANGER.replace("VERSION", str(ch.VERSION)),
                 str(tmp_path / ch.SOCKET)],
                capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        assert as_nobody() == "connect: Permission denied"
        (tmp_path / ch.SOCKET).chmod(0o666)
        out = as_nobody()
        assert "uid 65534 may not attach to this manager daemon" in out, out
        assert daemon.server.workload is None and daemon.messages == []
        assert daemon.server.refused == 1


def test_a_pickle_is_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {marker}",))
    payload = pickle.dumps(Evil()) + b"\n"
    with Daemon(tmp_path) as daemon:
        sock = raw(tmp_path)          # as its hello
        sock.sendall(payload)
        assert b"a frame is not JSON" in answer(sock)
        sock = raw(tmp_path)          # after a good hello
        sock.sendall(HELLO + payload)
        reply = answer(sock)
        assert b'"type":"hello"' in reply and b"a frame is not JSON" in reply, reply
        assert not marker.exists()
        assert daemon.messages == []
        # the daemon goes on: the next workload attaches
        ch.connect(tmp_path, on_message=lambda m: None).send("demand", units_queued=1)
        wait_for(lambda: daemon.messages, what="the next workload's demand")


def test_a_frame_too_long_is_not_buffered_whole(tmp_path: Path, caplog) -> None:
    with Daemon(tmp_path) as daemon:
        sock = raw(tmp_path)
        sock.sendall(HELLO)
        with pytest.raises(OSError):  # the daemon hangs up while we still send
            sock.sendall(b'{"type":"demand","units_queued":' + b"1" * (4 * ch.MAX_FRAME))
        wait_for(lambda: daemon.server.workload is None, what="the daemon hanging up")
        assert "a frame over 1048576 bytes" in caplog.text and daemon.messages == []


@pytest.mark.parametrize("frame, line", [
    ({"type": "demand", "extra_nodes": True}, "demand: the field 'extra_nodes' must be int or "
                                              "float or null, not bool"),
    ({"type": "drained", "client_id": "n"}, "drained: the field 'requeued' is missing"),
    ({"type": "demand", "units_queued": 1, "why": "x"}, "demand: unknown field 'why'"),
    ({"type": "demand", "units_queued": -1}, "demand: the field 'units_queued' is negative"),
    ({"type": "values", "values": {"n": 2}}, "values: 'n': expected a number from 0 to 1"),
    ({"type": "shell", "cmd": "rm"}, "unknown message type 'shell'"),
    ({"type": "pilots", "pilots": [{"client_id": "n", "pilot_id": "p", "state": "A",
                                    "cores": "4", "busy": False}]},
     "pilots[0]: the field 'cores' must be int, not str"),
    ({"type": "drained", "client_id": "n" * 5000, "requeued": 0},
     "drained: the field 'client_id' is over 4096 characters"),
    ({"type": []}, "unknown message type '[]'"),   # once killed the reader, and the socket
    ({"type": {"a": 1}}, "unknown message type \"{'a': 1}\""),
    ({"type": "pilots", "pilots": [{"client_id": "n", "pilot_id": "p", "state": "A",
                                    "cores": -4, "busy": False}]},
     "pilots[0]: the field 'cores' is negative"),
    ({"type": "drained", "client_id": "n", "requeued": 0.5 - 1},
     "drained: the field 'requeued' must be int, not float"),
    ({"type": "demand", "extra_nodes": -2.5}, "demand: the field 'extra_nodes' is negative"),
    # a Parsl provider's blocks: each node a short string, the state one of a block's
    ({"type": "blocks", "blocks": [{"job_id": "j", "name": "b", "command": "c", "size": 1,
                                    "state": "live", "nodes": [{"x": 1}]}]},
     "blocks[0]: nodes: expected client_ids (strings of 1 to 64 characters)"),
    ({"type": "blocks", "blocks": [{"job_id": "j", "name": "b", "command": "c", "size": True,
                                    "state": "live", "nodes": []}]},
     "blocks[0]: the field 'size' must be int, not bool"),
    ({"type": "blocks", "blocks": [{"job_id": "j", "name": "b", "command": "c", "size": 1,
                                    "state": "running", "nodes": []}]},
     "blocks[0]: unknown block state 'running'"),
    ({"type": "blocks", "blocks": [{"job_id": "j", "name": "b", "command": "c", "size": 1,
                                    "state": "live", "nodes": ["n"] * 1001}]},
     "blocks[0]: 1001 nodes, at most 1000"),
])
def test_a_bad_frame_is_one_line_naming_it(tmp_path: Path, frame: dict[str, Any],
                                           line: str) -> None:
    import json
    with Daemon(tmp_path) as daemon:
        sock = raw(tmp_path)
        sock.sendall(HELLO + json.dumps(frame).encode() + b"\n")
        reply = answer(sock).decode()
        assert json.dumps(line) in reply, reply
        assert daemon.messages == []
        # the server goes on: the next workload attaches
        wait_for(lambda: daemon.server.workload is None, what="the bad peer let go")
        ch.connect(tmp_path, on_message=lambda m: None).close()
        with pytest.raises(ch.ChannelError, match="must be"):
            ch.encode({"type": "drain", "client_id": "n", "until": "soon"})  # ours too


def test_nan_is_not_json_here(tmp_path: Path) -> None:
    with Daemon(tmp_path):
        sock = raw(tmp_path)
        sock.sendall(HELLO + b'{"type":"demand","extra_nodes":NaN}\n')
        assert b"NaN is not JSON" in answer(sock)


def test_another_version_is_told_both(tmp_path: Path) -> None:
    with Daemon(tmp_path) as daemon:
        sock = raw(tmp_path)
        sock.sendall(b'{"type":"hello","version":%d,"role":"workload"}\n' % (ch.VERSION + 1))
        assert b"the peer speaks version %d of the channel, this side %d" % (
            ch.VERSION + 1, ch.VERSION) in answer(sock)
        assert daemon.server.workload is None


def test_one_workload_at_a_time(tmp_path: Path) -> None:
    with Daemon(tmp_path) as daemon:
        first = ch.connect(tmp_path, on_message=lambda m: None)
        with pytest.raises(ch.ChannelError, match=f"another workload \\(pid {os.getpid()}\\)"):
            ch.connect(tmp_path, on_message=lambda m: None)
        first.close()
        wait_for(lambda: daemon.server.workload is None, what="the first one gone")
        ch.connect(tmp_path, on_message=lambda m: None)


WORKLOAD = textwrap.dedent("""
    import sys, time
    from elasticslice import channel
    channel.connect(sys.argv[1], on_message=lambda m: None).send("demand", units_queued=2)
    print("attached", flush=True)
    time.sleep(60)
""")


def test_a_killed_workload_is_noticed(tmp_path: Path) -> None:
    with Daemon(tmp_path) as daemon:
        proc = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "attached\n"
            wait_for(lambda: daemon.messages, what="its demand")
            proc.send_signal(signal.SIGKILL)
            wait_for(lambda: daemon.detached, what="the daemon noticing")
            assert daemon.detached == ["the peer closed the connection"]
        finally:
            proc.kill()
            proc.wait()


def test_a_daemon_noticed_gone_by_the_workload(tmp_path: Path) -> None:
    closed: list[str | None] = []
    done = threading.Event()
    daemon = Daemon(tmp_path)
    ch.connect(tmp_path, on_message=lambda m: None,
               on_close=lambda why: (closed.append(why), done.set()))
    daemon.server.stop()
    assert done.wait(10)
    assert closed == ["the peer said bye"]


def test_one_daemon_a_state_directory(tmp_path: Path) -> None:
    with Daemon(tmp_path):
        with pytest.raises(ch.ChannelError, match="another manager daemon serves"):
            ch.ChannelServer(tmp_path, on_message=lambda c, m: None).start()
    # a socket file a killed daemon left is taken over
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with ch.socket_address(tmp_path / ch.SOCKET) as address:
        stale.bind(address)
    stale.close()
    with Daemon(tmp_path) as daemon:
        ch.connect(tmp_path, on_message=lambda m: None).send("demand", units_queued=0)
        wait_for(lambda: daemon.messages, what="the demand")


def test_no_daemon_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ch.ChannelError, match="no manager daemon answers there"):
        ch.connect(tmp_path, on_message=lambda m: None)
