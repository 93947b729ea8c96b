"""The Dask side of the ``dask`` framework: the task every unit runs, and the worker and
scheduler processes (``python -m troy.frameworks.dask worker|scheduler|node ...``).

Each process prints its address as one JSON line on stdout once it serves. ``worker`` and
``scheduler`` leave when their stdin closes: the framework that started them holds the
other end, so a Troy that dies never leaves workers behind. ``node`` is the pilot agent of a
machine of its own (a CloudLab node's startup command runs it): a worker with the node's
cores as its ``cores`` resource, which a framework with ``adopt_workers`` registers as a
pilot; it serves until SIGTERM/SIGINT and rejoins a scheduler that went away (see
``node``). Every process uses
TLS when its environment configures it (``DASK_DISTRIBUTED__COMM__TLS__...``, see
``tls``). Worker-side state (the processes of running units, for kills) lives in this
module, which is what Dask imports when it unpickles ``run_unit``.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from troy.descriptions import ComputeUnitDescription
from troy.execution import execute, kill
from troy.frameworks.dask import guard
from troy.frameworks.dask.tls import hide_security_environ, security_from_config
from troy.unit import OutputTail, UnitResult

# Every worker of a framework carries its tag as a resource that units ask 1 of: frameworks
# sharing one scheduler never run each other's units; the amount never limits anything.
TAG_AMOUNT = 1_000_000
# A unit's result is data, carried in its ``end`` event (msgpack): never a Dask task result
# or a pickle (the control process decodes nothing a node made). Its value at most this
# large (a unit with more to say writes a file); its output's tails are TAIL_BYTES a stream.
MAX_VALUE = 4 * 1024 * 1024
EVENTS_KEPT = 64   # batches of a Troy topic the scheduler keeps (it sends each on at once)
RUN_EVENT_DELAY = 0.005  # seconds a unit runs before its ``run`` event is sent

_procs: dict[str, list[subprocess.Popen]] = {}
_canceled: set[str] = set()
_procs_lock = threading.Lock()
_stopping = threading.Event()
KILL_ALL_WAIT = 1.0   # seconds a stopping agent waits for units that were starting
_terminating = threading.Event()  # SIGTERM/SIGINT arrived: the worker is closing
SHUTDOWN_GRACE = 2.0  # how long a unit killed by a signal waits for the agent's own SIGTERM
SHUTDOWN_WAIT = 30.0  # then for the worker to have left (nothing is reported after that)

#: Dask settings of the agent's own processes where the user's Dask configuration (its YAML
#: files, ``DASK_*`` variables) says nothing. By default Dask samples its event loop every
#: 20 ms and the machine every 0.5 s: about 1.5% of a core for a worker doing nothing, three
#: times what it costs with these (measured). A pilot's tasks wait on unit processes: a
#: sample a second still reports a loop blocked past ``tick.limit`` (3 s). A worker's
#: statistical profiler (the dashboard's Profile page) samples its threads every 10 ms:
#: another 3% of a core, doing nothing; every 100 ms it costs a tenth of that (a scheduler
#: and an idle worker: 0.40 s of CPU in 10 s with Dask's, 0.11 s with these, measured) and
#: the profile of work that lasts seconds is as clear.
AGENT_DEFAULTS = {"distributed.admin.tick.interval": "1s",
                  "distributed.admin.system-monitor.interval": "2s",
                  "distributed.worker.profile.interval": "100ms"}


#: Seconds Dask's batched streams wait after a send before the next one, or None: Dask's own
#: (10 ms client -> scheduler, 5 ms scheduler -> worker, 2 ms worker -> scheduler and
#: scheduler -> client, fixed in its code), made eager (:func:`eager`). A fixed
#: ``TROY_DASK_STREAM_INTERVAL`` (seconds; in the environment of the framework's process and
#: of the workers it starts) replaces both: ``0`` sends every message at once, which costs a
#: burst 0.73-0.84 of its units/s at 1.2-1.75 times the CPU a unit (measured, interleaved
#: medians on a loaded 2-core box): a stream's batches are what keep a burst's messages cheap.
def _stream_interval(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:  # a node agent must start all the same: Dask's own
        return None


STREAM_INTERVAL = _stream_interval(os.environ.get("TROY_DASK_STREAM_INTERVAL"))
#: ``TROY_DASK_EAGER=0``: Dask's batching as it is (no :func:`eager`).
EAGER = os.environ.get("TROY_DASK_EAGER", "1").strip() != "0"
EAGER_SENDS = 4   # sends at once per interval of a stream, at most
EAGER_BATCH = 2   # ... and only while its last batch held no more messages than this


def eager(stream) -> None:  # noqa: ANN001 - a distributed BatchedSend
    """Make a Dask batched stream send at once while it is quiet, and batch under load.

    Dask's stream sends a message at once only when nothing was sent for a whole interval;
    otherwise the message waits for the interval's end. Back to back, every hop of a
    unit's round trip (client, scheduler, worker and back) finds its stream within the
    interval of its last send: Troy on Dask answered in 11-14 ms where the hops take a
    few tenths of a millisecond. Eager, a stream whose last batch was small
    (:data:`EAGER_BATCH` messages: not a burst) sends a new message at once, up to
    :data:`EAGER_SENDS` times an interval; in a burst the batches grow and it batches as
    Dask does, so a burst's messages stay as cheap (same units/s and CPU a unit,
    measured). Back-to-back latency 11.5-14 -> 3.9-4.7 ms (docs/troy-dask.md).

    Wraps the instance's ``send`` (called on the stream's event loop, as Dask's own is);
    the batching coroutine sends what is buffered when its deadline is cleared and it is
    woken, which is what Dask's ``send`` does on a quiet stream."""
    if getattr(stream, "_troy_eager", False) or not hasattr(stream, "waker"):
        return
    dask_send = stream.send
    sent = stream.recent_message_log   # Dask's record of its last batches
    window = [0.0, 0]                  # the current interval's start, eager sends in it

    def send(*msgs: object) -> None:
        dask_send(*msgs)
        if stream.next_deadline is None:   # quiet for an interval: Dask sends at once
            return
        last = sent[-1] if sent else None
        if not isinstance(last, list) or len(last) > EAGER_BATCH:
            return   # a burst (or a large message): batch
        now = time.monotonic()
        if now - window[0] >= stream.interval:
            window[0], window[1] = now, 0
        if window[1] < EAGER_SENDS:
            window[1] += 1
            stream.next_deadline = None
            stream.waker.set()

    stream.send = send
    stream._troy_eager = True


