"""What the manager's cycle methods do (the I/O side of the manager); renewals, notices
and the endpoint are in :mod:`.lifecycle`.

Every function takes the manager (``m``: a :class:`~.manager.SimpleElasticSliceManager`) and
acts through its ``server`` (a ``ProtoGeniServer``) and its ``state`` (a ``ManagerState``).
Nothing here knows whether the CM is CloudLab or the emulator.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from elasticslice.errors import ElasticSliceError, RPCError, RSpecError, TransportError
from elasticslice.managers.cycle import one_line
from elasticslice.managers.deletes import DeleteJob
from elasticslice.managers.policy import Availability, NodeState, NodeView, Observed
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.credential import expires_of, parse_credential
from elasticslice.rspec import parse as parse_rspec

if TYPE_CHECKING:
    from elasticslice.managers.manager import SimpleElasticSliceManager as Manager

log = logging.getLogger("elasticslice.managers.manager")

DONE_STATES = (NodeState.READY.value, NodeState.FAILED.value)


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc)


def iso_utc(ts: float | None) -> str:
    return utc(ts).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "unknown"


def node_id_of(component_id: str | None) -> str | None:
    if not component_id:
        return None
    return component_id.rsplit("+", 1)[-1] if component_id.startswith("urn:") else component_id


def _node_dict(rec: Any) -> dict[str, Any]:
    return {"client_id": rec.client_id, "node_id": rec.node_id, "hostname": rec.hostname,
            "cm": rec.cm}


# ---------------------------------------------------------------------- slice and sliver
def create_slice(m: Manager) -> int:
    expires = utc(m.clock() + m.renew_hours * 3600)
    cred = m.server.register_slice(expiration=expires)
    m.state.set_slice(m.server.slice_urn(), expires_of(cred).timestamp())
    log.info("registered slice %s until %s", m.server.slice_urn(), expires_of(cred))
    m.notify("slice created", f"registered slice {m.server.slice_urn()}")
    return 1


def ensure_slice(m: Manager) -> int:
    try:
        cred = m.server.get_slice_credential()
    except RPCError as err:
        if err.code != GeniCode.SEARCHFAILED:
            raise
        return create_slice(m)
    m.state.set_slice(m.server.slice_urn(), expires_of(cred).timestamp())
    return 0


def create_sliver(m: Manager, cm: Any) -> int:
    rspec = m.create_rspec()
    cred, manifest = cm.create_sliver(rspec)
    info = parse_credential(cred)
    m.state.set_sliver(cm.url, info.target_urn, info.expires.timestamp(), "created")
    now = m.clock()
    names = _record_manifest(m, cm, manifest, now, initial=True)
    log.info("created the sliver at %s: %s", cm.url, " ".join(names))
    m.notify("sliver created", f"sliver at {cm.url}: {' '.join(names)}")
    return 1


def ensure_sliver(m: Manager, cm: Any) -> int:
    try:
        cred = cm.get_sliver()
    except RPCError as err:
        if err.code != GeniCode.SEARCHFAILED:
            raise
        return create_sliver(m, cm)
    info = parse_credential(cred)
    m.state.set_sliver(cm.url, info.target_urn, info.expires.timestamp(), "exists")
    return 0


def _record_manifest(m: Manager, cm: Any, manifest: str, now: float, *, initial: bool,
                     only: Iterable[str] | None = None) -> list[str]:
    wanted = set(only) if only is not None else None
    names = []
    try:
        nodes = parse_rspec(manifest, f"manifest of {cm.url}").nodes
    except RSpecError as err:
        log.warning("cannot read the manifest of %s: %s", cm.url, err)
        nodes = []
    for node in nodes:
        if not node.client_id or (wanted is not None and node.client_id not in wanted):
            continue
        fields: dict[str, Any] = {"node_id": node_id_of(node.component_id),
                                  "hostname": node.hostname}
        if m.state.node(cm.url, node.client_id) is None:
            fields.update(state=NodeState.NOTREADY.value, initial=initial, added_at=now)
        m.state.upsert_node(cm.url, node.client_id, now=now, **fields)
        names.append(node.client_id)
    m.note_client_ids(names)
    return names


# ---------------------------------------------------------------------- watching
def update_sliver_status(m: Manager, cm: Any) -> int:
    status = cm.sliver_status()
    m.last_status[cm.url] = status
    now = m.clock()
    records = {r.client_id: r for r in m.state.nodes(cm.url)}
    adopting = not records and not m.state.nodes(cm.url, include_gone=True)
    in_flight = {c for i in m.state.open_intents() if i.kind == "add" and i.cm == cm.url
                 for c in i.client_ids}
    changes = 0
    settled: list[tuple[Any, str]] = []
    seen = set()
    for node in status.nodes:
        cid = node.client_id
        seen.add(cid)
        state = NodeState.from_cm(node.status).value
        nid = node_id_of(node.component_id)
        rec = m.state.node(cm.url, cid) if cid not in records else records[cid]
        if rec is not None and rec.gone_at is None and rec.state == state and \
                (rec.node_id == nid or not nid):
            continue
        fields: dict[str, Any] = {"state": state}
        if nid:
            fields["node_id"] = nid
        if rec is None or rec.gone_at is not None:
            fields.update(initial=adopting, added_at=now)
            log.info("%s: node %s (%s) found in the sliver", cm.url, cid, nid)
        rec = m.state.upsert_node(cm.url, cid, now=now, **fields)
        changes += 1
        if state in DONE_STATES:
            settled.append((rec, state))
    m.note_client_ids(seen)
    for cid, rec in records.items():
        if cid not in seen and cid not in in_flight:
            forget_node(m, rec, now, "not in the sliver any more")
            changes += 1
    for rec, state in settled:
        log.info("node %s (%s) is %s", rec.client_id, rec.node_id, state)
        m.handle_added_node(_node_dict(rec), state)
    if settled:
        lines = [f"{r.client_id} ({r.node_id}) at {r.cm}: {st}" for r, st in settled]
        first = f"node {settled[0][0].client_id} {settled[0][1]}"
        m.notify(first if len(settled) == 1 else f"{len(settled)} nodes settled",
                 "\n".join(lines))
        m.wake("get_system_state", "set_system_state", "add_nodes")
    return changes


def forget_node(m: Manager, rec: Any, now: float, reason: str) -> None:
    m.state.mark_gone(rec.cm, rec.client_id, now=now, reason=reason)
    if rec.node_id:
        for p in m.state.pending_deletes():
            if p.node_id == rec.node_id and not p.finished:
                m.state.finish_pending_delete(rec.node_id, now=now, outcome="gone")
    log.info("node %s (%s) left the slice: %s", rec.client_id, rec.node_id, reason)
    m.notify(f"node {rec.client_id} gone", f"{rec.client_id} ({rec.node_id}) at {rec.cm}: "
                                           f"{reason}")
    m.handle_deleted_node(_node_dict(rec))


def reconcile(m: Manager) -> int:
    """Settle every open intent with what the CM's sliver holds (after a crash, or an
    answer that never came). An AddNodes none of whose nodes are there yet stays open for
    the client's call timeout after it was written: a CM may still carry out a call whose
    caller died, and the open intent keeps the policy from adding again meanwhile."""
    done = 0
    statuses: dict[str, Any] = {}
    grace = float(getattr(m.server.config, "timeout", 60.0))
    for intent in m.state.open_intents():
        m.note_client_ids(intent.client_ids)
        cm = next((c for c in m.cms if c.url == intent.cm), None)
        if cm is None:
            m.state.finish_intent(intent.id, now=m.clock(), outcome="failed")
            continue
        if cm.url not in statuses:
            try:
                statuses[cm.url] = {n.client_id: n for n in cm.sliver_status().nodes}
            except RPCError as err:
                if err.code != GeniCode.SEARCHFAILED:
                    raise
                statuses[cm.url] = {}
        present = statuses[cm.url]
        now = m.clock()
        if intent.kind == "add" and not any(c in present for c in intent.client_ids) \
                and now - intent.created < grace:
            log.info("add intent %d at %s: nothing there yet; waiting up to %.0f s for a "
                     "late AddNodes", intent.id, cm.url, intent.created + grace - now)
            continue
        for cid in intent.client_ids:
            node = present.get(cid)
            rec = m.state.node(cm.url, cid)
            if intent.kind == "add" and node is not None and (rec is None or rec.gone_at):
                m.state.upsert_node(cm.url, cid, now=now, node_id=node_id_of(node.component_id),
                                    state=NodeState.from_cm(node.status).value, initial=False,
                                    added_at=intent.created)
            elif intent.kind == "delete" and node is None and rec is not None \
                    and rec.gone_at is None:
                forget_node(m, rec, now, "deleted (reconciled)")
        log.info("reconciled %s intent %d at %s: %s", intent.kind, intent.id, cm.url,
                 " ".join(f"{c}:{'present' if c in present else 'absent'}"
                          for c in intent.client_ids))
        m.state.finish_intent(intent.id, now=now, outcome="reconciled")
        done += 1
    return done


def update_resources(m: Manager, cm: Any, *, available: bool) -> None:
    """Availability per hardware type ("*": all nodes) from DiscoverResources. The full
    advertisement counts free nodes too: in one ``manage_once`` the available-only one
    right after it is skipped."""
    if available and cm.url not in m.totals:
        update_resources(m, cm, available=False)
        return
    if available and m.full_pass and m.full_advertisement_in.get(cm.url) == m.full_pass:
        return
    ad = parse_rspec(cm.discover_resources(available=available), f"advertisement of {cm.url}")
    if available:
        avail = dict(ad.available_by_type or ad.total_by_type)
        avail["*"] = sum(1 for n in ad.nodes if n.available is not False)
    else:
        totals = dict(ad.total_by_type)
        totals["*"] = len(ad.nodes)
        m.totals[cm.url] = totals
        m.full_advertisement_in[cm.url] = m.full_pass
        avail = dict(ad.available_by_type)
        avail["*"] = sum(1 for n in ad.nodes if n.available)
    totals = m.totals[cm.url]
    m.availability[cm.url] = {t: Availability(min(avail.get(t, 0), total), total)
                              for t, total in totals.items()}


def observe(m: Manager) -> Observed:
    """What the policy sees now (the node views are rebuilt only after a state change)."""
    writes = m.state.writes
    if m.views is None or m.views[0] != writes:
        values = m.state.values()
        m.views = (writes, tuple(
            NodeView(client_id=rec.client_id, cm=rec.cm, state=NodeState(rec.state),
                     added_at=rec.added_at or 0.0, node_id=rec.node_id,
                     initial=bool(rec.initial),
                     value=rec.value if rec.value is not None else values.get(rec.node_id or ""),
                     pending_delete=rec.pending_deadline is not None)
            for rec in m.state.nodes()))
    nodes = m.views[1]
    intents = m.state.open_intents()
    adding = sum(len(i.client_ids) for i in intents if i.kind == "add")
    deleting = frozenset(c for i in intents if i.kind == "delete" for c in i.client_ids)
    return Observed(now=m.clock(), nodes=nodes, availability=dict(m.availability),
                    demand=m.demand, last_add=_meta_float(m, "last_add"),
                    last_delete=_meta_float(m, "last_delete"), adding=adding, deleting=deleting)


def _meta_float(m: Manager, key: str) -> float | None:
    raw = m.state.get_meta(key)
    return float(raw) if raw else None


# ---------------------------------------------------------------------- acting
def add(m: Manager, cm: Any, args: dict[str, dict[str, Any]]) -> int:
    cids = list(args)
    m.note_client_ids(cids)
    now = m.clock()
    intent = m.state.begin_intent("add", cm.url, cids, now=now)
    log.info("adding %d node(s) at %s: %s", len(cids), cm.url, " ".join(cids))
    try:
        manifest = cm.add_nodes(args)
    except RPCError as err:
        _settle_failed(m, intent, err)
        raise
    now = m.clock()
    _record_manifest(m, cm, manifest, now, initial=False, only=cids)
    for cid in cids:  # a manifest without them (or unreadable): still ours, not ready yet
        if m.state.node(cm.url, cid) is None:
            m.state.upsert_node(cm.url, cid, now=now, state=NodeState.NOTREADY.value,
                                initial=False, added_at=now)
    m.state.finish_intent(intent, now=now, outcome="done")
    m.state.set_meta("last_add", repr(now))
    m.notify(f"added {len(cids)} node(s)", f"AddNodes at {cm.url}: {' '.join(cids)}")
    return len(cids)


def _settle_failed(m: Manager, intent: int, err: RPCError) -> None:
    """A refused call changed nothing; a lost answer stays open until reconciled."""
    if isinstance(err, TransportError):
        log.warning("the outcome of intent %d is unknown (%s); reconciling", intent,
                    one_line(err))
        try:
            reconcile(m)
        except ElasticSliceError as again:
            log.warning("cannot reconcile yet (%s); the next status update will",
                        one_line(again))
        return
    m.state.finish_intent(intent, now=m.clock(), outcome="failed")


def delete(m: Manager, cm: Any, cids: list[str]) -> int:
    recs = [r for r in (m.state.node(cm.url, c) for c in cids) if r is not None]
    nodelist = [{"client_id": r.client_id, "node_id": r.node_id or "", "max_wait_time": 0}
                for r in recs]
    run_delete_commands(m, nodelist)
    now = m.clock()
    intent = m.state.begin_intent("delete", cm.url, cids, now=now)
    log.info("giving back %d node(s) at %s: %s (%s)", len(cids), cm.url, " ".join(cids),
             "; ".join(m.last_decision.reasons) if m.last_decision else "")
    try:
        cm.delete_nodes(cids)
    except RPCError as err:
        _settle_failed(m, intent, err)
        raise
    now = m.clock()
    for rec in recs:
        forget_node(m, rec, now, "given back")
    m.state.finish_intent(intent, now=now, outcome="done")
    m.state.set_meta("last_delete", repr(now))
    return len(cids)


def run_delete_commands(m: Manager, nodelist: list[dict[str, Any]]) -> None:
    """The helper's delete commands before a voluntary give-back: serially, each in its own
    process group, killed at ``delete_commands_timeout`` (never logging the commands)."""
    try:
        commands = m.get_delete_commands(nodelist) or []
    except Exception as err:
        log.warning("get_delete_commands failed: %s", one_line(err))
        return
    if commands:
        node_ids = [str(n.get("node_id") or n.get("client_id")) for n in nodelist]
        outcome = DeleteJob(node_ids, nodelist, list(commands),
                            deadline=time.time() + m.delete_commands_timeout).run()
        if outcome != "done":
            log.warning("delete commands for %s: %s", " ".join(node_ids), outcome)
