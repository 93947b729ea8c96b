"""From stored nodes and links to RSpecs: manifests, advertisements, SliverStatus details."""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

from elasticslice.emulator.authority import from_epoch
from elasticslice.emulator.context import Context
from elasticslice.emulator.images import Images
from elasticslice.emulator.store import BootState, ExecState, Holder, NodeRow, SliverRow
from elasticslice.rspec import Interface, Link, Login, Node, build_advertisement, build_manifest

RAWSTATE = {BootState.NOTREADY: "SHUTDOWN", BootState.CHANGING: "BOOTING",
            BootState.READY: "ISUP", BootState.FAILED: "TBFAILED"}


def mac_for(node_id: str, iface: str) -> str:
    digest = hashlib.sha1(f"{node_id}/{iface}".encode()).hexdigest()
    return "02:" + ":".join(digest[i:i + 2] for i in range(0, 10, 2))


def manifest_node(ctx: Context, row: NodeRow) -> Node:
    ident = ctx.identity
    node_urn = ident.node_urn(row.node_id)
    logins = [Login(username=user, hostname=f"{row.node_id}.{ident.domain}", port=22,
                    authentication="ssh-keys") for user in row.attrs.get("logins", [])]
    ifaces = [Interface(client_id=i["client_id"], ip=i.get("ip"), netmask=i.get("netmask"),
                        mac=i.get("mac"), sliver_id=i.get("sliver_id"),
                        component_id=f"{node_urn}:{i.get('port', 'eth1')}")
              for i in row.interfaces]
    return Node(client_id=row.client_id, component_id=node_urn,
                component_manager_id=ident.cm_urn, sliver_id=row.sliver_urn, exclusive=True,
                hardware_type=row.hardware_type, sliver_type=row.sliver_type,
                disk_image=row.disk_image or None, hostname=row.attrs.get("hostname"),
                ipv4=ctx.boot.node_address(row.node_id) if ctx.boot else "127.0.0.1",
                logins=logins, interfaces=ifaces,
                installs=[(u, p) for u, p in row.tarballs],
                executes=[(s, c) for s, c in row.attrs.get("executes", [])],
                routable_control_ip=bool(row.attrs.get("routable_control_ip")))


def manifest_links(sliver: SliverRow) -> list[Link]:
    return [Link(client_id=link["client_id"], sliver_id=link.get("sliver_id"),
                 interfaces=list(link.get("interfaces", [])), link_type=link.get("link_type"),
                 vlan_tagging=link.get("vlan_tagging"),
                 link_multiplexing=link.get("link_multiplexing"),
                 best_effort=link.get("best_effort"), vlantag=str(link.get("vlantag", "0")))
            for link in sliver.links]


def manifest(ctx: Context, sliver: SliverRow, nodes: list[NodeRow] | None = None) -> str:
    rows = nodes if nodes is not None else ctx.store.nodes(slice_urn=sliver.slice_urn)
    rows = [r for r in rows if r.holder is Holder.SLICE]
    rows.sort(key=lambda r: (r.allocated_at, r.client_id))
    return build_manifest([manifest_node(ctx, r) for r in rows], manifest_links(sliver),
                          from_epoch(sliver.expires), validate=len(rows) <= 200)


def ad_node(ctx: Context, row: NodeRow, images: list[str]) -> Node:
    ident = ctx.identity
    return Node(component_id=ident.node_urn(row.node_id), component_manager_id=ident.cm_urn,
                component_name=row.node_id, exclusive=True, hardware_types=[row.hardware_type],
                sliver_type="raw-pc", disk_image=images[0] if images else None,
                disk_images=images[1:], available=row.holder is Holder.FREE)


def image_urns(ctx: Context) -> list[str]:
    """Every image a node boots: the stock ones (the inventory's), then the custom ones."""
    custom = Images(ctx.directory, ctx.identity, ctx.config.project)
    return [ctx.identity.image_urn(name) for name in ctx.inventory.images] + \
        [custom.urn(name) for name in custom.names()]


#: the last advertisements built, by everything they are built from: a manager asks every
#: cycle, and the inventory seldom changes between two asks
_ADS: OrderedDict[tuple[Any, ...], str] = OrderedDict()
_ADS_KEPT = 8
_ADS_LOCK = threading.Lock()


def advertisement(ctx: Context, available_only: bool, version: str,
                  rows: list[NodeRow] | None = None) -> str:
    rows = ctx.store.nodes() if rows is None else rows
    images = image_urns(ctx)
    key = (ctx.identity.cm_urn, available_only, version, tuple(images),
           tuple((r.node_id, r.hardware_type, r.holder is Holder.FREE) for r in rows))
    with _ADS_LOCK:
        if key in _ADS:
            _ADS.move_to_end(key)
            return _ADS[key]
    nodes = [ad_node(ctx, r, images) for r in rows
             if r.holder is Holder.FREE or not available_only]
    ad = build_advertisement(nodes, ctx.identity.cm_urn, version=version)
    with _ADS_LOCK:
        _ADS[key] = ad
        while len(_ADS) > _ADS_KEPT:
            _ADS.popitem(last=False)
    return ad


def node_details(ctx: Context, row: NodeRow) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "component_urn": ctx.identity.node_urn(row.node_id),
        "client_id": row.client_id,
        "state": "started",
        "status": row.boot_state.value,
        "rawstate": RAWSTATE[row.boot_state],
        "error": str(row.attrs.get("error", "")) if row.boot_state is BootState.FAILED else "",
    }
    if row.execute_state is not ExecState.NONE:
        detail["execute_state"] = row.execute_state.value
        if row.execute_status is not None:
            detail["execute_status"] = row.execute_status
    return detail


def aggregate_status(rows: list[NodeRow]) -> str:
    states = {r.boot_state for r in rows}
    if not states:
        return "ready"
    if len(states) == 1:
        return next(iter(states)).value
    if BootState.FAILED in states:
        return "mixed" if BootState.READY in states else "failed"
    return "changing"