def _tune(stream) -> None:  # noqa: ANN001 - a distributed BatchedSend
    if STREAM_INTERVAL is not None:
        stream.interval = STREAM_INTERVAL
    elif EAGER:
        eager(stream)


def quicken(server) -> None:  # noqa: ANN001 - a Worker, a Scheduler or a Client
    """Make ``server``'s batched streams eager (:func:`eager`), or set
    :data:`STREAM_INTERVAL` on them: a client's to its scheduler, a worker's to its
    scheduler, and a scheduler's to its workers and clients, present and future (a plugin
    tunes those when they join)."""
    if STREAM_INTERVAL is None and not EAGER:
        return
    for attr in ("scheduler_comm", "batched_stream"):   # a Client, a Worker
        stream = getattr(server, attr, None)
        if stream is not None and hasattr(stream, "interval"):
            _tune(stream)
    if hasattr(server, "stream_comms") and hasattr(server, "client_comms"):  # a Scheduler
        for stream in [*server.stream_comms.values(), *server.client_comms.values()]:
            _tune(stream)
        if QUICK_STREAMS not in server.plugins:
            server.add_plugin(_quick_streams_plugin())


QUICK_STREAMS = "troy-quick-streams"


def _quick_streams_plugin():  # noqa: ANN202 - a SchedulerPlugin (Dask imported when used)
    from distributed.diagnostics.plugin import SchedulerPlugin

    class QuickStreams(SchedulerPlugin):
        """Tunes the streams of workers and clients that join (:func:`quicken`)."""

        name = QUICK_STREAMS

        def add_worker(self, scheduler, worker: str) -> None:  # noqa: ANN001
            stream = scheduler.stream_comms.get(worker)
            if stream is not None:
                _tune(stream)

        def add_client(self, scheduler, client: str) -> None:  # noqa: ANN001
            # the scheduler makes the client's stream right after calling its plugins
            scheduler.loop.add_callback(self._client_joined, scheduler, client)

        @staticmethod
        def _client_joined(scheduler, client: str) -> None:  # noqa: ANN001
            stream = scheduler.client_comms.get(client)
            if stream is not None:
                _tune(stream)

    return QuickStreams()


