"""The local channel between the manager daemon and the workload side.

The manager daemon is the one process that holds the user's CloudLab credentials and the
cluster CA's key; the workload side (Troy's session, a Dask client, Parsl's DataFlowKernel)
decodes what nodes send and so must never hold them. What crosses between the two is small,
typed and versioned, and nothing of it is ever a pickle:

- workload -> daemon: ``scheduler`` (where the nodes' agents join), ``demand`` (Troy's
  demand in cores and units, and what else asks for nodes), ``pilots`` (each pilot: its
  node, state, cores, busy or idle since when, units on it), ``drained`` (a drain decision
  carried out), ``retired`` (a retirement done: Dask moved the data only that worker held,
  or gave up; the daemon gives the node back only then), ``bounds`` (hold from this many nodes to that many), ``close`` (the run
  ends: stop, giving the slice back or not);
- daemon -> workload: ``node`` events (booting, joined, notice with its deadline,
  released), ``drain``/``retire``/``lose`` decisions for a node's pilot, CloudLab's
  ``values`` of the pilots, the nodes that failed to start (``failures``), and ``report``
  (send the demand and the pilots now: a decision is about to be made on them).

A Parsl provider (:mod:`elasticslice.parsl`) speaks its own frames on the same channel:
``blocks`` (every block Parsl asked for: its worker command, size, state and nodes, and the
executor's key folder) and ``block_drained`` to the daemon; ``bound`` (each block's nodes
and their states, and the daemon's view of its state) and ``drain_block`` (hold the
block's managers until they are empty or the deadline less the margin) back.

The daemon serves it on a UNIX socket, ``<state_dir>/manager.sock`` (:data:`SOCKET`), mode
0600 in the 0700 state directory, and the kernel says who connected (``SO_PEERCRED``): a uid
other than the daemon's is refused with one line before anything it sent is read, whatever
the file's mode. Frames are JSON objects, one a line, at most :data:`MAX_FRAME` bytes (a
longer one closes the connection without being buffered whole); NaN and Infinity are not
JSON here. The first frame each way is ``hello`` with the protocol :data:`VERSION` and the
peer's role; a peer of another version is told both versions in one line and closed. Every
frame is checked against :data:`MESSAGES` (its type, its fields and their types) before a
handler sees it, in both directions; a bad one is answered with one ``error`` line naming
what is wrong and where, and the connection is closed: the server goes on. One ``workload``
connection at a time: a second is refused with the first one's pid.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

VERSION = 2
SOCKET = "manager.sock"
MAX_FRAME = 1 << 20          # bytes of one frame, its newline included
MAX_PILOTS = 10_000          # entries of one ``pilots`` frame
ROLES = ("workload", "daemon")
HELLO_TIMEOUT = 10.0         # seconds a peer has to say hello
SILENT = "the peer closed the connection before its hello"

NUMBER = (int, float)
#: a ``demand`` frame's counts: those of Troy's ``Demand`` (troy/demand.py)
DEMAND_FIELDS = ("queued_cores", "running_cores", "waiting_cores", "max_unit_cores",
                 "units_queued", "units_running", "units_waiting", "units_done")
#: every message, with its fields: name -> (accepted types, required). ``None`` among the
#: types: JSON null is accepted.
MESSAGES: dict[str, dict[str, tuple[tuple[Any, ...], bool]]] = {
    "hello": {"version": ((int,), True), "role": ((str,), True), "pid": ((int,), False)},
    "error": {"line": ((str,), True)},
    "bye": {},
    # workload -> daemon
    "demand": {**{name: ((int,), False) for name in DEMAND_FIELDS},
               "extra_nodes": ((*NUMBER, None), False)},
    "pilots": {"pilots": ((list,), True), "seq": ((int,), False)},
    "drained": {"client_id": ((str,), True), "requeued": ((int,), True)},
    "retired": {"client_id": ((str,), True), "done": ((bool,), True)},
    "scheduler": {"address": ((str,), True)},
    "close": {"give_back": ((bool,), True)},
    "bounds": {"minthreshold": ((int,), True), "maxthreshold": ((int,), True)},
    # daemon -> workload
    "node": {"event": ((str,), True), "client_id": ((str,), True),
             "address": ((str, None), False), "deadline": ((*NUMBER,), False),
             "site": ((str, None), False)},
    "drain": {"client_id": ((str,), True), "until": ((*NUMBER,), True),
              "margin": ((*NUMBER,), True)},
    "retire": {"client_id": ((str,), True), "until": ((*NUMBER,), True)},
    "lose": {"client_id": ((str,), True), "reason": ((str,), True)},
    "values": {"values": ((dict,), True)},
    "failures": {"failures": ((list,), True)},
    "report": {"seq": ((int,), True)},
    # a Parsl provider -> its daemon
    "blocks": {"blocks": ((list,), True), "key_dir": ((str, None), False)},
    "block_drained": {"job_id": ((str,), True), "why": ((str,), True)},
    # a Parsl daemon -> its provider
    "bound": {"bound": ((list,), True)},
    "drain_block": {"job_id": ((str,), True), "until": ((*NUMBER,), True),
                    "margin": ((*NUMBER,), True)},
}
#: the fields of one entry of a ``pilots`` frame
PILOT: dict[str, tuple[tuple[Any, ...], bool]] = {
    "client_id": ((str,), True), "pilot_id": ((str,), True), "state": ((str,), True),
    "cores": ((int,), True),
    "busy": ((bool,), True), "idle_since": ((*NUMBER, None), False),
    "units": ((int,), False),
}
#: the fields of one entry of a ``failures`` frame (a node that failed to start)
FAILURE: dict[str, tuple[tuple[Any, ...], bool]] = {
    "client_id": ((str,), True), "node_id": ((str,), True), "what": ((str,), True),
    "cause": ((str, None), False), "seen_at": ((*NUMBER,), True),
}
MAX_FAILURES = 1000          # entries of one ``failures`` frame
#: the fields of one entry of a ``blocks`` frame (a Parsl block, as the provider has it)
BLOCK: dict[str, tuple[tuple[Any, ...], bool]] = {
    "job_id": ((str,), True), "name": ((str,), True), "command": ((str,), True),
    "size": ((int,), True), "block_id": ((str, None), False), "state": ((str,), True),
    "nodes": ((list,), True),
}
#: the fields of one entry of a ``bound`` frame (a block, as the daemon has it): its
#: nodes and each one's state (null: gone)
BOUND: dict[str, tuple[tuple[Any, ...], bool]] = {
    "job_id": ((str,), True), "state": ((str,), True), "message": ((str, None), False),
    "nodes": ((list,), True), "states": ((list,), True),
}
MAX_BLOCKS = 1000            # entries of one ``blocks`` or ``bound`` frame
MAX_BLOCK_NODES = 1000       # nodes of one block
BLOCK_STATES = ("live", "draining", "drained", "cancelled")
#: the frames that carry a list of objects (under the frame's own name): the fields of each
#: entry and how many there may be
ENTRIES = {"pilots": (PILOT, MAX_PILOTS), "failures": (FAILURE, MAX_FAILURES),
           "blocks": (BLOCK, MAX_BLOCKS), "bound": (BOUND, MAX_BLOCKS)}
SIGNED = ("until", "deadline")   # fields that may be negative (none is, today)
NODE_EVENTS = ("booting", "joined", "notice", "released")
MAX_TEXT = 4096  # characters of any string field


class ChannelError(ElasticSliceError):
    """The channel cannot be served or reached, or a peer broke its rules: one line."""


#: a table of fields, compiled once: (name, concrete types, null allowed, required,
#: bool allowed, negative allowed, the types' names)
_Compiled = list[tuple[str, tuple[type, ...], bool, bool, bool, bool, str]]
_COMPILED: dict[int, tuple[Mapping[str, Any], _Compiled]] = {}


def _compiled(fields: Mapping[str, tuple[tuple[Any, ...], bool]]) -> _Compiled:
    found = _COMPILED.get(id(fields))
    if found is not None and found[0] is fields:
        return found[1]
    table = [(name, tuple(t for t in types if t is not None), None in types, required,
              bool in types, name in SIGNED,
              " or ".join("null" if t is None else t.__name__ for t in types))
             for name, (types, required) in fields.items()]
    _COMPILED[id(fields)] = (fields, table)
    return table


def _check_fields(data: Mapping[str, Any], fields: Mapping[str, tuple[tuple[Any, ...], bool]],
                  where: str | tuple[str, int]) -> None:
    """Each field of ``data`` against ``fields`` (``where``: the frame's name, or its name
    and an entry's index, said in the error's line)."""
    def place() -> str:
        return where if isinstance(where, str) else f"{where[0]}[{where[1]}]"

    if len(data) > len(fields) or any(name not in fields for name in data):
        unknown = next(name for name in data if name not in fields)
        raise ChannelError(f"{place()}: unknown field {unknown!r}")
    for name, concrete, nullable, required, bools, signed, names in _compiled(fields):
        if name not in data:
            if required:
                raise ChannelError(f"{place()}: the field {name!r} is missing")
            continue
        value = data[name]
        kind = type(value)
        if value is None:
            if nullable:
                continue
            raise ChannelError(f"{place()}: the field {name!r} is null")
        # a bool is an int to Python, never to this protocol
        if kind is bool and not bools or not isinstance(value, concrete):
            raise ChannelError(f"{place()}: the field {name!r} must be {names}, "
                               f"not {kind.__name__}")
        if isinstance(value, str):
            if len(value) > MAX_TEXT:
                raise ChannelError(f"{place()}: the field {name!r} is over {MAX_TEXT} "
                                   f"characters")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ChannelError(f"{place()}: the field {name!r} is not a finite number")
        elif isinstance(value, NUMBER) and kind is not bool and value < 0 and not signed:
            raise ChannelError(f"{place()}: the field {name!r} is negative")


def check(message: Any) -> dict[str, Any]:
    """``message`` if it is a valid frame of this protocol; :class:`ChannelError` with one
    line naming what is wrong and where otherwise."""
    if not isinstance(message, dict):
        raise ChannelError(f"a frame must be a JSON object, not {type(message).__name__}")
    kind = message.get("type")
    if not isinstance(kind, str) or kind not in MESSAGES:
        raise ChannelError(f"unknown message type {str(kind)[:64]!r}")
    _check_fields({k: v for k, v in message.items() if k != "type"}, MESSAGES[kind], kind)
    if kind == "hello" and message["role"] not in ROLES:
        raise ChannelError(f"hello: unknown role {message['role'][:64]!r}")
    if kind == "node" and message["event"] not in NODE_EVENTS:
        raise ChannelError(f"node: unknown event {message['event'][:64]!r}")
    if kind in ENTRIES:   # a list of objects, each checked against its table
        fields, most = ENTRIES[kind]
        entries = message[kind]
        if len(entries) > most:
            raise ChannelError(f"{kind}: {len(entries)} entries, at most {most}")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ChannelError(f"{kind}[{i}]: must be an object")
            _check_fields(entry, fields, (kind, i))
            if kind in ("blocks", "bound"):
                _check_block(entry, f"{kind}[{i}]")
    if kind == "values":
        values = message["values"]
        if len(values) > MAX_PILOTS:
            raise ChannelError(f"values: {len(values)} entries, at most {MAX_PILOTS}")
        for name, value in values.items():
            if len(name) > MAX_TEXT or isinstance(value, bool) or \
                    not isinstance(value, NUMBER) or not 0 <= value <= 1:
                raise ChannelError(f"values: {name[:64]!r}: expected a number from 0 to 1")
    return message


def _check_block(entry: Mapping[str, Any], where: str) -> None:
    """A block's state, and its nodes (and their states): short strings, not too many."""
    if entry["state"] not in BLOCK_STATES:
        raise ChannelError(f"{where}: unknown block state {entry['state'][:32]!r}")
    nodes = entry["nodes"]
    if len(nodes) > MAX_BLOCK_NODES:
        raise ChannelError(f"{where}: {len(nodes)} nodes, at most {MAX_BLOCK_NODES}")
    if not all(isinstance(n, str) and 0 < len(n) <= 64 for n in nodes):
        raise ChannelError(f"{where}: nodes: expected client_ids (strings of 1 to 64 "
                           f"characters)")
    states = entry.get("states")
    if states is not None and (len(states) != len(nodes) or not all(
            s is None or isinstance(s, str) and len(s) <= 32 for s in states)):
        raise ChannelError(f"{where}: states: expected one state (a string or null) a node")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(line: bytes) -> dict[str, Any]:
    """One frame's bytes (without its newline) as a checked message."""
    try:
        data = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as err:
        raise ChannelError(f"a frame is not JSON ({str(err)[:80]})") from None
    return check(data)


