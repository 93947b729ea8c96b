"""The guard: what a cluster member may ask of the scheduler and of a worker, by its role.

With mutual TLS (``tls``) every connection carries the peer's certificate, and every cluster
certificate carries its member's role as the subject's organizational unit (OU):
``control`` (the control node: the scheduler, Troy's client, the user's client) or
``worker`` (a node's pilot agent). The guard, installed on the scheduler ``DaskFramework``
starts and on every worker ``agent._start_worker`` starts, reads the role of each incoming
connection from the certificate Dask's TLS comm exposes (``comm.extra_info["peercert"]``)
and checks every message read on it, before Dask dispatches it:

- ``control``: everything (unchecked, apart from the versions of a joining worker).
- ``worker``, at the scheduler: only what a worker needs (``SCHEDULER_RPC_FROM_WORKER``, and
  on its worker stream ``SCHEDULER_STREAM_FROM_WORKER``); it registers one worker a
  certificate, with its cores as its only resource (Troy's tags are granted from the
  control); the ops naming a worker
  (heartbeats, resources, retiring) only for workers registered with the same certificate's
  common name; a worker stream message may not name a worker (Dask adds the stream's own).
  A worker's events: none on topic ``all``, and a Troy framework's only about its own
  units; a task's outcome (``task-finished``, ``task-erred``) counts only from the worker
  the scheduler runs it on, and ``add-keys`` only for inputs of tasks running there or
  copies the scheduler asked that worker to make (a retiring worker's data moving to the
  others; the rest goes no further, one line a peer). No client: ``register-client``,
  ``update-graph``, ``run_function``, ``broadcast``, ``scatter``, plugins, dumps... are
  refused.
- ``worker``, at a worker: only Dask's own data transfer between workers
  (``WORKER_RPC_FROM_WORKER``: ``get_data``, and P2P shuffle's transfers when present).
- any other certificate (no OU, another OU): nothing.

Nothing a peer without the ``control`` role sends is unpickled in the scheduler's process
(the control process: the CloudLab key, the cluster CA), on the connections it opens as on
those the scheduler opens to workers (``broadcast``, ``gather``: their answers are decoded
the same way). Dask's decoder unpickles every
``__Pickled__`` field (``ToPickle``) while it reads a message, before any handler, or a check
of the decoded message, sees it: on such a peer's connection the scheduler's guard decodes
the frames itself (:func:`strict_loads`): a pickle anywhere in a message closes the
connection before anything of it is decoded, and ``__Serialized__`` fields stay serialized
(``Serialized``), as Dask's scheduler keeps them anyway. Nor does anything of a node reach Troy's client
serialized, where it would be decoded: a worker-role peer's requests and its events carry
plain data only (a ``Serialized`` field refuses the request, or closes the stream: Dask's
own workers send none), and the exception of a Troy unit's ``task-erred`` becomes one the
scheduler makes from the node's text (``NodeError``). Dask users' tasks keep Dask's
semantics (their client decodes their workers' exceptions and results). Workers decode as
Dask does: the data Dask moves between workers (a dependency's value, P2P shuffle shards) is pickled, and a
node takes its peers' data as Dask's workers do.

A certificate on the scheduler's deny list (:mod:`troy.frameworks.dask.denylist`: the
certificates of a node that left, refused before they expire) gets nothing: its connections
are closed as they come, and those open when it is denied within a second (its worker with
them: Dask removes it).

Default deny: an op not listed is refused. A refused request gets an error answer
(``PermissionError``) when it asked for one, otherwise its connection is closed; a refused
message on a stream closes the stream. Each refusal is one log line (WARNING, logger
``troy.frameworks.dask.guard``) naming the peer's common name, its role and the op.

Versions: a worker whose Troy, Dask or distributed version differs from the scheduler's is
refused when it registers (one log line naming both; the worker gets the same message and
leaves), whatever its role. Workers say their Troy version in their startup information
(``VERSION_KEY``), which :func:`startup_information` gives.

Without TLS there is no certificate and no guard (anyone who reaches the scheduler is a
full member, as before).
"""
from __future__ import annotations

import contextvars
import functools
import logging
import os
import weakref
from typing import Any

from troy.frameworks.dask.denylist import ENV_VAR as DENY_ENV_VAR
from troy.frameworks.dask.denylist import DenyList, serial_of

log = logging.getLogger(__name__)

