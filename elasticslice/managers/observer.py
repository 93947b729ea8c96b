"""The observer: reads the CMs (SliverStatus, DiscoverResources) into the state store and
builds what the policy sees (:class:`~.policy.Observed`).

It writes node records through :class:`~.holdings.Holdings` and holds no lock of its own:
the cycle calls it one method at a time, and nothing a callback needs waits for its RPCs.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from elasticslice.managers.holdings import Holdings, node_dict, node_id_of
from elasticslice.managers.policy import Availability, NodeState, NodeView, Observed
from elasticslice.rspec.parse import count_nodes

log = logging.getLogger("elasticslice.managers.manager")

DONE_STATES = (NodeState.READY.value, NodeState.FAILED.value)
Decorate = Callable[[tuple[NodeView, ...]], tuple[NodeView, ...]]


class FreeNodes:
    """The free nodes' names per CM and hardware type, from the last advertisement read:
    what AddNodes' ``node`` takes to get a node of a type (CloudLab's AddNodes has no
    hardware type). The actuator takes names out as it asks for them, so the next AddNodes
    before a new advertisement asks for others; a name taken by someone meanwhile costs one
    refused AddNodes, and the next advertisement forgets it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_cm: dict[str, dict[str, list[str]]] = {}

    def set(self, cm: str, by_type: Mapping[str, Sequence[str]]) -> None:
        with self._lock:
            self._by_cm[cm] = {kind: list(names) for kind, names in by_type.items()}

    def of(self, cm: str) -> dict[str, list[str]]:
        """Hardware type -> free node names at ``cm`` (a copy; empty: none known)."""
        with self._lock:
            return {kind: list(names) for kind, names in self._by_cm.get(cm, {}).items()}

    def take(self, cm: str, names: Iterable[str]) -> None:
        """``names`` are not free any more (asked for, by us or anyone)."""
        gone = set(names)
        with self._lock:
            for kind, free in self._by_cm.get(cm, {}).items():
                free[:] = [n for n in free if n not in gone]