def encode(message: Mapping[str, Any]) -> bytes:
    """A message's frame, checked as the peer will check it."""
    frame = json.dumps(check(dict(message)), separators=(",", ":"), allow_nan=False)
    data = frame.encode() + b"\n"
    if len(data) > MAX_FRAME:
        raise ChannelError(f"{message.get('type')}: a frame of {len(data)} bytes, at most "
                           f"{MAX_FRAME}")
    return data


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address for ``path`` that fits a UNIX socket's 107 bytes: the path itself, or the
    same file through this process' descriptor of its directory."""
    text = os.fsdecode(path)
    if len(os.fsencode(text)) < 100:
        yield text
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


class Channel:
    """One end of a connection: :meth:`send` checks and writes a message; a thread reads
    the peer's frames, checks each and hands it to ``on_message``; ``on_close(reason)`` is
    called once, when the connection ends for any reason (None: closed by this end)."""

    def __init__(self, sock: socket.socket, *, on_message: Callable[[dict[str, Any]], None],
                 on_close: Callable[[str | None], None] | None = None,
                 name: str = "channel", peer: dict[str, Any] | None = None,
                 pending: bytes = b"") -> None:
        self.sock = sock
        self.on_message = on_message
        self.on_close = on_close
        self.name = name
        self.peer: dict[str, Any] = dict(peer or {})   # the peer's hello
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        self._finish_lock = threading.Lock()
        self._reason: str | None = None
        self._buffer = pending   # what came after the peer's hello

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def send(self, kind: str, **fields: Any) -> None:
        """Send one message; :class:`ChannelError` if it breaks the protocol or the peer
        is gone."""
        data = encode({"type": kind, **fields})
        with self._send_lock:
            if self._closed.is_set():
                raise ChannelError(f"{self.name}: the connection is closed")
            try:
                self.sock.sendall(data)
            except OSError as err:
                self._finish(f"the peer is gone ({err.strerror or err})")
                raise ChannelError(f"{self.name}: the peer is gone") from None

    def start(self) -> Channel:
        threading.Thread(target=self._read_loop, name=self.name, daemon=True).start()
        return self

    def close(self) -> None:
        """Say bye and close (idempotent)."""
        if not self._closed.is_set():
            with contextlib.suppress(ChannelError):
                self.send("bye")
        self._finish(None)

    def refuse(self, line: str) -> None:
        """Tell the peer why in one ``error`` line, and close."""
        log.warning("%s: %s", self.name, line)
        with contextlib.suppress(ChannelError):
            self.send("error", line=line[:MAX_TEXT])
        self._finish(line)

    def _finish(self, reason: str | None) -> None:
        with self._finish_lock:   # once, whichever thread sees the end first
            if self._closed.is_set():
                return
            self._closed.set()
        self._reason = reason
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.on_close is not None:
            try:
                self.on_close(reason)
            except Exception:  # noqa: BLE001 - the connection is gone either way
                log.exception("%s: on_close failed", self.name)

    def frames(self) -> Iterator[dict[str, Any]]:
        """The peer's messages as they come, checked; ends when the connection does."""
        buffer, self._buffer = self._buffer, b""
        while not self._closed.is_set():
            newline = buffer.find(b"\n")
            if newline < 0:
                if len(buffer) >= MAX_FRAME:
                    raise ChannelError(f"a frame over {MAX_FRAME} bytes")
                try:
                    chunk = self.sock.recv(min(65536, MAX_FRAME - len(buffer)))
                except OSError as err:
                    if self._closed.is_set():
                        return
                    raise ChannelError(f"the peer is gone ({err.strerror or err})") from None
                if not chunk:
                    if buffer:
                        raise ChannelError("the peer left in the middle of a frame")
                    return
                buffer += chunk
                continue
            line, buffer = buffer[:newline], buffer[newline + 1:]
            yield decode(line)

    def _read_loop(self) -> None:
        try:
            for message in self.frames():
                if message["type"] == "bye":
                    self._finish("the peer said bye")
                    return
                if message["type"] == "error":
                    self._finish(f"the peer refused: {message['line']}")
                    return
                try:
                    self.on_message(message)
                except ChannelError as err:
                    self.refuse(str(err))
                    return
                except Exception:  # noqa: BLE001 - a handler's bug closes this one only
                    log.exception("%s: cannot handle %s", self.name, message["type"])
                    self.refuse(f"the {message['type']} message could not be handled: "
                                f"see the other side's log")
                    return
            self._finish("the peer closed the connection")
        except ChannelError as err:
            self.refuse(str(err))
        except Exception as err:  # noqa: BLE001 - a bug of ours: the connection ends, said
            log.exception("%s: reading", self.name)
            self.refuse(f"a frame could not be read ({type(err).__name__})")