CONTROL, WORKER = "control", "worker"
VERSION_KEY = "troy-version"   # in a worker's startup information (register-worker "extra")

# Ops a worker-role peer may send the scheduler (found by running real workers: joining,
# heartbeats, fetching dependencies, Troy's tags, leaving).
SCHEDULER_RPC_FROM_WORKER = frozenset({
    "register-worker",    # joining (then the worker stream below)
    "heartbeat_worker",   # its own heartbeats
    "who_has",            # where its tasks' dependencies are
    "retire_workers",     # leaving gracefully (itself only)
    "unregister",         # leaving (itself only)
})
# ... and on the stream that register-worker opens
SCHEDULER_STREAM_FROM_WORKER = frozenset({
    "task-finished", "task-erred", "release-worker-data", "add-keys", "long-running",
    "reschedule", "keep-alive", "log-event", "worker-status-change",
    "request-refresh-who-has", "steal-response", "missing-data", "close-stream",
})
# Ops a worker-role peer may send another worker: Dask's own data transfer
WORKER_RPC_FROM_WORKER = frozenset({
    "get_data",                                   # a task's dependency held there
    "shuffle_receive", "shuffle_inputs_done",     # P2P shuffle/rechunk transfers
})
STREAM_STARTS = frozenset({"register-worker", "register-client", "connection_stream"})
# scheduler ops whose argument names workers: a worker-role peer only for its own workers
# (not set_resources: Troy sets a worker's tags at the scheduler from the control; a worker
# setting its own could grant itself a framework's tag and receive its units)
_BOUND = {"heartbeat_worker": "address", "retire_workers": "workers", "unregister": "address"}


#: set while a guarded peer's message is read: the TCP comm decodes it by :func:`strict_loads`
_STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("troy_guard_strict",
                                                               default=False)


class PickleRefused(Exception):
    """A message of a peer without the control role carried a pickle (not decoded)."""


def strict_loads(frames: list[Any]) -> Any:
    """Dask's message decoding (``distributed.protocol.loads`` with ``deserialize=False``)
    that refuses pickles: a ``__Pickled__`` field raises :class:`PickleRefused` before any
    of it is read; ``__Serialized__`` fields become ``Serialized`` objects, opaque bytes
    that Dask's scheduler passes on without decoding."""
    import msgpack
    from distributed.protocol import core

    def hook(obj: dict[Any, Any]) -> Any:
        if obj.get("__Pickled__", 0):
            raise PickleRefused("a pickle (ToPickle): not decoded")
        offset = obj.get("__Serialized__", 0)
        if offset > 0:
            header = msgpack.loads(frames[offset], object_hook=core.msgpack_decode_default,
                                   use_list=False, **core.msgpack_opts)
            offset += 1
            count = header["num-sub-frames"]
            if not isinstance(count, int) or count < 0 or offset + count > len(frames):
                raise ValueError("a serialized field names frames the message does not have")
            return core.Serialized(header, frames[offset:offset + count])
        return core.msgpack_decode_default(obj)

    return msgpack.loads(frames[0], object_hook=hook, use_list=False, **core.msgpack_opts)


def _strict_decoding() -> None:
    """Make the TCP/TLS comms' frame decoding strict while :data:`_STRICT` is set (once per
    process; Dask's own decoding otherwise)."""
    from distributed.comm import tcp
    if getattr(tcp.from_frames, "_troy_strict", False):
        return
    dask_from_frames = tcp.from_frames

    async def from_frames(frames: list[Any], deserialize: bool = True,
                          deserializers: Any = None, allow_offload: bool = True) -> Any:
        if _STRICT.get():
            return strict_loads(frames)
        return await dask_from_frames(frames, deserialize=deserialize,
                                      deserializers=deserializers,
                                      allow_offload=allow_offload)

    from_frames._troy_strict = True  # type: ignore[attr-defined]
    tcp.from_frames = from_frames


def subject(peercert: dict | None) -> tuple[str | None, str | None]:
    """(common name, role: the organizational unit) of a certificate as
    ``SSLSocket.getpeercert()`` shows it (Nones: no certificate, or no such field)."""
    cn = role = None
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                cn = str(value)
            elif key == "organizationalUnitName":
                role = str(value)
    return cn, role


