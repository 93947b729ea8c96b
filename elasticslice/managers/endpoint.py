"""The seed's client endpoints: what CloudLab calls when it takes nodes back or values them.

``ElasticSliceClientEndpoint`` answers SUCCESS to everything (after checking the params);
``SimpleElasticSliceClientEndpoint`` tracks delete notices, runs the helper's delete commands
in a child process bounded by the notice's ``max_wait_time``, and answers the countdown with
``max_wait_time`` 0 for the nodes whose delete finished, so CloudLab takes them early.

Serve either with :class:`elasticslice.rpc.endpoint.EndpointServer`. Every handler answers
at once: the delete commands run on a small pool of background threads, each command a child
process in its own process group, killed when the deadline passes.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elasticslice.managers.deletes import DeleteJob
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.endpoint import BadArgs, ProtoGeniClientServerEndpoint, response

if TYPE_CHECKING:
    from elasticslice.managers.helpers import ElasticSliceHelper

log = logging.getLogger(__name__)

MAX_NODES = 10_000          # nodes in one nodelist
MAX_ID = 256                # characters in a node_id / client_id
MAX_URN = 1024              # characters in a component_urn
MAX_WAIT_TIME = 2**31 - 1   # XML-RPC's int
MAX_PARALLEL_DELETES = 4    # delete jobs running at once; more wait their turn
STALE_AFTER = 600.0         # a finished notice CloudLab never completed is forgotten then
KINDS = ("pending", "complete", "values")


@dataclass(frozen=True)
class DeleteNotice:
    """One node of a NotifyDeletePending / NotifyDeleteComplete; ``received`` is epoch time."""

    node_id: str
    client_id: str | None
    max_wait_time: int
    received: float

    @property
    def deadline(self) -> float:
        return self.received + self.max_wait_time


@dataclass(frozen=True)
class ResourceValue:
    """One node of SetResourceValues: 0 (reclaimed first) .. 1 (reclaimed last)."""

    node_id: str
    value: float
    client_id: str | None = None
    component_urn: str | None = None


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _string(item: dict[str, Any], key: str, where: str, limit: int, required: bool) -> str | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise BadArgs(f"{where}.{key}: expected a non-empty string of at most {limit} "
                      f"characters, got {'nothing' if value is None else _describe(value)}")
    return value


def parse_nodelist(params: object, *, kind: str) -> list[dict[str, Any]]:
    """Check ``params["nodelist"]`` of a callback; copies of its items, normalised.

    ``kind``: "pending" (NotifyDeletePending: node_id, max_wait_time required), "complete"
    (NotifyDeleteComplete: node_id required) or "values" (SetResourceValues: node_id and value
    0..1 required). client_id and component_urn are optional strings. Unknown keys are kept
    (the answer to NotifyDeletePending is a copy of the list); a ``<nil/>`` value is dropped. Raises :class:`BadArgs` with
    one line naming the item and key.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if not isinstance(params, dict):
        raise BadArgs(f"params must be a struct, not {type(params).__name__}")
    nodelist = params.get("nodelist")
    if not isinstance(nodelist, list):
        raise BadArgs("nodelist: expected an array of structs, got "
                      f"{'nothing' if nodelist is None else type(nodelist).__name__}")
    if len(nodelist) > MAX_NODES:
        raise BadArgs(f"nodelist: {len(nodelist)} nodes, at most {MAX_NODES} in one call")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(nodelist):
        where = f"nodelist[{i}]"
        if not isinstance(item, dict):
            raise BadArgs(f"{where}: expected a struct, got {type(item).__name__}")
        node_id = _string(item, "node_id", where, MAX_ID, True)
        assert node_id is not None
        if node_id in seen:
            raise BadArgs(f"{where}.node_id: {node_id!r} appears twice")
        seen.add(node_id)
        _string(item, "client_id", where, MAX_ID, False)
        _string(item, "component_urn", where, MAX_URN, False)
        copy = {k: v for k, v in item.items() if v is not None}  # <nil/>: as if absent
        if kind != "values" and ("max_wait_time" in item or kind == "pending"):
            wait = item.get("max_wait_time")
            if isinstance(wait, bool) or not isinstance(wait, int) or \
                    not 0 <= wait <= MAX_WAIT_TIME:
                raise BadArgs(f"{where}.max_wait_time: expected whole seconds >= 0, got "
                              f"{'nothing' if wait is None else _describe(wait)}")
        if kind == "values":
            value = item.get("value")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise BadArgs(f"{where}.value: expected a number from 0 to 1, got "
                              f"{'nothing' if value is None else _describe(value)}")
            copy["value"] = float(value)
        out.append(copy)
    return out