class Observer:
    """``state``: the store (a ``TrackedState``: its write count says when the node views
    must be rebuilt); ``holdings``; ``helper`` (told of nodes that settled);
    ``notify(subject, body)``; ``wake(*methods)``."""

    def __init__(self, state: Any, holdings: Holdings, helper: Any, *,
                 clock: Callable[[], float], notify: Callable[[str, str], None],
                 wake: Callable[..., None]) -> None:
        self.state = state
        self.holdings = holdings
        self.helper = helper
        self.clock = clock
        self.notify = notify
        self.wake = wake
        self.availability: dict[str, dict[str, Availability]] = {}
        self.free = FreeNodes()  # the free nodes' names, for AddNodes' node
        self.totals: dict[str, dict[str, int]] = {}
        self.last_status: dict[str, Any] = {}
        self.full_pass = 0  # the manage_once running (0: none)
        self.full_advertisement_in: dict[str, int] = {}
        #: added nodes that failed to start one after another (a success resets it), and
        #: when the last one failed: the policy backs off from adding (see ``_adds``)
        self.failed_in_a_row = 0
        self.last_failed_at: float | None = None
        self.startup_failed: set[tuple[str, str]] = set()  # (cm, client_id)
        self._views: tuple[int, tuple[NodeView, ...]] | None = None
        #: per CM, the SliverStatus nodes last read with nothing to do, and the state's
        #: writes then: the same answer on the same state is not gone through again
        self._quiet: dict[str, tuple[Any, int]] = {}
        #: per (CM, available), the last advertisement's digest and its counts
        self._ads: dict[tuple[str, bool], tuple[bytes, Any]] = {}

    # -- SliverStatus ---------------------------------------------------------------------
    def sliver_status(self, cm: Any) -> int:
        """Node states from SliverStatus: new, ready, failed and vanished nodes; how many
        records changed."""
        asked = self.clock()
        status = cm.sliver_status()
        self.last_status[cm.url] = status
        state = self.state
        quiet = self._quiet.pop(cm.url, None)
        if quiet is not None and quiet[0] is status.nodes and quiet[1] == state.writes:
            self._quiet[cm.url] = quiet    # nothing new in it, nothing changed here
            return 0
        now = self.clock()
        records = {r.client_id: r for r in state.nodes(cm.url)}
        adopting = not records and not state.nodes(cm.url, include_gone=True)
        # nodes an AddNodes or a DeleteNodes is about: the actuator records them (and why
        # they went: a manifest read between a DeleteNodes and its record once made a node
        # released early "not in the sliver any more")
        in_flight = {c for i in state.open_intents() if i.kind in ("add", "delete")
                     and i.cm == cm.url for c in i.client_ids}
        changes = 0
        waited = False   # a record left as it is for now (time may change that)
        settled: list[tuple[Any, str]] = []
        seen = set()
        for node in status.nodes:
            cid = node.client_id
            seen.add(cid)
            # a startup command that exited non-zero fails the node as a failed boot does
            value = (NodeState.FAILED if node.startup_failed
                     else NodeState.from_cm(node.status)).value
            nid = node_id_of(node.component_id)
            rec = state.node(cm.url, cid) if cid not in records else records[cid]
            if rec is not None and rec.gone_at is None and rec.state == value and \
                    (rec.node_id == nid or not nid):
                continue
            if rec is not None and rec.gone_at is not None and rec.gone_at > asked:
                waited = True
                continue   # given back while this status was on its way: it predates that
            fields: dict[str, Any] = {"state": value}
            if nid:
                fields["node_id"] = nid
            if rec is None or rec.gone_at is not None:
                fields.update(initial=adopting, added_at=now)
                log.info("%s: node %s (%s) found in the sliver", cm.url, cid, nid)
            rec = state.upsert_node(cm.url, cid, now=now, **fields)
            changes += 1
            if value in DONE_STATES:
                settled.append((rec, value))
                self._count_start(rec, value, node, now)
        self.helper.note_client_ids(seen)
        for cid, rec in records.items():
            # (added while this status was on its way: it predates the node, not its going)
            if cid in seen:
                continue
            waited = True
            if cid not in in_flight and not rec.added_at > asked:
                # CloudLab's notice of it is open: taken back (its NotifyDeleteComplete,
                # which says so, may come after this status)
                taken = rec.node_id and state.revocations.get(rec.node_id, cm.url)
                self.holdings.forget(rec, now, "taken back by CloudLab" if taken
                                     else "not in the sliver any more")
                changes += 1
        self._settled(settled)
        if not changes and not waited:
            self._quiet[cm.url] = (status.nodes, state.writes)
        return changes

    def _count_start(self, rec: Any, value: str, node: Any, now: float) -> None:
        key = (rec.cm, rec.client_id)
        if node.startup_failed:
            self.startup_failed.add(key)
        else:
            self.startup_failed.discard(key)
        if value == NodeState.FAILED.value and not rec.initial:
            self.failed_in_a_row += 1
            self.last_failed_at = now
        elif value == NodeState.READY.value and (
                not node.execute_state or node.execute_state == "exited"):
            self.started()  # no startup command, or one that ended well

    def started(self) -> None:
        """A node started as its experiment wants (its agent joined...): the run of
        failures, if any, is over."""
        self.failed_in_a_row = 0

    def _settled(self, settled: list[tuple[Any, str]]) -> None:
        for rec, value in settled:
            log.info("node %s (%s) is %s", rec.client_id, rec.node_id, value)
            self.helper.handle_added_node(node_dict(rec), value)
        if settled:
            lines = [f"{r.client_id} ({r.node_id}) at {r.cm}: {st}" for r, st in settled]
            first = f"node {settled[0][0].client_id} {settled[0][1]}"
            self.notify(first if len(settled) == 1 else f"{len(settled)} nodes settled",
                        "\n".join(lines))
            self.wake("get_system_state", "set_system_state", "add_nodes")

    # -- DiscoverResources ------------------------------------------------------------------
    def resources(self, cm: Any, *, available: bool) -> None:
        """Availability per hardware type ("*": all nodes), and the free nodes' names per
        type (:class:`FreeNodes`). The full advertisement counts free nodes too: in one
        ``manage_once`` the available-only one right after it is skipped."""
        if available and cm.url not in self.totals:
            self.resources(cm, available=False)
            return
        if available and self.full_pass and \
                self.full_advertisement_in.get(cm.url) == self.full_pass:
            return
        # counts only: building every node's record was a quarter of a 1,000-node cycle;
        # and an advertisement that came before is not counted again
        key = (cm.url, available)
        last = self._ads.get(key)
        digest, text = cm.advertisement(available, since=last[0] if last else None)
        if text is None and last is not None:
            ad = last[1]
        else:
            ad = count_nodes(text or "", f"advertisement of {cm.url}")
            self._ads[key] = (digest, ad)
        if available:
            avail = dict(ad.available_by_type or ad.total_by_type)
            avail["*"] = ad.not_unavailable
        else:
            totals = dict(ad.total_by_type)
            totals["*"] = ad.nodes
            self.totals[cm.url] = totals
            self.full_advertisement_in[cm.url] = self.full_pass
            avail = dict(ad.available_by_type)
            avail["*"] = ad.available
        self.free.set(cm.url, ad.free_by_type)
        totals = self.totals[cm.url]
        self.availability[cm.url] = {t: Availability(min(avail.get(t, 0), total), total)
                                     for t, total in totals.items()}

    # -- what the policy sees ----------------------------------------------------------------
    def views(self) -> tuple[NodeView, ...]:
        """The nodes as the policy sees them (rebuilt only after a state change)."""
        writes = self.state.writes
        if self._views is None or self._views[0] != writes:
            values = self.state.values()
            self._views = (writes, tuple(
                NodeView(client_id=rec.client_id, cm=rec.cm, state=NodeState(rec.state),
                         added_at=rec.added_at or 0.0, node_id=rec.node_id,
                         initial=bool(rec.initial),
                         value=rec.value if rec.value is not None
                         else values.get(rec.node_id or ""),
                         pending_delete=rec.pending_deadline is not None,
                         startup_failed=(rec.cm, rec.client_id) in self.startup_failed)
                for rec in self.state.nodes()))
        return self._views[1]

    def observe(self, *, decorate: Decorate | None = None, **demand: Any) -> Observed:
        """What the policy sees now; ``demand``: Observed's demand fields (demand,
        demand_cores, waiting_cores, cores_per_node); ``decorate``: adds what the hosted
        system knows of each node (busy, idle, agent)."""
        nodes = self.views()
        if decorate is not None:
            nodes = decorate(nodes)
        intents = self.state.open_intents()
        adding = sum(len(i.client_ids) for i in intents if i.kind == "add")
        deleting = frozenset([*(c for i in intents if i.kind == "delete" for c in i.client_ids),
                              *(r.client_id for r in self.state.to_release.rows())])
        return Observed(now=self.clock(), nodes=nodes, availability=dict(self.availability),
                        last_add=self._meta_float("last_add"),
                        last_delete=self._meta_float("last_delete"), adding=adding,
                        deleting=deleting, failed_in_a_row=self.failed_in_a_row,
                        last_failed_at=self.last_failed_at, **demand)

    def _meta_float(self, key: str) -> float | None:
        raw = self.state.get_meta(key)
        return float(raw) if raw else None

    def node_status(self, node: str, cms: Sequence[Any]) -> Any:
        """The last SliverStatus entry of client_id ``node`` at one of ``cms``."""
        for c in cms:
            status = self.last_status.get(c.url)
            entry = status.node(node) if status is not None else None
            if entry is not None:
                return entry
        return None