def peer_identity(comm: Any) -> tuple[str | None, str | None]:
    """(common name, role) of the certificate the peer of ``comm`` presented."""
    return subject((getattr(comm, "extra_info", None) or {}).get("peercert"))


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """This process's Troy, Dask and distributed versions."""
    import dask
    import distributed
    return {"troy": troy_version(), "dask": str(dask.__version__),
            "distributed": str(distributed.__version__)}


@functools.lru_cache(maxsize=1)
def troy_version() -> str:
    """Troy's version: its distribution's version and a digest of its sources
    (``0.1.0+src.1a2b3c4d5e6f``), so that a node running other Troy code is told apart
    even when the version number is the same (a development tree, a copied package)."""
    import hashlib
    import importlib.metadata as md
    from pathlib import Path
    import troy
    number = "unknown"
    for dist in ("troy", "elasticslice"):   # Troy ships in elasticslice's distribution
        try:
            number = md.version(dist)
            break
        except Exception:  # not installed so (a copied package): the digest compares
            continue
    digest = hashlib.sha256()
    root = Path(troy.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return f"{number}+src.{digest.hexdigest()[:12]}"


def startup_information() -> dict[str, Any]:
    """``Worker(startup_information=...)``: the worker tells its Troy version when it
    registers (Dask sends its own and distributed's already)."""
    return {VERSION_KEY: lambda _worker: troy_version()}


def _their_versions(msg: dict[str, Any]) -> dict[str, str]:
    packages = ((msg.get("versions") or {}).get("packages") or {})
    extra = msg.get("extra") or {}
    return {"troy": str(extra.get(VERSION_KEY) or "unknown"),
            "dask": str(packages.get("dask") or "unknown"),
            "distributed": str(packages.get("distributed") or "unknown")}


def _same(v: dict[str, str]) -> tuple[str, str, str]:
    """What must be equal: Troy's sources (its version number may be missing from a copied
    package), Dask's and distributed's versions."""
    return (v["troy"].rpartition("+")[2], v["dask"], v["distributed"])


def _show(v: dict[str, str]) -> str:
    return ", ".join(f"{k} {v[k]}" for k in ("troy", "dask", "distributed"))


def _count(value: Any) -> bool:
    """Whether ``value`` is a count of cores a worker may say it has."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and 0 < value < 1 << 20


#: a run_id no task has (Dask counts from 1): an outcome carrying it is a stale run's
STALE_RUN = -1
TROY_TASK_PREFIX = "troy-unit-"   # the Dask keys of Troy's units (DaskFramework)
MAX_TEXT = 4000                   # a node's error text carried in a NodeError, at most


class Refused(Exception):
    pass


class NodeError(RuntimeError):
    """A Troy unit's task failed on its node: the node's own text of it (the scheduler
    never passes a node's serialized exception on to Troy)."""


def _serialized_in(obj: Any, depth: int = 0) -> bool:
    """Whether a decoded message holds a ``Serialized`` (or anything but plain data)."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return False
    if depth > 32:
        return True
    if isinstance(obj, (list, tuple)):
        return any(_serialized_in(v, depth + 1) for v in obj)
    if isinstance(obj, dict):
        return any(_serialized_in(k, depth + 1) or _serialized_in(v, depth + 1)
                   for k, v in obj.items())
    return True


def _node_error(msg: dict[str, Any]) -> Any:
    """The exception (serialized here) a node's ``task-erred`` of a Troy unit becomes."""
    from distributed.protocol.serialize import Serialize
    text = msg.get("exception_text")
    text = text[:MAX_TEXT] if isinstance(text, str) else "an error it did not describe"
    return Serialize(NodeError(f"the unit's task failed on its node: {text}"))


MAX_ASKED = 100_000   # keys a worker was asked to copy that the guard remembers


class Guard:
    """The guard of one server (``kind``: ``"scheduler"`` or ``"worker"``); see the module."""

    def __init__(self, server: Any, kind: str, deny: DenyList | None = None) -> None:
        self.server, self.kind = server, kind
        self.deny = deny
        self._deny_seen: Any = None                 # the deny list's version last swept
        self._peers: weakref.WeakSet[_Peer] = weakref.WeakSet()
        self.denied = 0                             # connections of denied certificates
        self._denied_seen: set[int | None] = set()
        self._handle = server.handle_comm
        self.workers_of: dict[str, set[str]] = {}   # worker-role CN -> addresses registered
        #: worker address -> keys the scheduler asked it to copy (``acquire-replicas``:
        #: the Active Memory Manager, as a retiring worker's data moves to the others)
        self.asked: dict[str, set[Any]] = {}
        self.refusals = 0
        self.dropped = 0                            # Troy events not from their task's worker
        self._dropped_from: set[str | None] = set()
        self._said: set[str] = set()

    def handle_comm(self, comm: Any) -> Any:
        cn, role = peer_identity(comm)
        peer = _Peer(self, comm, cn, role, strict=self.kind == "scheduler")
        if role == CONTROL and self.kind == "worker":
            return self._handle(comm)     # the scheduler and control clients: unchecked
        if self.deny is not None and self.deny.denied(peer.serial):
            self._deny(peer)
            return _nothing()
        comm.read = peer.read
        self._peers.add(peer)
        return self._handle(comm)

    def _deny(self, peer: _Peer) -> None:
        # INFO, once a certificate: a node given back retries until the CM stops it
        self.denied += 1
        first = peer.serial not in self._denied_seen and len(self._denied_seen) < 4096
        if first:
            self._denied_seen.add(peer.serial)
        log.log(logging.INFO if first else logging.DEBUG,
                "troy guard (%s): refused a connection of %s (role %s, %s): its certificate "
                "was revoked (serial %X)%s", self.kind, peer.cn or "no common name",
                peer.role or "none", peer.address, peer.serial or 0,
                "" if not first else "; its further connections: DEBUG")
        peer.comm.abort()

    def sweep(self) -> int:
        """Close the open connections whose certificate was denied since the last sweep
        (the scheduler runs this every second); how many."""
        if self.deny is None:
            return 0
        version = self.deny.version()
        if version == self._deny_seen:
            return 0
        self._deny_seen = version
        closing = [p for p in list(self._peers)
                   if p.role != CONTROL and self.deny.denied(p.serial)]
        for peer in closing:
            self._peers.discard(peer)
            self._deny(peer)
        return len(closing)

    # ---------------------------------------------------------------- checks ----------
    def check_rpc(self, peer: _Peer, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if peer.role == CONTROL:
            if op == "register-worker" and self.kind == "scheduler":
                self._check_versions(peer, msg)
            return
        if peer.role != WORKER:
            raise Refused(f"{op!r}: not a cluster member (certificate without a role)")
        allowed = SCHEDULER_RPC_FROM_WORKER if self.kind == "scheduler" \
            else WORKER_RPC_FROM_WORKER
        if op not in allowed:
            raise Refused(f"{op!r}: not a worker's operation")
        if self.kind != "scheduler":
            return
        if _serialized_in(msg):
            raise Refused(f"{op!r} with a serialized object: a worker's request carries "
                          f"plain data only")
        if op == "register-worker":
            self._check_versions(peer, msg)
            resources = msg.get("resources") or {}
            granted = sorted(str(k) for k in resources if k != "cores") \
                if isinstance(resources, dict) else [repr(resources)]
            if granted or resources and not _count(resources.get("cores")):
                raise Refused(f"'register-worker' with resources {resources!r}: a node's "
                              f"worker has its cores only (Troy grants its tags)")
            address = str(msg.get("address"))
            live = getattr(self.server, "workers", {})
            others = sorted(a for a in self.workers_of.get(peer.cn or "", ()) if a != address
                            and a in live)
            if others:   # a rebooted node's agent joins once its old worker is gone
                raise Refused(f"'register-worker' at {address}: this certificate's worker "
                              f"is {others[0]}; one worker a node certificate")
            peer.worker = address
            self.workers_of.setdefault(peer.cn or "", set()).add(address)
            return
        arg = _BOUND.get(op)
        if arg is not None:
            value = msg.get(arg)
            named = value if isinstance(value, (list, tuple, set)) else [value]
            own = self.workers_of.get(peer.cn or "", set())
            if "names" in msg and msg["names"] is not None or not named \
                    or not all(isinstance(a, str) and a in own for a in named):
                raise Refused(f"{op!r}: for a worker of another member ({arg}={value!r})")

    def check_stream(self, peer: _Peer, msg: Any) -> None:
        if peer.role == CONTROL:
            return
        if peer.role != WORKER or self.kind != "scheduler" or peer.stream != "register-worker":
            raise Refused(f"stream {peer.stream!r}: not a worker's stream")
        for m in (msg if isinstance(msg, (list, tuple)) else (msg,)):
            if m == "OK":
                continue
            op = m.get("op") if isinstance(m, dict) else None
            if op not in SCHEDULER_STREAM_FROM_WORKER:
                raise Refused(f"{op!r} on its worker stream: not a worker's operation")
            if "worker" in m:
                raise Refused(f"{op!r} on its worker stream names a worker "
                              f"({m['worker']!r})")
            if op == "log-event":
                if _serialized_in(m):
                    raise Refused("'log-event' with a serialized object: a worker's events "
                                  "are plain data")
                kept = self._check_event(peer, m.get("topic"), m.get("msg"))
                if kept is not None:
                    m["msg"] = kept
            elif op in ("task-finished", "task-erred"):
                key = m.get("key")
                if self._foreign_outcome(peer.worker, key):
                    # Dask takes an outcome whose run_id matches from any worker: this one
                    # goes its stale path instead (ignored; a result's sender is told to
                    # free it), as for a run the scheduler moved elsewhere
                    m["run_id"] = STALE_RUN
                    self._dropped(peer, 1, key, f"{op}: its task is not running there")
                if op == "task-erred" and isinstance(key, str) \
                        and key.startswith(TROY_TASK_PREFIX):
                    # Troy's client would decode the node's exception (and traceback)
                    m["exception"], m["traceback"] = _node_error(m), None
                elif op == "task-finished" and _serialized_in(m):
                    raise Refused("'task-finished' with a serialized object")
            elif op == "add-keys":
                keys = m.get("keys")
                keys = keys if isinstance(keys, (list, tuple)) else ()
                own = [k for k in keys if self._fetched_for(peer.worker, k)]
                if len(own) != len(keys) or not isinstance(m.get("keys"), (list, tuple)):
                    m["keys"] = own
                    self._dropped(peer, len(keys) - len(own), next(
                        (k for k in keys if k not in own), None),
                        "add-keys: not an input of a task running there")

    def _check_event(self, peer: _Peer, topic: Any, msg: Any) -> Any:
        """A worker's events: none on the cluster's own topic ("all": workers joining and
        leaving), and a Troy framework's events (``["batch", [[kind, unit, address, ...,
        key], ...]]``) only about units on itself. Returns the message to pass on (None:
        ``msg`` as it is): a Troy event whose Dask task (``key``, last) is not running on
        the sender is dropped, with one line a peer, since a unit's events count only
        from the worker the scheduler runs its task on (a late event of a task canceled
        meanwhile is dropped too: nothing waits for it)."""
        topics = topic if isinstance(topic, (list, tuple)) else [topic]
        if "all" in topics:
            raise Refused("'log-event' on topic 'all': not a worker's event")
        if not any(isinstance(t, str) and t.startswith("troy-") for t in topics):
            return None
        events = msg[1] if isinstance(msg, (list, tuple)) and len(msg) == 2 \
            and msg[0] == "batch" and isinstance(msg[1], (list, tuple)) else None
        if events is None or not all(isinstance(e, (list, tuple)) and len(e) > 2
                                     and e[2] == peer.worker for e in events):
            raise Refused(f"'log-event' on topic {topic!r}: about units of another worker")
        kept, bad = [], []
        for e in events:
            (kept if len(e) > 4 and self._runs_task(peer.worker, e[4]) else bad).append(e)
        if not bad:
            return None
        one = bad[0]
        self._dropped(peer, len(bad), f"unit {str(one[1])[:80]}",
                      "event without its task" if len(one) < 5 else
                      f"event for task {str(one[4])[:80]!r}, not running there")
        return ["batch", kept]

    def _task(self, key: Any) -> Any:
        """The scheduler's state of task ``key`` (None: none, or not a key)."""
        try:
            return self.server.tasks.get(key)
        except (AttributeError, TypeError):  # not a scheduler; an unhashable "key"
            return None

    def _runs_task(self, worker: str | None, key: Any) -> bool:
        """Whether the scheduler runs task ``key`` on ``worker`` now."""
        on = getattr(self._task(key), "processing_on", None)
        return on is not None and on.address == worker

    def _foreign_outcome(self, worker: str | None, key: Any) -> bool:
        """Whether Dask would take an outcome of task ``key`` from ``worker`` that is not
        its to give: the task runs on another worker, or is in memory elsewhere only. (A
        task Troy released on its unit's ``end`` event, or one canceled, is no more there:
        Dask tells the sender to free it, as it should.)"""
        ts = self._task(key)
        if ts is None:
            return False
        if ts.state == "processing":
            on = ts.processing_on
            return on is None or on.address != worker
        if ts.state == "memory":
            return worker not in {ws.address for ws in ts.who_has or ()}
        return False

    def _fetched_for(self, worker: str | None, key: Any) -> bool:
        """Whether ``worker`` may hold a copy of ``key``: an input of a task the scheduler
        runs there (what Dask's workers fetch, then announce with ``add-keys``), or a copy
        the scheduler asked it to make (:meth:`watch_replicas`; once)."""
        ts = self._task(key)
        if ts is None:
            return False
        asked = self.asked.get(worker or "")
        if asked is not None and key in asked:
            asked.discard(key)
            if not asked:
                del self.asked[worker or ""]
            return True
        return any(d.processing_on is not None and d.processing_on.address == worker
                   for d in ts.dependents)

    def watch_replicas(self) -> None:
        """Note the copies the scheduler asks workers to make (``request_acquire_replicas``:
        how a retiring worker's data moves to the others), so the ``add-keys`` that says a
        copy was made passes; any other stays refused. At most ``MAX_ASKED`` keys a worker
        are remembered (more: the oldest asks are forgotten, and their copies recomputed if
        ever needed, as without the guard's leave)."""
        ask = getattr(self.server, "request_acquire_replicas", None)
        if ask is None:
            return

        def asking(addr: str, keys: Any, *, stimulus_id: str) -> None:
            keys = list(keys)
            workers = getattr(self.server, "workers", {})
            for gone in [a for a in self.asked if a not in workers]:
                del self.asked[gone]   # (a worker that left)
            noted = self.asked.setdefault(addr, set())
            if len(noted) + len(keys) > MAX_ASKED:
                noted.clear()
            noted.update(keys)
            ask(addr, keys, stimulus_id=stimulus_id)

        self.server.request_acquire_replicas = asking

    def _dropped(self, peer: _Peer, count: int, about: Any, why: str) -> None:
        """Count what a worker-role peer sent about others' tasks, which went no further;
        one WARNING line a peer, then DEBUG."""
        self.dropped += count
        first = peer.cn not in self._dropped_from
        self._dropped_from.add(peer.cn)
        log.log(logging.WARNING if first else logging.DEBUG,
                "troy guard (%s): dropped %d of %s (role %s, %s) about %s: %s%s", self.kind,
                count, peer.cn or "no common name", peer.role or "none", peer.address,
                str(about)[:100], why, "" if not first else
                " (further drops of this peer: DEBUG)")

    def _check_versions(self, peer: _Peer, msg: dict[str, Any]) -> None:
        ours, theirs = versions(), _their_versions(msg)
        if _same(ours) != _same(theirs):
            raise Refused(f"worker {msg.get('name')!r} at {msg.get('address')}: versions "
                          f"differ: it runs {_show(theirs)}; the scheduler runs "
                          f"{_show(ours)}", )

    def refused(self, peer: _Peer, why: str) -> None:
        self.refusals += 1
        if "versions differ" in why:   # a worker retrying: said once
            if why in self._said:
                return
            self._said.add(why)
        log.warning("troy guard (%s): refused %s from %s (role %s, %s)", self.kind, why,
                    peer.cn or "no common name", peer.role or "none", peer.address)


class _Peer:
    """One incoming connection: its identity and whether it became a stream."""

    def __init__(self, guard: Guard, comm: Any, cn: str | None, role: str | None,
                 strict: bool = False) -> None:
        self.guard, self.comm, self.cn, self.role = guard, comm, cn, role
        self.strict = strict and role != CONTROL   # decoded by strict_loads
        self.address = getattr(comm, "peer_address", "?")
        self.serial = serial_of((getattr(comm, "extra_info", None) or {}).get("peercert"))
        self.stream: str | None = None
        self.worker: str | None = None    # the address it registered as a worker
        self._read = comm.read

    async def read(self, deserializers: Any = None) -> Any:
        while True:
            strict = _STRICT.set(self.strict)
            try:
                msg = await self._read(deserializers)
            except PickleRefused as err:
                where = f"on its {self.stream} stream" if self.stream else "in a message"
                self.guard.refused(self, f"{err} ({where})")
                from distributed.comm.core import CommClosedError
                self.comm.abort()
                raise CommClosedError(f"troy guard: refused {err}") from None
            finally:
                _STRICT.reset(strict)
            why = self._verdict(msg)
            if why is None:
                return msg
            self.guard.refused(self, why)
            await self._answer(msg, why)
            if self.stream is None and isinstance(msg, dict) and msg.get("reply", True) \
                    and msg.get("op") not in STREAM_STARTS:
                continue   # the peer got its error; it may ask for something else
            from distributed.comm.core import CommClosedError
            self.comm.abort()
            raise CommClosedError(f"troy guard: refused {why}")

    def _verdict(self, msg: Any) -> str | None:
        """None: ``msg`` may go on to Dask; else why it may not."""
        try:
            if self.stream is not None:
                self.guard.check_stream(self, msg)
                return None
            if not isinstance(msg, dict) or msg.get("op") == "close":
                return None   # Dask refuses a non-dict itself; anyone may hang up
            self.guard.check_rpc(self, msg)
        except Refused as err:
            return str(err)
        if msg.get("op") in STREAM_STARTS:
            self.stream = msg["op"]
        if self.role == CONTROL:
            self.comm.read = self._read     # nothing more to check here
        return None

    async def _answer(self, msg: Any, why: str) -> None:
        """Tell the peer, when it waits for an answer (the connection closes after a
        refused registration or stream message)."""
        if self.stream is not None or not isinstance(msg, dict):
            return
        op = msg.get("op")
        try:
            if op == "register-worker":
                from time import time
                await self.comm.write({"status": "error", "time": time(),
                                       "message": f"refused by the scheduler: {why}"})
            elif op == "register-client":
                return     # the client reads a stream start: the closed connection says it
            elif msg.get("reply", True):
                from distributed.core import error_message
                await self.comm.write(error_message(
                    PermissionError(f"troy guard: refused {why}"), status="uncaught-error"))
        except Exception:  # the peer went away: nothing to tell
            pass


def _strict_pool(pool: Any) -> None:
    """The connections ``pool`` (the scheduler's to workers) opens to a peer without the
    control role decode what it answers by :func:`strict_loads` (a pickle closes them)."""
    connect = pool.connect

    async def strict_connect(addr: str, timeout: float | None = None) -> Any:
        comm = await connect(addr, timeout)
        if getattr(comm, "_troy_strict", None) is None:
            comm._troy_strict = peer_identity(comm)[1] != CONTROL
            if comm._troy_strict:
                read = comm.read

                async def strict_read(deserializers: Any = None) -> Any:
                    token = _STRICT.set(True)
                    try:
                        return await read(deserializers)
                    except PickleRefused as err:
                        from distributed.comm.core import CommClosedError
                        log.warning("troy guard (scheduler): %s answered with %s: "
                                    "connection closed", addr, err)
                        comm.abort()
                        raise CommClosedError(f"troy guard: refused {err}") from None
                    finally:
                        _STRICT.reset(token)
                comm.read = strict_read
        return comm
    pool.connect = strict_connect


async def _nothing() -> None:
    """What a refused connection's handler does: nothing (it is closed)."""


def install(server: Any, kind: str, deny_file: str | None = None) -> Guard | None:
    """Install the guard on ``server`` (a ``Scheduler`` or ``Worker`` not started yet: the
    guard wraps what its listeners call); None (nothing installed) without TLS.
    ``deny_file`` (a scheduler's; default: ``$TROY_TLS_DENY_FILE``): the certificates'
    deny list."""
    security = getattr(server, "security", None)
    if security is None or not getattr(security, "require_encryption", False):
        return None
    versions()   # now: the code this process runs, not what is on disk later
    _strict_decoding()
    deny_file = deny_file or (os.environ.get(DENY_ENV_VAR) if kind == "scheduler" else None)
    guard = Guard(server, kind, DenyList(deny_file) if deny_file else None)
    server.handle_comm = guard.handle_comm
    server._troy_guard = guard
    if kind == "scheduler":
        _strict_pool(server.rpc)
        guard.watch_replicas()
    if guard.deny is not None:
        from tornado.ioloop import PeriodicCallback
        server.periodic_callbacks["troy-deny-list"] = PeriodicCallback(guard.sweep, 1000)
    return guard