#: Set, where the node's environment does not, while the agent imports Dask, as Dask's
#: nanny does for every worker it spawns (``distributed.nanny.pre-spawn-environ``): numpy,
#: were it imported then, would start one BLAS thread instead of a pool of one per core (the
#: pool's start cost ~0.1 s of CPU at every agent and worker start, measured). Removed again
#: once imported: units get the node's environment as it was.
ONE_THREAD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class _NumpyLater:
    """Says numpy is not there, while Distributed is imported: Distributed imports it at
    once only to allocate its receive buffers (``protocol.utils.host_array``, a bytearray
    without it); everything else of Dask's that uses numpy (serializers, sizeof, tokenize)
    imports it when the first array arrives. An agent whose units are processes never
    needs it: its import and its BLAS pool cost ~0.1 s of CPU at every agent and worker
    start where the node's Python has numpy (measured on the suite's; a node's environment
    from the wheelhouse has none unless the user's code needs it, and then the first array
    imports it, with the node's own BLAS settings)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@contextlib.contextmanager
def _yaml_in_c() -> Iterator[None]:
    """``yaml.safe_load`` with libyaml's loader (``yaml.CSafeLoader``, the same safe
    subset, in C) where PyYAML has it, while Dask reads its defaults: Dask parses
    ``dask.yaml`` and ``distributed.yaml`` with PyYAML's pure-Python loader at every import,
    40 ms of CPU at every agent, worker and scheduler start where libyaml takes 5 ms
    (measured on the suite's machine); restored afterwards."""
    try:
        import yaml
    except ImportError:
        yield
        return
    loader = getattr(yaml, "CSafeLoader", None)
    if loader is None or not getattr(yaml, "__with_libyaml__", False):
        yield
        return
    plain = yaml.safe_load
    yaml.safe_load = lambda stream: yaml.load(stream, Loader=loader)  # noqa: S506 - safe
    try:
        yield
    finally:
        yaml.safe_load = plain


def import_dask_for_an_agent() -> list[str]:
    """Import Distributed without numpy (:class:`_NumpyLater`; numpy imports normally
    afterwards), with Dask's YAML defaults read by libyaml (:func:`_yaml_in_c`), and with
    :data:`ONE_THREAD` set where unset, for a numpy already imported or that something of
    the node's imports all the same; returns the variables it set (and removed again)."""
    added = [name for name in ONE_THREAD if name not in os.environ]
    for name in added:
        os.environ[name] = "1"
    later = _NumpyLater()
    if "numpy" not in sys.modules:
        sys.meta_path.insert(0, later)
    try:
        with _yaml_in_c():
            import distributed  # noqa: F401
            import distributed.protocol.utils  # noqa: F401 - where numpy was imported
    finally:
        if later in sys.meta_path:
            sys.meta_path.remove(later)
        for name in added:
            os.environ.pop(name, None)
    return added


def apply_agent_defaults() -> dict[str, str]:
    """Set :data:`AGENT_DEFAULTS` that the user's configuration does not set; returns those
    set."""
    import dask
    user = dask.config.collect()   # YAML files and DASK_* variables, not packages' defaults
    chosen = {key: value for key, value in AGENT_DEFAULTS.items()
              if dask.config.get(key, default=None, config=user) is None}
    if chosen:
        dask.config.set(chosen)
    return chosen


def _data_size(v: Any, depth: int = 0) -> int | None:
    """The size of ``v`` if it is plain data (what msgpack carries: None, bool, numbers,
    str, bytes, lists and dicts of them), else None."""
    if v is None or isinstance(v, (bool, int, float)):
        return 8 if not isinstance(v, int) or -2**63 <= v < 2**64 else None
    if isinstance(v, (str, bytes)):
        return len(v)
    if depth > 32:
        return None
    items = list(v.items()) if isinstance(v, dict) else v if isinstance(v, (list, tuple)) \
        else None
    if items is None:
        return None
    total = 0
    for item in items:
        pair = item if isinstance(v, dict) else (item,)
        for part in pair:
            size = _data_size(part, depth + 1)
            if size is None:
                return None
            total += size
    return total


def as_data(result: UnitResult) -> UnitResult:
    """``result`` as it goes in the ``end`` event: a value that is not plain data, or is
    larger than :data:`MAX_VALUE`, makes the unit fail with a line that says why."""
    members = [as_data(m) for m in result.members]
    size = _data_size(result.value)
    why = None
    if size is None:
        why = (f"its value is a {type(result.value).__name__}: a unit on a pilot returns "
               f"data (str, bytes, numbers, lists, dicts) or writes a file")
    elif size > MAX_VALUE:
        why = (f"its value is {size} bytes: at most {MAX_VALUE} come back from a pilot; "
               f"write it to a file")
    if why is None and members == result.members:
        return result
    return dataclasses.replace(result, members=members,
                               value=None if why else result.value,
                               error=result.error or why)


def _tail_to_wire(t: OutputTail | None) -> list | None:
    return None if t is None else [t.data, t.size]


def _tail_from_wire(w: list | None) -> OutputTail | None:
    if w is None:
        return None
    if not (isinstance(w, (list, tuple)) and len(w) == 2 and isinstance(w[0], bytes)
            and isinstance(w[1], int)):
        raise ValueError("an output tail is [bytes, int]")
    return OutputTail(data=w[0], size=w[1])


def _number(v: Any, what: str) -> Any:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ValueError(f"{what} is a number")
    return v


def result_to_wire(r: UnitResult) -> list:
    """Events travel as msgpack: a UnitResult as a plain list (:func:`as_data` first)."""
    return [r.exit_code, r.value, r.error, r.start, r.end,
            [result_to_wire(m) for m in r.members],
            _tail_to_wire(r.stdout), _tail_to_wire(r.stderr)]


def result_from_wire(w: list, depth: int = 0) -> UnitResult:
    """A UnitResult from what a node sent (checked: a malformed one is a failed result
    that says so, never an exception here)."""
    if type(w) is list and len(w) == 8 and w[5] == [] and w[6] is None and w[7] is None \
            and (w[0] is None or type(w[0]) is int) and (w[2] is None or type(w[2]) is str) \
            and type(w[3]) is float and type(w[4]) is float:
        # the usual member's result (a process with no output, timed): no more to check
        return UnitResult(exit_code=w[0], value=w[1], error=w[2], start=w[3], end=w[4])
    try:
        if not isinstance(w, (list, tuple)) or len(w) not in (6, 8) or depth > 8 \
                or not isinstance(w[5], (list, tuple)):
            raise ValueError("a result is a list of 8")
        if w[2] is not None and not isinstance(w[2], str):
            raise ValueError("an error is a string")
        out, err = (w[6], w[7]) if len(w) > 7 else (None, None)  # an older agent
        return UnitResult(exit_code=_number(w[0], "an exit code"), value=w[1], error=w[2],
                          start=_number(w[3], "a start"), end=_number(w[4], "an end"),
                          members=[result_from_wire(m, depth + 1) for m in w[5]],
                          stdout=_tail_from_wire(out), stderr=_tail_from_wire(err))
    except (ValueError, TypeError, IndexError) as why:
        return UnitResult(error=f"its node sent a malformed result ({why})")


class _Outbox:
    """A worker's pending events, sent to the scheduler in batches: one ``log_event`` per
    topic per event-loop turn (``["batch", [event, ...]]``) instead of one per unit, and one
    timer that announces units still running ``RUN_EVENT_DELAY`` after they started instead
    of a timer per unit.

    Order: a unit's ``end`` event is queued, with a flush scheduled on the worker's loop,
    before the unit's function returns, so the flush runs before Dask reports the task
    finished (the framework sees ``end`` before the future's outcome, as with one event per
    unit); a ``run`` event is only sent while its unit is still running, so it precedes its
    ``end``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: dict[str, list[list]] = {}   # topic -> events not yet sent
        self.flushing = False                     # a flush is scheduled on the loop
        self.running: dict[str, tuple[str, float, str]] = {}  # unit -> (topic, start, key),
        #                                                          unannounced
        self.ticking = False                      # the announce timer is armed

    def started(self, worker, unit_id: str, topic: str, start: float, key: str) -> None:
        with self.lock:
            self.running[unit_id] = (topic, start, key)
            arm = not self.ticking
            self.ticking = True
        if arm:
            worker.loop.add_callback(self._arm, worker)

    def ended(self, worker, unit_id: str, topic: str, event: list) -> None:
        with self.lock:
            self.running.pop(unit_id, None)
            self.events.setdefault(topic, []).append(event)
            flush = not self.flushing
            self.flushing = True
        if flush:
            worker.loop.add_callback(self._flush, worker)

    def forget(self, unit_id: str) -> None:
        with self.lock:
            self.running.pop(unit_id, None)

    def _arm(self, worker) -> None:
        worker.loop.call_later(RUN_EVENT_DELAY, self._tick, worker)

    def _tick(self, worker) -> None:
        """On the worker's loop: announce units running for ``RUN_EVENT_DELAY`` already."""
        due = time.time() - RUN_EVENT_DELAY
        with self.lock:
            for uid, (topic, start, key) in list(self.running.items()):
                if start <= due:
                    del self.running[uid]
                    self.events.setdefault(topic, []).append(
                        ["run", uid, worker.address, start, key])
            self.ticking = bool(self.running)
        self._flush(worker)
        if self.ticking:
            self._arm(worker)

    def _flush(self, worker) -> None:
        with self.lock:
            events, self.events = self.events, {}
            self.flushing = False
        for topic, batch in events.items():
            worker.log_event(topic, ["batch", batch])


def _outbox_of(worker) -> _Outbox:
    box = getattr(worker, "_troy_outbox", None)
    if box is None:
        with _procs_lock:
            box = getattr(worker, "_troy_outbox", None)
            if box is None:
                box = worker._troy_outbox = _Outbox()
    return box


class Stopped(RuntimeError):
    """The pilot is going away while the unit ran: it runs again elsewhere."""


def run_tracked(cud: ComputeUnitDescription, unit_id: str, sandbox: str | None,
                started: Callable[[], None]) -> UnitResult | None:
    """Run one unit here, its processes known to :func:`kill_unit`; ``started()`` is called
    once it is about to start. None: it was canceled before it started (nothing to say);
    :class:`Stopped`: the pilot is going away (nothing is reported: it runs elsewhere)."""
    with _procs_lock:
        if unit_id in _canceled:
            return None
        if _stopping.is_set():   # the pilot is going: nothing starts here any more
            raise Stopped("pilot stopped before the unit started")
        _procs[unit_id] = []

    def hook(proc: subprocess.Popen) -> None:
        # only the process running now: a bundle's members run one after another, and one
        # that ended was reaped, its pid free for another process (a kill must not reach it)
        with _procs_lock:
            _procs[unit_id] = [proc]
            dead = unit_id in _canceled or _stopping.is_set()
        if dead:
            kill(proc)

    started()
    try:
        result = execute(cud, sandbox=sandbox, on_start=hook,
                         canceled=lambda: unit_id in _canceled or _stopping.is_set())
    finally:
        with _procs_lock:
            _procs.pop(unit_id, None)
    if not _stopping.is_set() and _signalled(result, unit_id) \
            and _terminating.wait(SHUTDOWN_GRACE):
        # the node is shutting down (SIGTERM to every process of it, the agent included):
        # the unit died of that, not of its own doing; once the worker has left, nothing
        # is reported and the unit runs again elsewhere
        _stopping.wait(SHUTDOWN_WAIT)
    if _stopping.is_set():
        raise Stopped("pilot stopped while the unit ran")
    return result


def run_unit(cud: ComputeUnitDescription, unit_id: str, topic: str,
             sandbox: str | None) -> UnitResult | None:
    """Run one unit inside a Dask worker (the Dask task of every Troy unit)."""
    from distributed import get_worker
    worker = get_worker()
    # RUNNING is announced only if the unit is still running RUN_EVENT_DELAY later: a
    # shorter unit's ``end`` event carries its start, and the framework pushes RUNNING then
    # the final state from it, saving a scheduler message per short unit.
    outbox = _outbox_of(worker)
    # each event names the unit's Dask task: the scheduler's guard takes a unit's events
    # only from the worker that runs its task, and the framework only for its current one
    key = worker.get_current_task()
    start = [0.0]

    def started() -> None:
        start[0] = time.time()
        outbox.started(worker, unit_id, topic, start[0], key)

    try:
        result = run_tracked(cud, unit_id, sandbox, started)
    except Stopped:  # Dask reruns the unit elsewhere
        outbox.forget(unit_id)
        raise
    except BaseException:  # the Dask task errs: the unit ran here, its future says how
        outbox.ended(worker, unit_id, topic, ["run", unit_id, worker.address, start[0], key])
        raise
    if result is None:
        return None
    outbox.ended(worker, unit_id, topic, ["end", unit_id, worker.address,
                                          result_to_wire(as_data(result)), key])
    return None


def _signalled(result: UnitResult, unit_id: str) -> bool:
    """Whether the unit's process died of a signal this agent did not send."""
    with _procs_lock:
        ours = unit_id in _canceled
    return not ours and result.exit_code is not None and result.exit_code < 0


def keep_few_events(dask_scheduler: Any, topic: str, n: int = EVENTS_KEPT) -> None:
    """On the scheduler (``on_scheduler``): keep only the last ``n`` events of ``topic``
    (Troy's units' events: results inline; the scheduler sends each to Troy at once)."""
    from collections import deque
    kept = dask_scheduler._broker._topics[topic]   # distributed.broker.Topic
    kept.events = deque(kept.events, maxlen=n)


async def on_node(dask_scheduler: Any, addr: str, function: Any, *args: Any) -> str | None:
    """On the scheduler (``on_scheduler``): run ``function(*args)`` on the worker at
    ``addr`` (Dask's worker ``run``), for Troy's client, which takes nothing a node made:
    None when it ran, else the node's text of why not (a string). Its answer is decoded
    by the scheduler's guard, which never unpickles a node's (the result stays opaque and
    is dropped)."""
    from distributed.protocol.pickle import dumps
    if addr not in dask_scheduler.workers:
        return f"no worker at {addr}"
    try:
        resp = await dask_scheduler.rpc(addr).run(function=dumps(function), args=dumps(args),
                                                  wait=True)
    except Exception as err:  # noqa: BLE001 - gone, or refused: a line
        return f"{type(err).__name__}: {err}"[:500]
    if isinstance(resp, dict) and resp.get("status") == "OK":
        return None
    text = resp.get("exception_text") if isinstance(resp, dict) else None
    return str(text)[:500] if isinstance(text, str) else "it failed"


def kill_unit(unit_id: str) -> bool:
    """Kill a unit's processes on this worker (run there by ``client.run``)."""
    with _procs_lock:
        _canceled.add(unit_id)
        procs = list(_procs.get(unit_id, ()))
    for p in procs:
        kill(p)
    return bool(procs)


def kill_units(unit_ids: list[str]) -> int:
    """Kill several units' processes on this worker (units moved away from it)."""
    return sum(kill_unit(uid) for uid in unit_ids)


async def set_tags(tags: dict[str, float], dask_worker=None) -> dict[str, float]:  # noqa: ANN001
    """On a worker (``client.run``): set resources ``tags`` here only. A tag at 0 stops the
    worker from starting the queued tasks that ask for it, at once. The scheduler learns
    them from the control (``tags_at_scheduler``), never from the worker: a worker may not
    set its own resources there (the guard refuses it), or a hostile one could grant itself
    a framework's tag."""
    state = dask_worker.state
    for tag, amount in tags.items():
        state.available_resources[tag] = state.available_resources.get(tag, 0) + amount \
            - state.total_resources.get(tag, 0)
        state.total_resources[tag] = amount
    return dict(state.total_resources)


def tags_at_scheduler(worker: str, tags: dict[str, float],
                      dask_scheduler=None) -> int:  # noqa: ANN001
    """On the scheduler (``client.run_on_scheduler``): set resources ``tags`` of ``worker``;
    when one is positive, hand it the tasks that had no worker (see
    ``schedule_unrunnable``). -1: no such worker."""
    if worker not in dask_scheduler.workers:
        return -1
    dask_scheduler.add_resources(worker, dict(tags))
    return schedule_unrunnable(worker, dask_scheduler) \
        if any(v > 0 for v in tags.values()) else 0


def schedule_unrunnable(worker: str, dask_scheduler=None) -> int:  # noqa: ANN001
    """On the scheduler (``client.run_on_scheduler``): hand the tasks that had no worker
    to ``worker`` if it may run them now (Dask re-checks them only when a worker joins)."""
    import uuid
    ws = dask_scheduler.workers.get(worker)
    if ws is None:
        return 0
    recs = dask_scheduler.bulk_schedule_unrunnable_after_adding_worker(ws)
    if recs:
        dask_scheduler.transitions(recs, f"troy-tags-{uuid.uuid4().hex[:8]}")
    return len(recs)


def withdraw(worker: str, tags: list[str], dask_scheduler=None) -> list[str]:  # noqa: ANN001
    """On the scheduler (``client.run_on_scheduler``): from now on no task asking for one of
    ``tags`` goes to ``worker`` (set to 0 here only: the worker may be gone or going);
    returns the keys processing there (queued or running), in the same step, so that they
    are all it will ever run of them."""
    ws = dask_scheduler.workers.get(worker)
    if ws is None:
        return []
    dask_scheduler.add_resources(worker, {tag: 0 for tag in tags})
    return [str(ts.key) for ts in ws.processing]


def let_go(keys: list[str], client: str, dask_scheduler=None) -> int:  # noqa: ANN001
    """On the scheduler: ``client`` no longer wants ``keys`` (moved units' old tasks), as of
    this call. A future's cancel travels on the client's batched stream, which a worker's
    leaving can overtake under load: Dask then still wanted the old task and ran it on
    another worker, a duplicate run. Returns how many it still had."""
    known = [k for k in keys if k in dask_scheduler.tasks]
    if known:
        dask_scheduler.client_releases_keys(keys=known, client=client,
                                            stimulus_id=f"troy-let-go-{time.time()}")
    return len(known)


def peer_common_name(worker: str, dask_scheduler=None) -> str | None:  # noqa: ANN001
    """On the scheduler: the common name of the TLS certificate the worker at ``worker``
    connected with (None: no TLS, or no such worker)."""
    stream = dask_scheduler.stream_comms.get(worker)
    comm = getattr(stream, "comm", None)
    cert = (getattr(comm, "extra_info", None) or {}).get("peercert") or {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _kill_all(wait: float = KILL_ALL_WAIT) -> None:
    """Kill every unit's processes, and wait (at most ``wait`` s) for the units' threads to
    leave :func:`run_tracked`: a thread that was starting a process as this began registers
    it after, and its hook kills it then (the worker exiting first left it running, an
    orphan, when a cancel had just made room for the next unit)."""
    _stopping.set()
    deadline = time.monotonic() + wait
    while True:
        with _procs_lock:
            procs = [p for ps in _procs.values() for p in ps]
            busy = bool(_procs)
        for p in procs:
            kill(p)
        if not busy or time.monotonic() > deadline:
            return
        time.sleep(0.01)


async def _start_worker(scheduler: str, death_timeout: float = 30,
                        memory_limit: str | int = 0,
                        **options: object):  # noqa: ANN202 - a Worker
    """A started worker (TLS when configured); its address printed on stdout.
    ``memory_limit``: Dask's (0: none; ``"auto"``: the machine's memory)."""
    from distributed import Worker
    security = security_from_config()
    hide_security_environ()   # units run without it (they are not members of the cluster)
    w = Worker(scheduler, dashboard=False, dashboard_address="127.0.0.1:0",
               death_timeout=death_timeout, memory_limit=memory_limit, security=security,
               startup_information=guard.startup_information(), **options)
    guard.install(w, "worker")
    await w
    quicken(w)
    sys.stdout.write(json.dumps({"address": w.address}) + "\n")
    sys.stdout.flush()
    return w


async def _serve_worker(scheduler: str, name: str, nthreads: int, cores: int,
                        tag: str) -> None:
    w = await _start_worker(scheduler, nthreads=nthreads,
                            resources={"cores": cores, tag: TAG_AMOUNT,
                                       f"{tag}-long": TAG_AMOUNT}, name=name,
                            host="127.0.0.1")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:  # EOF: the framework closed us or died
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    done = asyncio.ensure_future(w.finished())
    await asyncio.wait([done, asyncio.ensure_future(stop.wait())],
                       return_when=asyncio.FIRST_COMPLETED)
    # Leave the scheduler first (it reschedules what ran here), then kill the units (a close
    # that fails kills them all the same: they run in sessions of their own and would
    # outlive this process)
    try:
        await w.close(timeout=5, executor_wait=False, reason="troy pilot stopped")
    finally:
        _kill_all()


NODE_USAGE = ("usage: python -m troy.frameworks.dask node SCHEDULER CORES [NAME [HOST]]\n"
              "  a pilot agent: a Dask worker with CORES as its cores resource; TLS from\n"
              "  DASK_DISTRIBUTED__COMM__TLS__* (see troy.frameworks.dask.tls)")


def main(argv: list[str]) -> None:
    """``python -m troy.frameworks.dask worker SCHEDULER NAME NTHREADS CORES TAG`` or
    ``... scheduler SATURATION``: serve until stdin closes, after printing the address;
    ``... node SCHEDULER CORES [NAME [HOST]]``: a node's pilot agent, until SIGTERM."""
    logging.basicConfig(level=logging.WARNING)
    import_dask_for_an_agent()
    apply_agent_defaults()
    if len(argv) in (2, 4) and argv[0] == "scheduler":
        from troy.frameworks.dask.schedproc import serve_scheduler
        asyncio.run(serve_scheduler(float(argv[1]), *argv[2:3], *map(int, argv[3:4])))
        return
    if argv[:1] == ["node"]:
        if not 3 <= len(argv) <= 5 or not argv[2].isdigit() or int(argv[2]) < 1:
            sys.exit(NODE_USAGE)
        if argv[1].startswith("tls://") and security_from_config() is None:
            sys.exit(f"troy node agent: cannot join {argv[1]}: no TLS certificate configured "
                     f"(DASK_DISTRIBUTED__COMM__TLS__*)")
        from troy.frameworks.dask.node import SchedulerGone, _serve_node, reconnect_seconds
        try:
            reconnect = reconnect_seconds()
        except ValueError as err:
            sys.exit(f"troy node agent: {err}")
        try:
            asyncio.run(_serve_node(argv[1], int(argv[2]), *(argv[3:] + [None, None])[:2],
                                    reconnect=reconnect))
        except SchedulerGone as err:
            sys.exit(f"troy node agent: {err}; exiting")
        except Exception as err:  # one line for the node's log, not a traceback
            cause = err.__cause__ or err
            sys.exit(f"troy node agent: cannot join {argv[1]}: {type(cause).__name__}: {cause}")
        os._exit(0)
    if len(argv) != 6 or argv[0] != "worker":
        sys.exit("usage: python -m troy.frameworks.dask worker SCHEDULER NAME NTHREADS CORES TAG")
    asyncio.run(_serve_worker(argv[1], argv[2], int(argv[3]), int(argv[4]), argv[5]))
    os._exit(0)  # unit threads may still be blocked on killed processes
