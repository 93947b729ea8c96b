"""Troy's unit channel, the node's end (:mod:`troy.frameworks.dask.link` is the control's):
the worker's connection to the framework, the units it was sent, and their events.

The framework asks the worker (``on_node``, through the scheduler) to run :func:`open_link`
with the channel's address and a token for this worker. The worker connects from its own
event loop, with its own certificate under TLS, and requires the other end's certificate
to be from the cluster CA with the ``control`` role (a member of the cluster cannot pose
as the framework). Units arrive in ``units`` frames and queue here; they start in order as
the node's cores free up (the framework sends at most the pilot's size and backlog), each
in a thread of the worker's, through the same :func:`agent.run_tracked` as units that come
as Dask tasks (so ``kill_unit``, the worker's shutdown and walltimes treat both alike).
Their ``run`` and ``end`` events go back in one ``events`` frame per loop turn: at once when
quiet, batched under load. A ``cancel`` frame drops queued units and kills running ones,
then is acked (the control's cancel returns once it was carried out); a closed connection
(the framework went away) does both to all of them.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack

from troy.descriptions import ComputeUnitDescription
from troy.frameworks.dask import agent, wire
from troy.frameworks.dask.guard import CONTROL, subject

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 15.0
BATCH_BYTES = 8 * 1024 * 1024   # an events frame holds about this much at most
_links: dict[str, _AgentLink] = {}   # worker address -> its link (one at a time)


def _description(desc: Any) -> ComputeUnitDescription:
    """A unit's description as the control sent it (:func:`description_to_wire`)."""
    kind, body = desc
    if kind == "pickle":
        from distributed.protocol.pickle import loads
        return loads(body)   # the control's: a node decodes what the control sent
    fields = msgpack.unpackb(body, raw=False)
    fields["bundle"] = [ComputeUnitDescription.checked(m) for m in fields.get("bundle", ())]
    return ComputeUnitDescription.checked(fields)


def description_to_wire(cud: ComputeUnitDescription) -> list:
    """``["fields", msgpack of its fields]`` when msgpack carries them all (packed once,
    here), else ``["pickle", Dask's pickle of it]`` (a unit that runs a function)."""
    if cud.function is None and not any(m.function is not None for m in cud.bundle):
        try:
            # the fields that differ from their defaults: the node fills in the rest
            return ["fields", msgpack.packb(cud.to_dict(defaults=False), use_bin_type=True)]
        except (TypeError, ValueError, OverflowError):
            pass
    from distributed.protocol.pickle import dumps
    return ["pickle", dumps(cud)]


