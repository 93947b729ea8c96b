"""A run's timeline for its report: when it started, which node each pilot was, and when
CloudLab's notices came, drains ended and nodes went back (what ``troy plot`` marks).

The report's ``timeline`` (JSON; every time in epoch seconds)::

    {"started": 1764000000.0,
     "pilots": {"pilot.0003": {"node": "node-2", "host": "127.0.0.1", "site": "utah"}},
     "events": [{"time": ..., "kind": "notice", "node": "node-2"},
                {"time": ..., "kind": "drain", "node": "node-2"},     # its pilot emptied
                {"time": ..., "kind": "release", "node": "node-2", "why": "early"}]}

Read from the cluster while it runs (its pilots, its manager's state store and drains).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

EVENT_KINDS = ("notice", "drain", "release")


def pilot_nodes(framework: Any) -> dict[str, dict[str, str]]:
    """pilot id -> the node it ran on: ``node`` (its agent's name: the client_id),
    ``host`` (of its agent's address) and ``site`` (its node's CM's, ``utah``), for the
    pilots that have them."""
    out: dict[str, dict[str, str]] = {}
    for pilot in framework.list_pilots() if framework is not None else []:
        entry = {}
        if getattr(pilot, "worker_name", None):
            entry["node"] = str(pilot.worker_name)
        site = getattr(getattr(pilot, "description", None), "site", None)
        if site:
            entry["site"] = str(site)
        native = str(getattr(pilot, "native_id", None) or "")
        host = urlsplit(native).hostname if "://" in native else None
        if host:
            entry["host"] = host
        if entry:
            out[pilot.id] = entry
    return out


def node_events(manager: Any) -> list[dict[str, Any]]:
    """Notices, drains that emptied their pilot, and nodes given back, in time order."""
    if manager is None:
        return []
    events: list[dict[str, Any]] = []
    revoked: set[str] = set()
    for rev in manager.state.revocations.all():
        node = rev.client_id or rev.node_id
        revoked.add(node)
        if rev.first_seen:
            events.append({"time": rev.first_seen, "kind": "notice", "node": node})
        if rev.released is not None:
            events.append({"time": rev.released, "kind": "release", "node": node,
                           "why": rev.outcome or ("early" if rev.released <= rev.deadline
                                                  else "late")})
        plan = getattr(manager, "drains", {}).get(rev.node_id)
        if plan is not None and plan.emptied_at is not None:
            events.append({"time": plan.emptied_at, "kind": "drain", "node": node})
    for rec in manager.state.nodes(include_gone=True):
        if rec.gone_at is not None and rec.client_id not in revoked:
            events.append({"time": rec.gone_at, "kind": "release", "node": rec.client_id,
                           "why": rec.gone_reason or "given back"})
    return sorted(events, key=lambda e: (e["time"], EVENT_KINDS.index(e["kind"])))


def run_timeline(cluster: Any, started: float) -> dict[str, Any]:
    """The ``timeline`` of a report of a run on ``cluster`` that started at ``started``."""
    view = cluster.view() if hasattr(cluster, "view") else cluster.manager
    return {"started": started, "pilots": pilot_nodes(cluster.framework),
            "events": node_events(view)}
