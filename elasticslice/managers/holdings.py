"""What the slice holds: the node records of the state store, as the CM's manifests and
SliverStatus gave them, and what happens when a node comes or goes.

The observer and the actuator write node records through :class:`Holdings`; the notice
book asks it whether a notice names a node we hold (``node_id`` AND ``client_id`` must match
a live record). :meth:`Holdings.forget` is the one way a node leaves: the record is marked
gone and its revocation closed at once (local SQLite writes), while the helper's
``handle_deleted_node`` and the mail run on the manager's event thread, never on the
caller's (which may be CloudLab's).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from elasticslice.errors import RSpecError
from elasticslice.managers.policy import NodeState
from elasticslice.managers.records import NodeRecord
from elasticslice.rspec import parse as parse_rspec

log = logging.getLogger("elasticslice.managers.manager")


def node_id_of(component_id: str | None) -> str | None:
    if not component_id:
        return None
    return component_id.rsplit("+", 1)[-1] if component_id.startswith("urn:") else component_id


def node_dict(rec: NodeRecord) -> dict[str, Any]:
    """A node as the seed's helper hooks take it."""
    return {"client_id": rec.client_id, "node_id": rec.node_id, "hostname": rec.hostname,
            "cm": rec.cm}


class Holdings:
    """The nodes of the slice in ``state``. ``helper``: told of new client_ids and of nodes
    that left; ``notify(subject, body)``: mail; ``post(fn, *args)``: runs ``fn`` on the
    manager's event thread."""

    def __init__(self, state: Any, helper: Any, *, clock: Callable[[], float],
                 notify: Callable[[str, str], None],
                 post: Callable[..., None]) -> None:
        self.state = state
        self.helper = helper
        self.clock = clock
        self.notify = notify
        self.post = post

    def find(self, node_id: str, client_id: str | None) -> NodeRecord | None:
        """The live node whose node_id and client_id are these (None: not ours)."""
        if not node_id or not client_id:
            return None
        rec = self.state.find_node(node_id)
        if rec is None or rec.gone_at is not None or rec.client_id != client_id:
            return None
        return rec

    def cm_of(self, node_id: str) -> str | None:
        rec = self.state.find_node(node_id)
        return rec.cm if rec is not None and rec.gone_at is None else None

    def holds(self, client_id: str) -> bool:
        """Whether ``client_id`` is a node of ours (held, or in an AddNodes in flight)."""
        if any(r.client_id == client_id for r in self.state.nodes()):
            return True
        return any(i.kind == "add" and client_id in i.client_ids
                   for i in self.state.open_intents())

    def address_of(self, client_id: str) -> str | None:
        """The control address the manifest gives ``client_id`` (a node we hold), or None."""
        return next((r.ipv4 for r in self.state.nodes()
                     if r.client_id == client_id and r.gone_at is None and r.ipv4), None)

    def record_manifest(self, cm_url: str, manifest: str, now: float, *, initial: bool,
                        only: Iterable[str] | None = None) -> list[str]:
        """Record the nodes of a manifest (``only`` these client_ids); their names."""
        wanted = set(only) if only is not None else None
        names = []
        try:
            nodes = parse_rspec(manifest, f"manifest of {cm_url}").nodes
        except RSpecError as err:
            log.warning("cannot read the manifest of %s: %s", cm_url, err)
            nodes = []
        for node in nodes:
            if not node.client_id or (wanted is not None and node.client_id not in wanted):
                continue
            fields: dict[str, Any] = {"node_id": node_id_of(node.component_id),
                                      "hostname": node.hostname}
            if node.ipv4:
                fields["ipv4"] = node.ipv4
            if self.state.node(cm_url, node.client_id) is None:
                fields.update(state=NodeState.NOTREADY.value, initial=initial, added_at=now)
            self.state.upsert_node(cm_url, node.client_id, now=now, **fields)
            names.append(node.client_id)
        self.helper.note_client_ids(names)
        return names

    def forget(self, rec: NodeRecord, now: float, reason: str) -> None:
        """``rec`` left the slice: gone in the state, its revocation closed (early when we
        had released it by its deadline, else forced); the helper is told off this thread."""
        with self.state.transaction():
            current = self.state.node(rec.cm, rec.client_id)
            if current is None or current.gone_at is not None:
                return
            self.state.mark_gone(rec.cm, rec.client_id, now=now, reason=reason)
            if rec.node_id:
                self.state.revocations.finish(rec.node_id, now=now, cm=rec.cm)
        log.info("node %s (%s) left the slice: %s", rec.client_id, rec.node_id, reason)
        self.notify(f"node {rec.client_id} gone",
                    f"{rec.client_id} ({rec.node_id}) at {rec.cm}: {reason}")
        self.post(self.helper.handle_deleted_node, node_dict(rec))
