"""The actuator: acts at the SA and the CMs (slice, sliver, AddNodes, DeleteNodes) and owns
the intent log.

Intent before action, then reconcile: an intent row is written BEFORE each AddNodes and
DeleteNodes and closed after; one whose answer was lost (or whose caller died) stays open
until :meth:`Actuator.reconcile` settles it against the CM's sliver.

One way back: every node given back (a policy victim or a node it replaces, a revoked node
drained or whose delete commands finished) is first a row of the state's ``to_release``
(:meth:`Actuator.ask_release`, which wakes the cycle's ``release_nodes``), and only
:meth:`Actuator.release` gives them back, on that job's thread; a row outlives a restart.
The actuator holds no lock across its calls but the one that keeps two release passes
apart: the cycle runs its other methods one at a time, ``release_nodes`` on a thread of its
own (never behind a slow AddNodes), and the intents in flight in this process are left
alone by a reconcile.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from elasticslice.errors import ElasticSliceError, RPCError, TransportError
from elasticslice.managers.cycle import one_line
from elasticslice.managers.deletes import DeleteJob
from elasticslice.managers.holdings import Holdings, node_id_of
from elasticslice.managers.keeper import SliceKeeper
from elasticslice.managers.observer import FreeNodes
from elasticslice.managers.policy import NodeState
from elasticslice.managers.records import NodeRecord, Release, ReleaseSource
from elasticslice.rpc.codes import TRANSIENT_CODES, GeniCode
from elasticslice.rspec.addnodes import check_add_args, pin_add_args
from elasticslice.rspec.parse import count_nodes

log = logging.getLogger("elasticslice.managers.manager")


#: what a node given back is marked gone as, by why it was asked
GONE_AS = {ReleaseSource.POLICY.value: "given back", ReleaseSource.NOTICE.value: "released early"}


def _nothing(*_: Any) -> None:
    return None


class Actuator(SliceKeeper):
    """Calls through ``server`` (a ``ProtoGeniServer``) at ``cms``; records in ``state``
    and ``holdings``; ``helper`` says what the sliver and new nodes are; ``notify(subject,
    body)`` mails; ``free``: the free nodes' names per type (the observer's), from which a
    node of a wanted hardware type is asked for by name; ``wake(*methods)``: runs cycle
    methods now (``release_nodes`` once a node is to be given back)."""

    def __init__(self, server: Any, state: Any, holdings: Holdings, helper: Any,
                 cms: Sequence[Any], *, clock: Callable[[], float],
                 notify: Callable[[str, str], None], renew_hours: float,
                 delete_commands_timeout: float, free: FreeNodes | None = None,
                 wake: Callable[..., None] = _nothing) -> None:
        self.server = server
        self.state = state
        self.holdings = holdings
        self.helper = helper
        self.cms = list(cms)
        self.clock = clock
        self.notify = notify
        self.renew_hours = renew_hours
        self.delete_commands_timeout = delete_commands_timeout
        self.free = free or FreeNodes()  # the observer's, from the CMs' advertisements
        self.wake = wake
        self._releasing = threading.Lock()  # one release pass at a time (its DeleteNodes)
        self._kept: set[tuple[str, str]] = set()  # rows held back, said once
        self._lock = threading.Lock()   # the set below only, never across a call
        self._in_flight: set[int] = set()
        self._waiting: set[int] = set()  # open add intents whose wait was said once
        SliceKeeper.__init__(self)

    # -- the intent log -----------------------------------------------------------------------
    def _begin(self, kind: str, cm: Any, cids: list[str]) -> int:
        intent = self.state.begin_intent(kind, cm.url, cids, now=self.clock())
        with self._lock:
            self._in_flight.add(intent)
        return intent

    def _end(self, intent: int, outcome: str | None) -> None:
        with self._lock:
            self._in_flight.discard(intent)
        if outcome is not None:
            self.state.finish_intent(intent, now=self.clock(), outcome=outcome)

    def add(self, cm: Any, args: dict[str, dict[str, Any]]) -> int:
        """AddNodes of ``args`` (the helper's struct); how many were added.

        CloudLab's AddNodes reads five keys and no hardware type: a node the helper wants of
        a type (``hardware_type``) is asked for as ``node`` = a free node of that type from
        the CM's last advertisement (read again when it has too few), each a different one;
        when fewer are free than wanted, the others are left out (logged) and the policy
        asks again on a later cycle."""
        self.helper.note_client_ids(list(args))
        args, left_out = self._pin(cm, args)
        if left_out:
            log.warning("no free node of the wanted type at %s for %s (AddNodes names a free "
                        "node of a type: the last advertisement has none left); adding %d",
                        cm.url, " ".join(left_out), len(args))
        if not args:
            return 0
        check_add_args(args)  # what the CM would refuse: one line, before any call
        cids = list(args)
        pinned = [str(a["node"]) for a in args.values() if isinstance(a, dict) and "node" in a]
        intent = self._begin("add", cm, cids)
        log.info("adding %d node(s) at %s: %s", len(cids), cm.url, " ".join(cids))
        try:
            manifest = cm.add_nodes(args)
        except RPCError as err:
            self.free.take(cm.url, pinned)  # taken meanwhile, perhaps: the next pick differs
            self._settle_failed(intent, err)
            raise
        self.free.take(cm.url, pinned)
        now = self.clock()
        self.holdings.record_manifest(cm.url, manifest, now, initial=False, only=cids)
        for cid in cids:  # a manifest without them (or unreadable): still ours, not ready yet
            if self.state.node(cm.url, cid) is None:
                self.state.upsert_node(cm.url, cid, now=now, state=NodeState.NOTREADY.value,
                                       initial=False, added_at=now)
        self._end(intent, "done")
        self.state.set_meta("last_add", repr(now))
        self.notify(f"added {len(cids)} node(s)", f"AddNodes at {cm.url}: {' '.join(cids)}")
        return len(cids)

    def _pin(self, cm: Any, args: dict[str, dict[str, Any]]
             ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """The wire struct of ``args`` (a wanted type as a free node's name); when the
        names known run short, the CM's advertisement is read once more first."""
        wire, left_out = pin_add_args(args, self.free.of(cm.url))
        if left_out:
            ad = count_nodes(cm.discover_resources(available=True), f"advertisement of {cm.url}")
            self.free.set(cm.url, ad.free_by_type)
            wire, left_out = pin_add_args(args, self.free.of(cm.url))
        return wire, left_out

    def delete(self, cm: Any, cids: list[str], why: str = "") -> int:
        """The policy's choice: the helper's delete commands, then ``cids`` are asked to be
        given back (:meth:`release` does it); how many were asked."""
        recs = [r for r in (self.state.node(cm.url, c) for c in cids) if r is not None]
        self.run_delete_commands([{"client_id": r.client_id, "node_id": r.node_id or "",
                                   "max_wait_time": 0} for r in recs])
        self.ask_release(recs, ReleaseSource.POLICY.value, why)
        self.state.set_meta("last_delete", repr(self.clock()))
        return len(recs)

    def ask_release(self, recs: list[NodeRecord], source: str, reason: str) -> int:
        """Record ``recs`` in ``to_release`` (a node asked already keeps its first row) and
        wake ``release_nodes``; how many rows are new. Never calls out: a callback's thread
        may ask."""
        now = self.clock()
        with self.state.transaction():
            asked = sum(self.state.to_release.ask(r.cm, r.client_id, node_id=r.node_id,
                                               source=source, reason=reason, now=now)
                        for r in recs)
        if recs:
            self.wake("release_nodes")
        return asked

    def release(self) -> list[Release]:
        """Give back the nodes of ``to_release``: one DeleteNodes per CM (each node alone
        when the CM refuses them together), each under an intent; the rows given back.

        A row whose node is no longer held is dropped; one named by a delete intent still
        open from before (a manager that died in its DeleteNodes) waits for the reconcile.
        CloudLab refuses to delete a sliver's every node: then one row stays (a revoked
        node first, which CloudLab takes by its deadline anyway) until another node comes
        or it leaves. A refused DeleteNodes drops its row (the policy decides again; a
        revoked node's answer says max_wait_time 0 already); a transient failure or a lost
        answer keeps the rows for the next pass and raises."""
        with self._releasing:
            rows = self.state.to_release.rows()
            if not rows:
                return []
            busy = self.in_flight()
            unsettled = {(i.cm, c) for i in self.state.open_intents()
                         if i.kind == "delete" and i.id not in busy for c in i.client_ids}
            by_cm: dict[str, list[tuple[Release, NodeRecord]]] = {}
            for row in rows:
                rec = self.state.node(row.cm, row.client_id)
                if rec is None or rec.gone_at is not None or self._cm(row.cm) is None:
                    log.debug("%s at %s is no longer held: not given back", row.client_id,
                              row.cm)
                    self.state.to_release.drop(row.cm, [row.client_id])
                elif (row.cm, row.client_id) not in unsettled:
                    by_cm.setdefault(row.cm, []).append((row, rec))
            done: list[Release] = []
            error: RPCError | None = None
            for url, pairs in by_cm.items():
                pairs = self._keep_one(url, pairs)
                if not pairs:
                    continue
                try:
                    done += self._give_back(self._cm(url), pairs)
                except RPCError as err:  # the rows stay: the next pass tries again
                    error = error or err
            if error is not None:
                raise error
            return done

    def _cm(self, url: str) -> Any:
        return next((c for c in self.cms if c.url == url), None)

    def _keep_one(self, url: str, pairs: list[tuple[Release, NodeRecord]]
                  ) -> list[tuple[Release, NodeRecord]]:
        """``pairs`` less one when they are every node held at ``url`` (CloudLab refuses to
        delete a sliver's every node): a revoked node's row, else the newest."""
        if len(pairs) < len(self.state.nodes(url)):
            return pairs
        pairs = sorted(pairs, key=lambda p: (p[0].source == ReleaseSource.NOTICE.value,
                                             p[0].id))
        kept = pairs.pop()[0]
        if (url, kept.client_id) not in self._kept:
            self._kept.add((url, kept.client_id))
            log.info("%s stays for now: CloudLab keeps one node in a sliver (given back when "
                     "another comes, or it leaves)", kept.client_id)
        return pairs

    def _give_back(self, cm: Any, pairs: list[tuple[Release, NodeRecord]]) -> list[Release]:
        cids = [row.client_id for row, _ in pairs]
        why = "; ".join(dict.fromkeys(row.reason for row, _ in pairs if row.reason))
        try:
            self._delete(cm, cids, [(rec, GONE_AS[row.source]) for row, rec in pairs], why)
        except RPCError as err:
            if isinstance(err, TransportError) or err.code in TRANSIENT_CODES:
                raise
            if len(pairs) > 1:  # one node CloudLab took meanwhile refuses them all
                return [r for p in pairs for r in self._give_back(cm, [p])]
            row = pairs[0][0]
            self.state.to_release.drop(cm.url, cids)
            log.info("DeleteNodes of %s refused (%s): %s", row.client_id, one_line(err),
                     "the countdown answer releases it" if row.source ==
                     ReleaseSource.NOTICE.value else "the policy decides again")
            return []
        self.state.to_release.drop(cm.url, cids)
        return [row for row, _ in pairs]

    def _delete(self, cm: Any, cids: list[str], gone: list[tuple[NodeRecord, str]],
                why: str) -> None:
        intent = self._begin("delete", cm, cids)
        log.info("giving back %d node(s) at %s: %s%s", len(cids), cm.url, " ".join(cids),
                 f" ({why})" if why else "")
        try:
            cm.delete_nodes(cids)
        except RPCError as err:
            self._settle_failed(intent, err)
            raise
        now = self.clock()
        for rec, reason in gone:
            self.holdings.forget(rec, now, reason)
        self._end(intent, "done")

    def _settle_failed(self, intent: int, err: RPCError) -> None:
        """A refused call changed nothing; a lost answer stays open until reconciled."""
        if isinstance(err, TransportError):
            self._end(intent, None)
            log.warning("the outcome of intent %d is unknown (%s); reconciling", intent,
                        one_line(err))
            try:
                self.reconcile()
            except ElasticSliceError as again:
                log.warning("cannot reconcile yet (%s); the next status update will",
                            one_line(again))
            return
        self._end(intent, "failed")

    def in_flight(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._in_flight)

    def reconcile(self) -> int:
        """Settle every open intent (but those in flight here) with what the CM's sliver
        holds. An AddNodes none of whose nodes are there yet stays open for the client's
        call timeout after it was written: a CM may still carry out a call whose caller
        died, and the open intent keeps the policy from adding again meanwhile."""
        done = 0
        statuses: dict[str, Any] = {}
        grace = float(getattr(self.server.config, "timeout", 60.0))
        busy = self.in_flight()
        for intent in self.state.open_intents():
            if intent.id in busy:
                continue
            self.helper.note_client_ids(intent.client_ids)
            cm = next((c for c in self.cms if c.url == intent.cm), None)
            if cm is None:
                self.state.finish_intent(intent.id, now=self.clock(), outcome="failed")
                continue
            if cm.url not in statuses:
                statuses[cm.url] = self._present(cm)
            present = statuses[cm.url]
            if present is None:   # this CM cannot be read now: its intents wait, not others'
                continue
            now = self.clock()
            if intent.kind == "add" and not any(c in present for c in intent.client_ids) \
                    and now - intent.created < grace:
                said, self._waiting = intent.id in self._waiting, self._waiting | {intent.id}
                log.log(logging.DEBUG if said else logging.INFO,  # once, not every cycle
                        "add intent %d at %s: nothing there yet; waiting up to %.0f s for "
                        "a late AddNodes", intent.id, cm.url, intent.created + grace - now)
                continue
            self._waiting.discard(intent.id)
            self._settle(intent, cm, present, now)
            done += 1
        return done

    def _present(self, cm: Any) -> dict[str, Any] | None:
        """The nodes of the sliver at ``cm`` by client_id ({} without a sliver); None when
        the CM cannot be read now (down, BUSY): its intents wait for a later reconcile."""
        try:
            return {n.client_id: n for n in cm.sliver_status().nodes}
        except RPCError as err:
            if err.code == GeniCode.SEARCHFAILED:
                return {}
            log.warning("cannot reconcile the intents at %s yet: %s", cm.url, one_line(err))
            return None

    def _settle(self, intent: Any, cm: Any, present: dict[str, Any], now: float) -> None:
        for cid in intent.client_ids:
            node = present.get(cid)
            rec = self.state.node(cm.url, cid)
            if intent.kind == "add" and node is not None and (rec is None or rec.gone_at):
                self.state.upsert_node(cm.url, cid, now=now,
                                       node_id=node_id_of(node.component_id),
                                       state=NodeState.from_cm(node.status).value,
                                       initial=False, added_at=intent.created)
            elif intent.kind == "delete" and node is None and rec is not None \
                    and rec.gone_at is None:
                self.holdings.forget(rec, now, "deleted (reconciled)")
        log.info("reconciled %s intent %d at %s: %s", intent.kind, intent.id, cm.url,
                 " ".join(f"{c}:{'present' if c in present else 'absent'}"
                          for c in intent.client_ids))
        self.state.finish_intent(intent.id, now=now, outcome="reconciled")

    def pending(self, kind: str, node: str | None, urls: set[str]) -> bool:
        """Whether an open intent of ``kind`` at ``urls`` names ``node`` (any node: None)."""
        return any(i.kind == kind and i.cm in urls and (node is None or node in i.client_ids)
                   for i in self.state.open_intents())

    def run_delete_commands(self, nodelist: list[dict[str, Any]]) -> None:
        """The helper's delete commands before a voluntary give-back: serially, each in its
        own process group, killed at ``delete_commands_timeout`` (never logging them)."""
        try:
            commands = self.helper.get_delete_commands(nodelist) or []
        except Exception as err:
            log.warning("get_delete_commands failed: %s", one_line(err))
            return
        if commands:
            node_ids = [str(n.get("node_id") or n.get("client_id")) for n in nodelist]
            outcome = DeleteJob(node_ids, nodelist, list(commands),
                                deadline=self.clock() + self.delete_commands_timeout,
                                clock=self.clock).run()
            if outcome != "done":
                log.warning("delete commands for %s: %s", " ".join(node_ids), outcome)