def _notices(nodes: list[dict[str, Any]], received: float) -> list[DeleteNotice]:
    return [DeleteNotice(n["node_id"], n.get("client_id"), int(n.get("max_wait_time", 0)),
                         received) for n in nodes]


class ElasticSliceClientEndpoint(ProtoGeniClientServerEndpoint):
    """The stub endpoint: checks the params, logs them at DEBUG, answers SUCCESS."""

    RPC_METHODS: tuple[str, ...] = ("GetVersion", "NotifyDeletePending",
                                    "NotifyDeleteComplete", "SetResourceValues")

    def __init__(self) -> None:
        pass

    def GetVersion(self, params: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: N802
        return response(GeniCode.SUCCESS, "1.0", "1.0")

    def NotifyDeletePending(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        log.debug("NotifyDeletePending %s", parse_nodelist(params, kind="pending"))
        return response(GeniCode.SUCCESS)

    def NotifyDeleteComplete(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        log.debug("NotifyDeleteComplete %s", parse_nodelist(params, kind="complete"))
        return response(GeniCode.SUCCESS)

    def SetResourceValues(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        log.debug("SetResourceValues %s", parse_nodelist(params, kind="values"))
        return response(GeniCode.SUCCESS)


@dataclass
class _Pending:
    notice: DeleteNotice
    job: DeleteJob | None = None
    finished: bool = False
    outcome: str | None = None


class SimpleElasticSliceClientEndpoint(ElasticSliceClientEndpoint):
    """Tracks CloudLab's notices and runs the helper's delete commands.

    ``helper``: whose ``get_delete_commands(nodelist)`` gives the shell commands to run before
    nodes are given back (None: this object's own ``get_delete_commands`` when it is also a
    helper, as the manager is, else no commands). ``delete_in_group``: all new nodes of one
    notice in one job (bounded by the smallest max_wait_time), else one job per node.
    ``rlock``: the lock guarding the notices (share the manager's).
    """

    def __init__(self, helper: ElasticSliceHelper | None = None, delete_in_group: bool = True,
                 rlock: threading.RLock | None = None) -> None:
        ElasticSliceClientEndpoint.__init__(self)
        self._ep_helper = helper
        self.delete_in_group = delete_in_group
        self._ep_lock = rlock if rlock is not None else threading.RLock()
        self._ep_pending: dict[str, _Pending] = {}
        self._ep_values: dict[str, ResourceValue] = {}
        self._ep_pool: ThreadPoolExecutor | None = None
        self._ep_jobs: set[DeleteJob] = set()

    # -- the RPC methods ---------------------------------------------------------------------
    def NotifyDeletePending(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        nodes = parse_nodelist(params, kind="pending")
        notices = _notices(nodes, time.time())
        fresh: list[dict[str, Any]] = []
        with self._ep_lock:
            self._forget_stale(notices[0].received if notices else time.time())
            unknown = sum(1 for n in notices if n.node_id not in self._ep_pending)
            if len(self._ep_pending) + unknown > MAX_NODES:
                raise BadArgs(f"nodelist: more than {MAX_NODES} nodes would be pending "
                              "delete at once")
            for node, notice in zip(nodes, notices):
                known = self._ep_pending.get(notice.node_id)
                if known is None:
                    self._ep_pending[notice.node_id] = _Pending(notice)
                    fresh.append(node)
                    continue
                known.notice = notice  # the countdown: a later deadline never extends a job
                if known.job is not None:
                    known.job.deadline = min(known.job.deadline, notice.deadline)
        log.info("NotifyDeletePending: %d node(s), %d new: %s", len(nodes), len(fresh),
                 " ".join(f"{n.node_id}({n.max_wait_time}s)" for n in notices[:20]))
        self._call_hook(self.on_delete_pending, notices)
        gone = [n["node_id"] for n in fresh if n["max_wait_time"] == 0]
        if gone:  # CloudLab could not wait: the node may be gone already, no time for commands
            self._finish(gone, "no-time")
        fresh = [n for n in fresh if n["max_wait_time"] > 0]
        if fresh:
            groups = [fresh] if self.delete_in_group else [[n] for n in fresh]
            for group in groups:
                self.start_delete(group)
        answer = []
        for node in nodes:
            copy = dict(node)
            if copy["max_wait_time"] == 0 or self.delete_finished(copy["node_id"]):
                copy["max_wait_time"] = 0
            answer.append(copy)
        return response(GeniCode.SUCCESS, answer)

    def NotifyDeleteComplete(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        nodes = parse_nodelist(params, kind="complete")
        notices = _notices(nodes, time.time())
        with self._ep_lock:
            for notice in notices:
                gone = self._ep_pending.pop(notice.node_id, None)
                job = gone.job if gone else None
                if job is not None and not any(
                        p.job is job for p in self._ep_pending.values()):
                    job.cancelled.set()  # every node of the job is gone: stop its commands
        log.info("NotifyDeleteComplete: %s", " ".join(n.node_id for n in notices[:20]))
        self._call_hook(self.on_delete_complete, notices)
        return response(GeniCode.SUCCESS)

    def SetResourceValues(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        nodes = parse_nodelist(params, kind="values")
        values = [ResourceValue(n["node_id"], n["value"], n.get("client_id"),
                                n.get("component_urn")) for n in nodes]
        with self._ep_lock:
            for v in values:
                self._ep_values[v.node_id] = v
            while len(self._ep_values) > MAX_NODES:  # bounded: the oldest entries go first
                del self._ep_values[next(iter(self._ep_values))]
        log.info("SetResourceValues: %d node(s)", len(values))
        self._call_hook(self.on_resource_values, values)
        return response(GeniCode.SUCCESS)

    # -- deletes -----------------------------------------------------------------------------
    def _delete_commands(self, nodelist: list[dict[str, Any]]) -> list[str]:
        helper: Any = self._ep_helper
        if helper is None and callable(getattr(self, "get_delete_commands", None)):
            helper = self
        if helper is None:
            return []
        commands = helper.get_delete_commands([dict(n) for n in nodelist]) or []
        if isinstance(commands, str) or not all(isinstance(c, str) for c in commands):
            raise TypeError("get_delete_commands must return a list of strings")
        return list(commands)

    def start_delete(self, nodelist: list[dict[str, Any]]) -> None:
        """Start the delete of ``nodelist`` (items with node_id, max_wait_time): the helper's
        commands run serially in the background, killed at the smallest deadline."""
        now = time.time()
        node_ids = [str(n["node_id"]) for n in nodelist]
        deadline = now + min((int(n.get("max_wait_time", 0)) for n in nodelist), default=0)
        if deadline <= now:
            log.info("no time to run delete commands for %s: CloudLab may have them already",
                     " ".join(node_ids))
            self._finish(node_ids, "no-time")
            return
        try:
            commands = self._delete_commands(nodelist)
        except Exception:
            log.exception("get_delete_commands failed for %s", " ".join(node_ids))
            self._finish(node_ids, "failed")
            return
        if not commands:
            self._finish(node_ids, "done")
            return
        job = DeleteJob(node_ids, [dict(n) for n in nodelist], commands, deadline)
        with self._ep_lock:
            for pending in [self._ep_pending[i] for i in node_ids if i in self._ep_pending]:
                # a countdown that came in meanwhile may have brought the deadline closer
                pending.job = job
                deadline = min(deadline, pending.notice.deadline)
            job.deadline = deadline
            self._ep_jobs.add(job)
            if self._ep_pool is None:
                self._ep_pool = ThreadPoolExecutor(MAX_PARALLEL_DELETES,
                                                   thread_name_prefix="delete")
            self._ep_pool.submit(self._run_job, job)

    def _run_job(self, job: DeleteJob) -> None:
        try:
            outcome = job.run()
        except Exception:
            log.exception("delete job for %s failed", " ".join(job.node_ids))
            outcome = "failed"
        finally:
            with self._ep_lock:
                self._ep_jobs.discard(job)
        self._finish(job.node_ids, outcome)

    def end_delete(self, nodelist: list[dict[str, Any]]) -> None:
        """Mark the nodes of ``nodelist`` finished: the next answer releases them."""
        self._finish([str(n["node_id"]) for n in nodelist], "done")

    def _finish(self, node_ids: list[str], outcome: str) -> None:
        with self._ep_lock:
            for node_id in node_ids:
                pending = self._ep_pending.get(node_id)
                if pending is not None:
                    pending.finished = True
                    pending.outcome = outcome
        log.info("delete of %s finished: %s", " ".join(node_ids), outcome)
        self._call_hook(self.on_delete_finished, node_ids, outcome)

    def delete_finished(self, node_id: str) -> bool:
        """Whether the node's delete is over (its answer then says max_wait_time 0)."""
        with self._ep_lock:
            pending = self._ep_pending.get(node_id)
            return pending is not None and pending.finished

    def has_pending_deletes(self) -> bool:
        """Whether CloudLab announced taking a node that it has not completed yet."""
        with self._ep_lock:
            self._forget_stale(time.time())
            return bool(self._ep_pending)

    def pending_delete_notices(self) -> list[DeleteNotice]:
        """The latest notice of every node CloudLab is taking back."""
        with self._ep_lock:
            return [p.notice for p in self._ep_pending.values()]

    def resource_values(self) -> dict[str, ResourceValue]:
        """The latest SetResourceValues value of every node (node_id -> value)."""
        with self._ep_lock:
            return dict(self._ep_values)

    def deletes_running(self) -> int:
        with self._ep_lock:
            return len(self._ep_jobs)

    def wait_deletes(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until no delete job runs; True when none does."""
        end = time.monotonic() + timeout
        while self.deletes_running():
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True

    def shutdown_deletes(self) -> None:
        """Kill running delete commands and stop the job pool (the manager's shutdown)."""
        with self._ep_lock:
            for job in self._ep_jobs:
                job.cancelled.set()
            pool, self._ep_pool = self._ep_pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _forget_stale(self, now: float) -> None:
        stale = [k for k, p in self._ep_pending.items()
                 if p.finished and p.notice.deadline + STALE_AFTER < now]
        for node_id in stale:
            del self._ep_pending[node_id]

    # -- hooks the manager overrides ---------------------------------------------------------
    def _call_hook(self, hook: Any, *args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            log.exception("%s failed", getattr(hook, "__name__", "endpoint hook"))

    def on_delete_pending(self, nodes: list[DeleteNotice]) -> None:
        """Every NotifyDeletePending (countdown repeats too), after validation."""

    def on_delete_complete(self, nodes: list[DeleteNotice]) -> None:
        """NotifyDeleteComplete: CloudLab has taken these nodes."""

    def on_resource_values(self, values: list[ResourceValue]) -> None:
        """SetResourceValues: CloudLab's value of each node (lower = reclaimed sooner)."""

    def on_delete_finished(self, node_ids: list[str], outcome: str) -> None:
        """The delete commands of these nodes ended: done, failed, killed or no-time."""