class _AgentLink:
    def __init__(self, worker: Any, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.worker, self.reader, self.writer = worker, reader, writer
        self.loop = asyncio.get_running_loop()
        cores = int(worker.state.total_resources.get("cores", 0) or worker.state.nthreads)
        self.cores = self.free = max(1, cores)
        self.queue: deque[tuple[str, str, ComputeUnitDescription, str | None, int]] = deque()
        self.running: set[str] = set()
        # an attempt of a unit whose earlier attempt still ends here (canceled, being
        # killed): it starts once that one has ended (the agent knows a unit by its id)
        self.deferred: dict[str, tuple[str, str, ComputeUnitDescription, str | None, int]] = {}
        self.pool = ThreadPoolExecutor(max_workers=self.cores, thread_name_prefix="troy-unit")
        self.pending: list[bytes] = []
        self.flushing = False
        self.closed = False

    async def serve(self) -> None:
        try:
            while True:
                frame = await _read(self.reader)
                if frame is None or frame[0] == "bye":
                    break
                if frame[0] == "units":
                    self._queue(frame[1])
                elif frame[0] == "cancel":
                    self._cancel(frame[1])
                    if len(frame) > 2:   # numbered: the control waits for this ack
                        self._add(["ack", "", frame[2], ""])
        except (OSError, wire.BadFrame, asyncio.IncompleteReadError) as err:
            log.warning("troy unit channel to %s: %s", self.worker.scheduler.address, err)
        finally:
            self.close()

    def close(self) -> None:
        """Drop what is queued, kill what runs (nobody hears of them any more)."""
        if self.closed:
            return
        self.closed = True
        self.queue.clear()
        self.deferred.clear()
        for uid in list(self.running):
            agent.kill_unit(uid)
        self.writer.close()
        self.pool.shutdown(wait=False)
        if _links.get(self.worker.address) is self:
            del _links[self.worker.address]

    def _queue(self, items: list) -> None:
        for key, uid, desc, sandbox in items:
            try:
                cud = _description(desc)
            except Exception as err:  # noqa: BLE001 - e.g. its function's module is not here
                self._add(["end", uid, agent.result_to_wire(agent.UnitResult(
                    error=f"the node could not read the unit: {type(err).__name__}: {err}")),
                    key])
                continue
            self.queue.append((key, uid, cud, sandbox, min(self.cores, cud.cores)))
        self._start()

    def _start(self) -> None:
        """On the loop: start queued units, in order, while their cores are free."""
        while self.queue and not self.closed and self.queue[0][4] <= self.free:
            item = self.queue.popleft()
            if item[1] in self.running:
                self.deferred[item[1]] = item
                continue
            self.free -= item[4]
            self.running.add(item[1])
            self.pool.submit(self._run, item)

    def _cancel(self, unit_ids: list) -> None:
        """Queued: dropped; running: killed (canceled until its attempt here ended, so a
        later attempt of the same unit sent here again runs)."""
        gone = set(unit_ids)
        self.queue = deque(i for i in self.queue if i[1] not in gone)
        for uid in gone:
            self.deferred.pop(uid, None)
        for uid in gone & self.running:
            agent.kill_unit(uid)

    def _run(self, item: tuple) -> None:
        """In a unit thread."""
        key, uid, cud, sandbox, cores = item
        event: list | None = None
        try:
            with _in_worker(self.worker, key):
                result = agent.run_tracked(
                    cud, uid, sandbox, lambda: self._emit(["run", uid, time.time(), key]))
            if result is not None:
                event = ["end", uid, agent.result_to_wire(agent.as_data(result)), key]
        except agent.Stopped:
            pass   # the pilot is going away: the framework moves the unit
        except BaseException as err:  # noqa: BLE001 - the unit fails, the agent serves on
            event = ["end", uid, agent.result_to_wire(agent.UnitResult(
                error=f"the agent could not run it: {type(err).__name__}: {err}")), key]
        finally:
            self.loop.call_soon_threadsafe(self._ended, uid, cores, event)

    def _emit(self, event: list) -> None:
        self.loop.call_soon_threadsafe(self._add, event)

    def _ended(self, uid: str, cores: int, event: list | None) -> None:
        self.running.discard(uid)
        with agent._procs_lock:
            agent._canceled.discard(uid)
        self.free += cores
        if event is not None:
            self._add(event)
        later = self.deferred.pop(uid, None)
        if later is not None:
            self.queue.appendleft(later)
        self._start()

    def _add(self, event: list) -> None:
        if self.closed:
            return
        self.pending.append(msgpack.packb(event, use_bin_type=True))
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """One ``events`` frame for what this loop turn gathered (split when large)."""
        self.flushing = False
        events, self.pending = self.pending, []
        while events and not self.closed:
            size, n = 0, 0
            while n < len(events) and (n == 0 or size + len(events[n]) <= BATCH_BYTES):
                size += len(events[n])
                n += 1
            part, events = events[:n], events[n:]
            packer = msgpack.Packer(use_bin_type=True)
            body = packer.pack_array_header(2) + packer.pack("events") \
                + packer.pack_array_header(len(part)) + b"".join(part)
            self.writer.write(wire.HEADER.pack(len(body)) + body)


@contextlib.contextmanager
def _in_worker(worker: Any, key: str) -> Iterator[None]:
    """As in a Dask task of ``worker``: a unit's function may call ``get_worker()`` (and
    Dask's other helpers) as it does where units are Dask tasks."""
    try:
        from distributed.worker import _worker_cvar, set_thread_state
    except ImportError:  # another Distributed: functions cannot ask for their worker
        yield
        return
    with set_thread_state(start_time=time.time(), execution_state=worker.execution_state,
                          key=key):
        token = _worker_cvar.set(worker)
        try:
            yield
        finally:
            _worker_cvar.reset(token)


async def _read(reader: asyncio.StreamReader) -> list | None:
    try:
        header = await reader.readexactly(wire.HEADER.size)
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise
    # the control's frames: units (a bundle's members, maybe pickled functions) are large
    return wire.unpack(await reader.readexactly(wire.length(header, 1 << 31)))


def _context(worker: Any) -> ssl.SSLContext | None:
    security = getattr(worker, "security", None)
    if security is None or not getattr(security, "require_encryption", False):
        return None
    return security.get_connection_args("worker").get("ssl_context")


async def open_link(address: str, token: str, dask_worker: Any = None) -> None:
    """On a worker (the framework's ``on_node``): connect to the unit channel at
    ``address`` with ``token`` and serve the units it sends, replacing an earlier link."""
    host, _, port = address.rpartition(":")
    ctx = _context(dask_worker)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host.strip("[]"), int(port), ssl=ctx,
                                server_hostname=host.strip("[]") if ctx else None),
        CONNECT_TIMEOUT)
    try:
        if ctx is not None:
            _, role = subject(writer.get_extra_info("peercert"))
            if role != CONTROL:
                raise ConnectionError(f"{address} is not the framework's (its certificate's "
                                      f"role is {role})")
        writer.write(wire.pack(["hello", token]))
        ok = await asyncio.wait_for(_read(reader), CONNECT_TIMEOUT)
        if ok != ["ok"]:
            raise ConnectionError(f"{address} did not accept this worker")
    except BaseException:
        writer.close()
        raise
    old = _links.get(dask_worker.address)
    link = _links[dask_worker.address] = _AgentLink(dask_worker, reader, writer)
    if old is not None:
        old.close()
    asyncio.ensure_future(link.serve())


def close_links() -> None:
    """The worker is leaving: every link closes (its units are killed by the caller)."""
    for link in list(_links.values()):
        link.closed = True
        link.writer.close()
    _links.clear()
