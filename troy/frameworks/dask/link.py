"""Troy's unit channel, the control's end: units go to a node agent, and their events come
back, on one connection per agent that this process serves (``DaskFramework(unit_channel=
True)``), instead of riding Dask's task path (client -> scheduler -> worker and back: three
hops and a scheduler's graph a unit). Dask keeps membership, data and the Dask users' own
tasks. Frames are :mod:`troy.frameworks.dask.wire`'s.

Who may connect. The framework asks a worker it adopted (or started) to connect, through the
scheduler (``on_node``), giving it this channel's address and a token made for that worker
alone (:meth:`Links.expect`: 32 random bytes, used once, never written anywhere). A
connection is admitted when, within :data:`wire.HELLO_TIMEOUT`, it says hello with such a
token and, under TLS (required when the framework has ``tls``): its certificate is from the
cluster CA, has a member's role (``worker`` or ``control``), is not on the deny list, and
has the common name the worker joined the scheduler with. Anything else is closed with one
log line; connections not yet admitted are capped (:data:`MAX_UNKNOWN`).

What a node may say. Only ``events`` frames, about units sent on its own connection (a key
it was sent and has not ended): an event about any other unit is dropped and counted. Its
``ack`` of a cancel releases only a wait for a cancel sent on its own connection. The
address in every event is the connection's, never the node's word. A frame that is not
plain msgpack data, or too large, closes the connection (its pilot is lost: its units run
elsewhere).
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from troy.frameworks.dask import wire
from troy.frameworks.dask.guard import CONTROL, WORKER, subject

log = logging.getLogger(__name__)

MAX_UNKNOWN = 64   # connections at once that have not said hello yet


class Refused(Exception):
    """A connection that may not carry units."""


@dataclass
class _Link:
    addr: str                       # the worker's address at the scheduler
    writer: asyncio.StreamWriter
    keys: dict[str, str] = field(default_factory=dict)    # key -> unit id, sent, not ended
    by_uid: dict[str, str] = field(default_factory=dict)  # unit id -> its key here
    canceled: set[str] = field(default_factory=set)       # keys taken back: ends ignored
    closing: bool = False           # we close it (no loss to report)
    dropped: int = 0                # events about units it was not sent
    cancels: int = 0                # cancel frames sent (each numbered)
    acked: int = 0                  # the last of them the agent said it carried out
    stalled: bool = False           # a cancel's wait timed out: none waits until an ack


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Links:
    """The channel's listener and its connections, on an event loop of their own.

    ``on_events(addr, events)`` receives each frame's checked events (``[kind, unit id,
    addr, payload, key]``, as the framework's event thread takes them) and ``on_closed(addr,
    why)`` a connection that closed without the framework asking; both are called on the
    channel's loop and must not block."""

    def __init__(self, name: str, host: str, port: int, ssl_context: ssl.SSLContext | None,
                 on_events: Callable[[str, list], None],
                 on_closed: Callable[[str, str], None], deny: Any = None) -> None:
        self.name, self.host, self.port = name, host, port
        self.ssl = ssl_context
        self.on_events, self.on_closed, self.deny = on_events, on_closed, deny
        self.address = ""
        self._lock = threading.Lock()
        self._acked = threading.Condition(self._lock)   # an agent acked a cancel, or left
        self._expected: dict[str, tuple[str, str | None]] = {}  # token -> (addr, CN)
        self._links: dict[str, _Link] = {}
        self._ready: dict[str, threading.Event] = {}
        self._unknown = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle -------------
    def start(self) -> str:
        """Listen; returns ``host:port``."""
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, daemon=True,
                                        name=f"troy-{self.name}-links")
        self._thread.start()
        self.address = asyncio.run_coroutine_threadsafe(self._listen(), loop).result(30)
        return self.address

    async def _listen(self) -> str:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, ssl=self.ssl,
            ssl_handshake_timeout=wire.HELLO_TIMEOUT if self.ssl else None)
        port = self._server.sockets[0].getsockname()[1]
        return _host_port(self.host, port)

    def close(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._loop = None
        with self._lock:   # nothing more goes out: a cancel waiting for its ack stops waiting
            for link in self._links.values():
                link.closing = True
            self._acked.notify_all()

        async def stop() -> None:
            self._server.close()
            for link in list(self._links.values()):
                link.closing = True
                link.writer.close()
            for writer in list(self._writers):   # connections not admitted yet too
                writer.close()
            here = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not here]
            if rest:   # each ends as its connection closes: none left pending
                await asyncio.wait(rest, timeout=5)
        try:
            asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        except Exception as err:  # noqa: BLE001 - closing anyway
            log.info("framework %s: closing the unit channel: %s", self.name, err)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
            if not self._thread.is_alive():
                loop.close()

    # ------------------------------------------------------------ the framework's side --
    def expect(self, addr: str, cn: str | None) -> str:
        """A token for the worker at ``addr`` (with certificate ``cn`` under TLS) to
        connect with, once."""
        token = secrets.token_hex(32)
        with self._lock:
            self._expected[token] = (addr, cn)
            self._ready[addr] = threading.Event()
        return token

    def wait(self, addr: str, timeout: float) -> bool:
        ready = self._ready.get(addr)
        return ready is not None and ready.wait(timeout)

    def connected(self, addr: str) -> bool:
        link = self._links.get(addr)
        return link is not None and not link.closing

    def send_units(self, addr: str, items: list[list]) -> bool:
        """Send ``[[key, unit id, description, sandbox], ...]`` to the agent at ``addr``;
        False if it has no open connection."""
        link = self._links.get(addr)
        loop = self._loop
        if link is None or link.closing or loop is None:
            return False
        with self._lock:
            for item in items:
                link.keys[item[0]] = item[1]
                link.by_uid[item[1]] = item[0]
        loop.call_soon_threadsafe(link.writer.write, wire.pack(["units", items]))
        return True

    def cancel(self, addr: str | None, unit_ids: list[str], wait: float = 0.0) -> bool:
        """Take units back from the agent at ``addr``: queued, they never start; running,
        their processes are killed; whatever it says of them from now on is ignored.
        ``wait``: seconds to wait for the agent to say it did (a cancel is then over before
        this returns: a queued unit cannot start after it, whatever ends meanwhile on the
        node); True when it said so, or when its connection is gone (its units with it)."""
        link = self._links.get(addr) if addr else None
        loop = self._loop
        if link is None or loop is None or not unit_ids:
            return True
        with self._lock:
            for uid in unit_ids:
                key = link.by_uid.pop(uid, None)
                if key is not None:
                    link.keys.pop(key, None)
                    link.canceled.add(key)
            if link.closing:
                return True
            link.cancels += 1
            seq = link.cancels
            loop.call_soon_threadsafe(link.writer.write, wire.pack(["cancel", unit_ids, seq]))
            if wait <= 0 or link.stalled:   # (an agent that stopped answering: no wait)
                return not link.stalled
            done = self._acked.wait_for(
                lambda: link.acked >= seq or link.closing or self._links.get(addr) is not link,
                wait)
            if not done:
                link.stalled = True
        if not done:
            log.warning("framework %s: worker %s did not confirm a cancel within %.0f s (its "
                        "cancels do not wait until it answers)", self.name, link.addr, wait)
        return done

    def keys(self, addr: str) -> set[str]:
        """The keys of the units sent to ``addr`` that have not ended there."""
        link = self._links.get(addr)
        with self._lock:
            return set(link.keys) if link is not None else set()

    def unit_ids(self, addr: str) -> list[str]:
        """The units sent to ``addr`` that have not ended there, in the order sent."""
        link = self._links.get(addr)
        with self._lock:
            return list(link.by_uid) if link is not None else []

    def drop(self, addr: str) -> None:
        """Close ``addr``'s connection (its pilot is going away): no loss is reported."""
        link = self._links.get(addr)
        loop = self._loop
        if link is None or loop is None:
            return
        with self._lock:
            link.closing = True
            self._acked.notify_all()

        def bye() -> None:
            link.writer.write(wire.pack(["bye"]))
            link.writer.close()
        loop.call_soon_threadsafe(bye)

    # ------------------------------------------------------------ connections -----------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self._unknown >= MAX_UNKNOWN:
            writer.close()
            return
        self._unknown += 1
        self._writers.add(writer)
        link, why = None, "closed"
        try:
            try:
                hello = await asyncio.wait_for(_frame(reader, wire.HELLO_MAX),
                                               wire.HELLO_TIMEOUT)
            finally:
                self._unknown -= 1
            link = self._admit(hello, writer)
            writer.write(wire.pack(["ok"]))
            while True:
                frame = await _frame(reader, wire.MAX_FRAME)
                if frame is None:
                    break
                self._take(link, frame)
        except (wire.BadFrame, Refused) as err:
            why = str(err)
            log.warning("framework %s: unit channel from %s%s closed: %s", self.name, peer,
                        f" (worker {link.addr})" if link else "", why)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as err:
            why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        finally:
            writer.close()
            self._writers.discard(writer)
            if link is not None:
                self._gone(link, why)

    def _admit(self, hello: list | None, writer: asyncio.StreamWriter) -> _Link:
        if hello is None or len(hello) != 2 or hello[0] != "hello" \
                or not isinstance(hello[1], str):
            raise Refused("no hello")
        with self._lock:
            expected = self._expected.get(hello[1])
        if expected is None:
            raise Refused("an unknown token")
        addr, want_cn = expected
        if self.ssl is not None:
            cert = writer.get_extra_info("peercert")
            cn, role = subject(cert)
            if role not in (WORKER, CONTROL):
                raise Refused(f"its certificate has no member's role ({role})")
            if want_cn is not None and cn != want_cn:
                raise Refused(f"its certificate ({cn}) is not the worker's ({want_cn})")
            if self.deny is not None:
                from troy.frameworks.dask.denylist import serial_of
                if self.deny.denied(serial_of(cert)):
                    raise Refused("its certificate is on the deny list")
        link = _Link(addr, writer)
        with self._lock:
            if self._expected.pop(hello[1], None) is None:
                raise Refused("a token used already")
            old = self._links.get(addr)
            self._links[addr] = link
            ready = self._ready.get(addr)
            self._acked.notify_all()   # a cancel waiting on the old one: it goes
        if old is not None:
            old.closing = True
            old.writer.close()
        if ready is not None:
            ready.set()
        return link

    def _take(self, link: _Link, frame: list) -> None:
        if frame[0] != "events" or len(frame) != 2 or not isinstance(frame[1], list):
            raise wire.BadFrame(f"a {frame[0]!r} frame from a node")
        out, dropped = [], 0
        with self._lock:
            for ev in frame[1]:
                if not (isinstance(ev, list) and len(ev) == 4 and ev[0] in ("run", "end", "ack")
                        and isinstance(ev[1], str) and isinstance(ev[3], str)):
                    raise wire.BadFrame("an event that is not [kind, unit, payload, key]")
                kind, uid, payload, key = ev
                if kind == "ack":   # its cancel numbered ``payload`` is carried out
                    if not isinstance(payload, int) or isinstance(payload, bool):
                        raise wire.BadFrame("an ack that does not number a cancel")
                    if link.acked < payload <= link.cancels:
                        link.acked = payload
                        link.stalled = False
                        self._acked.notify_all()
                    continue
                if link.keys.get(key) != uid:
                    if key not in link.canceled:
                        dropped += 1
                    continue
                if kind == "end":
                    del link.keys[key]
                    link.by_uid.pop(uid, None)
                out.append([kind, uid, link.addr, payload, key])
        if dropped:
            link.dropped += dropped
            log.warning("framework %s: dropped %d event(s) of worker %s about units it was "
                        "not sent", self.name, dropped, link.addr)
        if out:
            self.on_events(link.addr, out)

    def _gone(self, link: _Link, why: str) -> None:
        with self._lock:
            if self._links.get(link.addr) is link:
                del self._links[link.addr]
            self._acked.notify_all()   # a cancel waiting on it: its units went with it
        if not link.closing:
            self.on_closed(link.addr, why)


async def _frame(reader: asyncio.StreamReader, limit: int) -> list | None:
    try:
        header = await reader.readexactly(wire.HEADER.size)
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise wire.BadFrame("the connection closed inside a frame") from None
    return wire.unpack(await reader.readexactly(wire.length(header, limit)))
