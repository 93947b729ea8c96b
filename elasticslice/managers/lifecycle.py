"""The manager's lifecycle around the cycle: renewals, CloudLab's notices, the endpoint.

Functions of the manager (``m``), like :mod:`.actions`: ``renew`` (a cycle method),
``record_*`` (the endpoint hooks), ``start_endpoint`` / ``register_endpoint`` /
``stop_endpoint``.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from elasticslice.config import load_passphrase
from elasticslice.errors import ElasticSliceError, RPCError
from elasticslice.managers.actions import ensure_slice, forget_node, iso_utc, utc
from elasticslice.managers.cycle import one_line
from elasticslice.rpc.credential import expires_of

if TYPE_CHECKING:
    from elasticslice.managers.manager import SimpleElasticSliceManager as Manager

log = logging.getLogger("elasticslice.managers.manager")


# ---------------------------------------------------------------------- renewals
def renew(m: Manager) -> int:
    """Renew the slice at the SA and each sliver at its CM well before they expire."""
    now = m.clock()
    margin = max(m.renew_margin, 2 * m.manage_intervals.get("renew", 3600) + m.retry_interval)
    target = now + max(m.renew_hours * 3600, margin + 600)
    record = m.state.slice()
    if record is None:
        ensure_slice(m)
        record = m.state.slice()
    renewed = 0
    problems: list[str] = []
    slice_expires = record.expires if record and record.expires else None
    if slice_expires is None or slice_expires - now < margin:
        try:
            cred = m.server.renew_slice_sa(utc(target))
            slice_expires = expires_of(cred).timestamp()
            m.state.set_slice(m.server.slice_urn(), slice_expires)
            renewed += 1
            log.info("renewed the slice until %s", iso_utc(slice_expires))
        except ElasticSliceError as err:
            problems.append(f"slice (expires {iso_utc(slice_expires)}): {one_line(err)}")
    slivers = {s.cm: s for s in m.state.slivers()}
    for cm in m.cms:
        sliver = slivers.get(cm.url)
        if sliver is None or sliver.urn is None:
            continue
        if sliver.expires is not None and sliver.expires - now >= margin:
            continue
        until = min(target, slice_expires) if slice_expires else target
        try:
            cm.renew_slice(utc(until))
            m.state.set_sliver(cm.url, sliver.urn, until, sliver.status)
            renewed += 1
            log.info("renewed the sliver at %s until %s", cm.url, iso_utc(until))
        except ElasticSliceError as err:
            problems.append(f"sliver at {cm.url} (expires {iso_utc(sliver.expires)}): "
                            f"{one_line(err)}")
    if problems:
        text = "; ".join(problems)
        log.error("RENEWAL FAILED, the slice may lapse: %s", text)
        m.notify("RENEWAL FAILED", f"The slice may lapse: {text}")
        raise ElasticSliceError(f"renewal failed: {text}")
    return renewed


# ---------------------------------------------------------------------- CloudLab's notices
def _cm_of(m: Manager, node_id: str) -> tuple[str, Any]:
    rec = m.state.find_node(node_id)
    return (rec.cm if rec else m.cmlist[0]), rec


def record_delete_pending(m: Manager, notices: list[Any]) -> None:
    known = {p.node_id for p in m.state.pending_deletes() if not p.finished}
    now = m.clock()
    for n in notices:
        cm, rec = _cm_of(m, n.node_id)
        cid = n.client_id or (rec.client_id if rec else None)
        m.state.add_pending_delete(cm, n.node_id, cid, deadline=n.received + n.max_wait_time,
                                   now=now)
        if n.node_id not in known:
            log.warning("CloudLab is taking back %s (%s) within %d s", n.node_id, cid,
                        n.max_wait_time)
            m.notify(f"node {cid or n.node_id} revoked",
                     f"CloudLab takes back {n.node_id} ({cid}) within {n.max_wait_time} s")


def record_delete_complete(m: Manager, notices: list[Any]) -> None:
    now = m.clock()
    for n in notices:
        m.state.finish_pending_delete(n.node_id, now=now, outcome="complete")
        cm, rec = _cm_of(m, n.node_id)
        if rec is not None and rec.gone_at is None:
            forget_node(m, rec, now, "taken back by CloudLab")


def record_values(m: Manager, values: list[Any]) -> None:
    by_cm: dict[str, dict[str, float]] = {}
    for v in values:
        cm, _ = _cm_of(m, v.node_id)
        by_cm.setdefault(cm, {})[v.node_id] = float(v.value)
    for cm, vals in by_cm.items():
        m.state.set_values(cm, vals, now=m.clock())


# ---------------------------------------------------------------------- the endpoint
def start_endpoint(m: Manager) -> None:
    from elasticslice.rpc.endpoint import EndpointServer
    ecfg = m.endpoint_config
    client = m.server.config
    certfile = ecfg.certificate or client.certificate
    if ecfg.certificate is None:
        password = m.server._passphrase or load_passphrase(client)
    elif getattr(ecfg, "passphrase_file", None) is not None:
        password = ecfg.passphrase_file.read_text().strip()
    else:
        password = None
    if client.ca_bundle is None:
        raise ElasticSliceError("the callback endpoint needs [protogeni] ca_bundle (the CA "
                                "the CM's certificate chains to)")
    server = EndpointServer(m, certfile=certfile, keyfile=getattr(ecfg, "keyfile", None),
                            password=password, ca_file=client.ca_bundle,
                            allowed_urns=CmUrns(m, ecfg.cm_urn),
                            host=ecfg.address, port=ecfg.port)
    server.start()
    m.endpoint_server = server
    m.endpoint_url = ecfg.url or server.url
    m.registered = set()
    log.info("callback endpoint at %s", m.endpoint_url)


class CmUrns:
    """Who may call the endpoint: ``[endpoint] cm_urn``, else each CM's GetVersion ``urn``,
    asked when first needed (a CM that is down at start is asked again later; until then
    nobody is let in)."""

    def __init__(self, m: Manager, configured: str | None) -> None:
        self.m = m
        self.urns: frozenset[str] | None = frozenset({configured}) if configured else None

    def __call__(self) -> frozenset[str]:
        if self.urns is None:
            try:
                urns = [str(c.get_version().get("urn", "")) for c in self.m.cms]
            except ElasticSliceError as err:
                log.warning("cannot ask the CMs who they are (%s): refusing callbacks for "
                            "now", one_line(err))
                return frozenset()
            self.urns = frozenset(u for u in urns if u)
            log.info("callbacks accepted from %s", ", ".join(sorted(self.urns)))
        return self.urns


def register_endpoint(m: Manager, cm: Any) -> None:
    if m.endpoint_server is None or cm.url in m.registered:
        return
    try:
        wait = int(cm.get_server_defaults().get("maxwaittime", 0))
    except (RPCError, AttributeError, TypeError, ValueError):
        wait = 0
    cm.set_slice_client_endpoint(m.endpoint_url, policy="LIFO", defwaittime=max(0, wait))
    m.registered.add(cm.url)
    log.info("registered the endpoint %s at %s", m.endpoint_url, cm.dynslice_url)


def stop_endpoint(m: Manager) -> None:
    server, m.endpoint_server = m.endpoint_server, None
    for url in sorted(getattr(m, "registered", ())):
        cm = next(c for c in m.cms if c.url == url)
        try:
            cm.remove_slice_client_endpoint()
            log.info("removed the endpoint at %s", cm.dynslice_url)
        except ElasticSliceError as err:
            log.warning("cannot remove the endpoint at %s: %s", cm.dynslice_url, one_line(err))
    m.registered = set()
    if server is not None:
        m.shutdown_deletes()
        server.stop()
