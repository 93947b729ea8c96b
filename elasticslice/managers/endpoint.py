"""The seed's client endpoints: what CloudLab calls when it takes nodes back or values them.

``ElasticSliceClientEndpoint`` answers SUCCESS to everything (after checking the params);
``SimpleElasticSliceClientEndpoint`` records delete notices in a notice book
(:class:`~.notices.NoticeBook`: one record per revocation, one deadline), has a releaser
release the revoked nodes (by default the helper's delete commands, in a child process
bounded by the deadline: :class:`~.deletes.CommandReleaser`; a pilots manager drains
pilots instead), and answers the countdown with ``max_wait_time`` 0 for the nodes released,
so CloudLab takes them early, and for nodes the book says we do not hold.

Serve either with :class:`elasticslice.rpc.endpoint.EndpointServer`. Every handler answers
at once: it takes no lock but the book's (memory and a local SQLite file), and what takes
time (commands, drains) runs on threads of the releaser's.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from elasticslice.managers.deletes import MAX_PARALLEL_DELETES, CommandReleaser
from elasticslice.managers.notices import MAX_NODES, DeleteNotice, Entry, NoticeBook
from elasticslice.managers.records import PendingDelete
from elasticslice.managers.state import ManagerState
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.endpoint import BadArgs, ProtoGeniClientServerEndpoint, response

if TYPE_CHECKING:
    from elasticslice.managers.helpers import ElasticSliceHelper

log = logging.getLogger(__name__)

MAX_ID = 256                # characters in a node_id / client_id
MAX_URN = 1024              # characters in a component_urn
MAX_WAIT_TIME = 2**31 - 1   # XML-RPC's int
KINDS = ("pending", "complete", "values")
__all__ = ["MAX_NODES", "MAX_PARALLEL_DELETES", "DeleteNotice", "ElasticSliceClientEndpoint",
           "PluginElasticSliceClientEndpoint", "Releaser", "ResourceValue",
           "SimpleElasticSliceClientEndpoint", "parse_nodelist"]


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


class Releaser(Protocol):
    """How revoked nodes are released (:class:`~.deletes.CommandReleaser`, or a pilots
    manager's drain). Every method returns at once; the releaser calls back (the endpoint's
    ``end_delete``, or the book's ``release``) when a node may go."""

    def start(self, revocations: Sequence[PendingDelete]) -> None: ...

    def hurry(self, revocation: PendingDelete) -> None: ...

    def gone(self, revocations: Sequence[PendingDelete], *, now: bool = False) -> None: ...

    def running(self) -> int: ...

    def close(self) -> None: ...


class SimpleElasticSliceClientEndpoint(ElasticSliceClientEndpoint):
    """Tracks CloudLab's notices and releases the revoked nodes.

    ``helper``: whose ``get_delete_commands(nodelist)`` gives the shell commands to run before
    nodes are given back (None: this object's own ``get_delete_commands`` when it has one,
    else no commands). ``delete_in_group``: all new nodes of one notice in one job (bounded
    by the earliest deadline), else one job per node. ``rlock``: the seed's, kept for its
    signature (the resource values are the state's, which has its own lock). ``book``: where notices are recorded
    (default: a book of this process, every notice counts); ``releaser``: how nodes are
    released (default: the helper's delete commands); ``released(node_ids, outcome)``: told
    when the release of revoked nodes ended (a manager gives them back); ``clock``: when a
    call arrived.
    """

    def __init__(self, helper: ElasticSliceHelper | None = None, delete_in_group: bool = True,
                 rlock: threading.RLock | None = None, *, book: NoticeBook | None = None,
                 releaser: Releaser | None = None,
                 released: Callable[[list[str], str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        ElasticSliceClientEndpoint.__init__(self)
        self.released = released
        self._helper = helper
        self.delete_in_group = delete_in_group
        self.clock = clock
        self.rlock = rlock if rlock is not None else threading.RLock()
        self.book = book if book is not None else NoticeBook(ManagerState.in_memory(),
                                                             clock=clock)
        self.releaser: Releaser = releaser if releaser is not None else CommandReleaser(
            self._delete_commands, self._finish, delete_in_group=delete_in_group, clock=clock)

    # -- the RPC methods ---------------------------------------------------------------------
    def NotifyDeletePending(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        nodes = parse_nodelist(params, kind="pending")
        entries = self.book.pending(nodes, self.clock())
        ours = [e for e in entries if e.ours]
        log.info("NotifyDeletePending: %d node(s), %d ours, %d new: %s", len(entries),
                 len(ours), sum(e.fresh for e in ours),
                 " ".join(f"{e.notice.node_id}({e.notice.max_wait_time}s)"
                          for e in entries[:20]))
        self._call_hook(self.on_delete_pending, [e.notice for e in entries])
        self._act(ours)
        answer = []
        for node, entry in zip(nodes, entries):
            copy = dict(node)
            if not entry.ours or copy["max_wait_time"] == 0 or \
                    self.book.released(entry.notice.node_id):
                copy["max_wait_time"] = 0
            answer.append(copy)
        return response(GeniCode.SUCCESS, answer)

    def _act(self, ours: list[Entry]) -> None:
        """Hand the notice's revocations on: start releasing the new ones, move a job's or a
        drain's deadline earlier, stop what CloudLab takes now (max_wait_time 0)."""
        taken = [e for e in ours if e.notice.max_wait_time == 0 and e.revocation is not None
                 and e.revocation.released is None]
        if taken:  # CloudLab could not wait: the node may be gone already
            self._call_hook(self.releaser.gone, [e.revocation for e in taken], now=True)
            fresh = [e.notice.node_id for e in taken if e.fresh]
            if fresh:
                self._finish(fresh, "no-time")
        start = [e.revocation for e in ours if e.fresh and e.notice.max_wait_time > 0]
        if start:
            self._call_hook(self.releaser.start, start)
        for e in ours:
            if e.hurried and e.notice.max_wait_time > 0:
                self._call_hook(self.releaser.hurry, e.revocation)

    def NotifyDeleteComplete(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        nodes = parse_nodelist(params, kind="complete")
        entries = self.book.complete(nodes, self.clock())
        log.info("NotifyDeleteComplete: %s", " ".join(
            e.notice.node_id + ("" if e.ours else "(not ours)") for e in entries[:20]))
        gone = [e.revocation for e in entries if e.revocation is not None]
        if gone:
            self._call_hook(self.releaser.gone, gone)
        self._call_hook(self.on_delete_complete, [e.notice for e in entries])
        return response(GeniCode.SUCCESS)

    def SetResourceValues(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        nodes = parse_nodelist(params, kind="values")
        values = [ResourceValue(n["node_id"], n["value"], n.get("client_id"),
                                n.get("component_urn")) for n in nodes]
        log.info("SetResourceValues: %d node(s)", len(values))
        self._call_hook(self.book.values, values)
        self._call_hook(self.on_resource_values, values)
        return response(GeniCode.SUCCESS)

    # -- deletes -----------------------------------------------------------------------------
    def _delete_commands(self, nodelist: list[dict[str, Any]]) -> list[str]:
        helper: Any = self._helper
        if helper is None and callable(getattr(self, "get_delete_commands", None)):
            helper = self
        if helper is None:
            return []
        commands = helper.get_delete_commands([dict(n) for n in nodelist]) or []
        if isinstance(commands, str) or not all(isinstance(c, str) for c in commands):
            raise TypeError("get_delete_commands must return a list of strings")
        return list(commands)

    def start_delete(self, nodelist: list[dict[str, Any]]) -> None:
        """Start releasing ``nodelist`` (items with node_id, max_wait_time): by default the
        helper's commands run serially in the background, killed at the deadline."""
        now = self.clock()
        revocations = []
        for n in nodelist:
            found = self.book.revocation(str(n["node_id"]))
            revocations.append(found or PendingDelete(
                "", str(n["node_id"]), n.get("client_id"),
                now + int(n.get("max_wait_time", 0)), now))
        self.releaser.start(revocations)

    def end_delete(self, nodelist: list[dict[str, Any]]) -> None:
        """Mark the nodes of ``nodelist`` finished: the next answer releases them."""
        self._finish([str(n["node_id"]) for n in nodelist], "done")

    def _finish(self, node_ids: list[str], outcome: str) -> None:
        self.book.release(node_ids, outcome)
        log.info("delete of %s finished: %s", " ".join(node_ids), outcome)
        if self.released is not None:
            self._call_hook(self.released, node_ids, outcome)
        self._call_hook(self.on_delete_finished, node_ids, outcome)

    def delete_finished(self, node_id: str) -> bool:
        """Whether the node was released (its answer then says max_wait_time 0)."""
        return self.book.released(node_id)

    def has_pending_deletes(self) -> bool:
        """Whether CloudLab announced taking a node that it has not completed yet."""
        return bool(self.book.open())

    def pending_delete_notices(self) -> list[DeleteNotice]:
        """Every revocation CloudLab has not completed, as its latest notice stands."""
        return [DeleteNotice(p.node_id, p.client_id,
                             max(0, round(p.deadline - (p.last_seen or p.first_seen))),
                             p.last_seen or p.first_seen) for p in self.book.open()]

    def resource_values(self) -> dict[str, ResourceValue]:
        """The latest SetResourceValues value of every node we hold (every node, without a
        manager): node_id -> value, as the state keeps them (the one place)."""
        return {node_id: ResourceValue(node_id, value, client_id, urn)
                for node_id, value, client_id, urn in self.book.recorded_values()}

    def deletes_running(self) -> int:
        return self.releaser.running()

    def wait_deletes(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until no delete job runs; True when none does."""
        end = time.monotonic() + timeout
        while self.deletes_running():
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True

    def shutdown_deletes(self) -> None:
        """Kill running delete commands and stop the releaser (the manager's shutdown)."""
        self.releaser.close()

    # -- hooks (subclasses override; the manager composes instead) ---------------------------
    def _call_hook(self, hook: Any, *args: Any, **kwargs: Any) -> None:
        try:
            hook(*args, **kwargs)
        except Exception:
            log.exception("%s failed", getattr(hook, "__name__", "endpoint hook"))

    def on_delete_pending(self, nodes: list[DeleteNotice]) -> None:
        """Every NotifyDeletePending (countdown repeats too), after validation."""

    def on_delete_complete(self, nodes: list[DeleteNotice]) -> None:
        """NotifyDeleteComplete: CloudLab has taken these nodes."""

    def on_resource_values(self, values: list[ResourceValue]) -> None:
        """SetResourceValues: CloudLab's value of each node (lower = reclaimed sooner)."""

    def on_delete_finished(self, node_ids: list[str], outcome: str) -> None:
        """The release of these nodes ended: done, failed, killed or no-time."""


class PluginElasticSliceClientEndpoint:
    """The seed's endpoint methods on an object that has one (``client_endpoint``), as
    :class:`~.helpers.PluginElasticSliceHelper` has a helper: what a manager mixes in so
    that it still answers the seed's endpoint calls, the endpoint being a part of its own."""

    client_endpoint: SimpleElasticSliceClientEndpoint

    def GetVersion(self, params: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: N802
        return self.client_endpoint.GetVersion(params)

    def NotifyDeletePending(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        return self.client_endpoint.NotifyDeletePending(params)

    def NotifyDeleteComplete(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        return self.client_endpoint.NotifyDeleteComplete(params)

    def SetResourceValues(self, params: dict[str, Any]) -> dict[str, Any]:  # noqa: N802
        return self.client_endpoint.SetResourceValues(params)

    def start_delete(self, nodelist: list[dict[str, Any]]) -> None:
        self.client_endpoint.start_delete(nodelist)

    def end_delete(self, nodelist: list[dict[str, Any]]) -> None:
        self.client_endpoint.end_delete(nodelist)

    def has_pending_deletes(self) -> bool:
        return self.client_endpoint.has_pending_deletes()

    def delete_finished(self, node_id: str) -> bool:
        return self.client_endpoint.delete_finished(node_id)