def _send_hello(sock: socket.socket, role: str) -> None:
    sock.sendall(encode({"type": "hello", "version": VERSION, "role": role,
                         "pid": os.getpid()}))


def _read_hello(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """The peer's hello (within :data:`HELLO_TIMEOUT`), its version checked, and what came
    after it; :class:`ChannelError` (the peer's own ``error`` line among them)."""
    sock.settimeout(HELLO_TIMEOUT)
    buffer = b""
    while b"\n" not in buffer:
        if len(buffer) >= MAX_FRAME:
            raise ChannelError(f"a frame over {MAX_FRAME} bytes")
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            raise ChannelError(f"no hello within {HELLO_TIMEOUT:g} s") from None
        except OSError as err:
            raise ChannelError(f"the peer is gone ({err.strerror or err})") from None
        if not chunk:
            raise ChannelError(SILENT)
        buffer += chunk
    line, rest = buffer.split(b"\n", 1)
    hello = decode(line)
    if hello["type"] == "error":
        raise ChannelError(f"refused: {hello['line']}")
    if hello["type"] != "hello":
        raise ChannelError(f"expected hello first, not {hello['type']}")
    if hello["version"] != VERSION:
        raise ChannelError(f"the peer speaks version {hello['version']} of the channel, "
                           f"this side {VERSION}")
    sock.settimeout(None)
    return hello, rest


def peer_uid(sock: socket.socket) -> tuple[int, int]:
    """The connected process' pid and uid, as the kernel says."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


class ChannelServer:
    """The daemon's end: listens at ``<state_dir>/manager.sock``; each peer of this uid that
    says hello as ``workload`` gets a :class:`Channel` whose messages go to
    ``on_message(channel, message)``; ``on_attach(channel)`` and ``on_detach(channel,
    reason)`` say when the workload side comes and goes."""

    def __init__(self, state_dir: str | os.PathLike[str], *,
                 on_message: Callable[[Channel, dict[str, Any]], None],
                 on_attach: Callable[[Channel], None] | None = None,
                 on_detach: Callable[[Channel, str | None], None] | None = None) -> None:
        self.path = Path(state_dir) / SOCKET
        self.on_message, self.on_attach, self.on_detach = on_message, on_attach, on_detach
        self.workload: Channel | None = None
        self.refused = 0   # connections refused (another uid, another version, a bad hello)
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def start(self) -> ChannelServer:
        """Listen (a socket file left by a dead daemon is replaced; a live daemon's is a
        :class:`ChannelError`)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with socket_address(self.path) as address:
            if self.path.exists():
                if _alive(address):
                    listener.close()
                    raise ChannelError(f"{self.path}: another manager daemon serves this "
                                       "state directory")
                self.path.unlink()
            old = os.umask(0o177)
            try:
                listener.bind(address)
            except OSError as err:
                listener.close()
                raise ChannelError(f"{self.path}: cannot listen: {err.strerror or err}") \
                    from None
            finally:
                os.umask(old)
        os.chmod(self.path, 0o600)
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept_loop, name="channel-accept", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and close the workload's connection (it hears ``bye``)."""
        with self._lock:
            listener, self._listener = self._listener, None
            workload = self.workload
        if listener is not None:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if workload is not None:
            workload.close()

    def _accept_loop(self) -> None:
        while True:
            listener = self._listener
            if listener is None:
                return
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._admit, args=(sock,), name="channel-admit",
                             daemon=True).start()

    def _admit(self, sock: socket.socket) -> None:
        pid, uid = peer_uid(sock)
        if uid != os.getuid():   # nothing of a stranger's is read
            self._refuse(sock, pid, f"uid {uid} may not attach to this manager daemon "
                                    f"(uid {os.getuid()})")
            return
        try:
            hello, rest = _read_hello(sock)
            if hello["role"] != "workload":
                raise ChannelError(f"a {hello['role']} cannot attach to a manager daemon")
        except ChannelError as err:
            if str(err) == SILENT:   # a probe (daemon_answers): nothing to refuse
                sock.close()
                return
            self._refuse(sock, pid, str(err))
            return
        channel = Channel(sock, on_message=lambda m: self.on_message(channel, m),
                          on_close=lambda reason: self._detached(channel, reason),
                          name=f"channel-workload-{pid}", peer={**hello, "pid": pid},
                          pending=rest)
        with self._lock:
            current = self.workload
            if self._listener is None:
                self._refuse(sock, pid, "the manager daemon is stopping")
                return
            if current is not None and not current.closed:
                self._refuse(sock, pid, f"another workload (pid {current.peer.get('pid')}) is "
                                        "attached to this manager daemon; stop it first")
                return
            self.workload = channel   # before the hello: stop() closes it from then on
            try:
                _send_hello(sock, "daemon")
            except OSError:
                self.workload = None
                sock.close()
                return
        log.info("channel: the workload side (pid %d) attached", pid)
        if self.on_attach is not None:
            self.on_attach(channel)
        channel.start()

    def _refuse(self, sock: socket.socket, pid: int, line: str) -> None:
        self.refused += 1
        log.warning("channel: refused pid %d: %s", pid, line)
        with contextlib.suppress(OSError, ChannelError):
            sock.sendall(encode({"type": "error", "line": line[:MAX_TEXT]}))
            # the line must reach the peer: what it sent and nobody read would make the
            # close a reset that discards it. Up to 64 KiB within a second, thrown away
            sock.shutdown(socket.SHUT_WR)
            left, until = 65536, time.monotonic() + 1.0
            while left > 0 and time.monotonic() < until:
                sock.settimeout(max(0.01, until - time.monotonic()))
                chunk = sock.recv(min(left, 16384))
                if not chunk:
                    break
                left -= len(chunk)
        sock.close()

    def _detached(self, channel: Channel, reason: str | None) -> None:
        with self._lock:
            if self.workload is channel:
                self.workload = None
            else:
                return
        log.info("channel: the workload side (pid %s) left: %s", channel.peer.get("pid"),
                 reason or "closed by the daemon")
        if self.on_detach is not None:
            self.on_detach(channel, reason)


def _alive(address: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2.0)
        probe.connect(address)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def connect(state_dir: str | os.PathLike[str], *,
            on_message: Callable[[dict[str, Any]], None],
            on_close: Callable[[str | None], None] | None = None) -> Channel:
    """The workload side's end, attached to the daemon of ``state_dir``;
    :class:`ChannelError` with one line if there is none or it refuses."""
    path = Path(state_dir) / SOCKET
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_address(path) as address:
            sock.connect(address)
        _send_hello(sock, "workload")
        hello, rest = _read_hello(sock)
    except OSError as err:
        sock.close()
        raise ChannelError(f"{path}: no manager daemon answers there "
                           f"({err.strerror or err})") from None
    except ChannelError:
        sock.close()
        raise
    return Channel(sock, on_message=on_message, on_close=on_close,
                   name=f"channel-daemon-{hello.get('pid')}", peer=hello,
                   pending=rest).start()


def daemon_answers(state_dir: str | os.PathLike[str]) -> bool:
    """Whether a manager daemon listens on ``state_dir``'s socket (nothing is sent)."""
    path = Path(state_dir) / SOCKET
    if not path.exists():
        return False
    with socket_address(path) as address:
        return _alive(address)
