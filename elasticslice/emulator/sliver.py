"""The CM's slivers: map requests to nodes, add and delete nodes, and give nodes back.

Every read-modify-write of a sliver or of the pool runs under ``ctx.lock`` and starts by
re-reading the sliver there (a copy read before the lock may be stale: another call may
have changed or deleted it meanwhile). Nothing slow happens under the lock: the tarfiles
step (every tarball URL the sliver will hold after a client's CreateSliver, AddNodes or
DeleteNodes, fetched again: :mod:`~elasticslice.emulator.tarfiles`) runs between a first
check under the lock and the change under it, and the processes of nodes that leave a slice
are killed by the :class:`Reaper` afterwards. Hooks in ``release_hooks`` hear about every
node that leaves a slice (the reclaimer uses them).
"""
from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticslice.emulator import pool
from elasticslice.emulator.authority import Urn, new_uuid
from elasticslice.emulator.context import Context
from elasticslice.emulator.geni import GeniFault
from elasticslice.emulator.manifest import mac_for
from elasticslice.emulator.reaper import Reaper, Teardown
from elasticslice.emulator.store import BootState, Holder, NodeRow, SliceRow, SliverRow
from elasticslice.emulator.tarfiles import Staging, TarfileStore
from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import RSpec, RSpecType

log = logging.getLogger(__name__)


def _executes(pairs: list[tuple[str, str]]) -> list[list[str]]:
    return [[shell or "sh", cmd] for shell, cmd in pairs]


@dataclass
class Change:
    """A sliver and its nodes as one change left them (read under the lock, so a manifest
    built from them is consistent), and the teardown of the nodes that left it."""

    sliver: SliverRow
    nodes: list[NodeRow]
    teardown: Teardown = field(default_factory=lambda: Teardown([]))


class SliverOps:
    """Sliver life cycle on top of the store and the pool."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.reaper = Reaper(ctx)
        self.tarfiles = TarfileStore(ctx.where, ctx.settings.latency, ctx.clock)
        self.rng = random.Random(ctx.settings.seed)  # the mapper's draws (serve --seed)
        self.release_hooks: list[Callable[[NodeRow, str], None]] = []

    def current(self, sliver: SliverRow) -> SliverRow:
        """The sliver as stored now (call under ``ctx.lock``); SEARCHFAILED when it was
        deleted (or replaced by another sliver) since ``sliver`` was read."""
        fresh = self.ctx.store.get_sliver(sliver.slice_urn)
        if fresh is None or fresh.sliver_urn != sliver.sliver_urn:
            raise GeniFault(GeniCode.SEARCHFAILED, f"No sliver for slice {sliver.slice_urn}")
        return fresh

    def snapshot(self, sliver: SliverRow) -> Change:
        """The sliver and its nodes as they are now, read together (for a manifest)."""
        with self.ctx.lock:
            return self._change(self.current(sliver))

    def _change(self, sliver: SliverRow, teardown: Teardown | None = None) -> Change:
        nodes = [n for n in self.ctx.store.nodes(slice_urn=sliver.slice_urn)
                 if n.holder is Holder.SLICE]
        return Change(sliver, nodes, teardown or Teardown([]))

    def _pick(self, wanted: list[pool.NodeRequest]) -> list[NodeRow]:
        return pool.pick_nodes(self.ctx.store, self.ctx.inventory, wanted,
                               reloading=self.reaper.busy(), rng=self.rng)

    def _held_urls(self, slice_urn: str, leaving: set[str] = frozenset()) -> list[str]:
        """Every tarball URL of the slice's nodes (but those in ``leaving``), each once."""
        return list(dict.fromkeys(
            url for n in self.ctx.store.nodes(slice_urn=slice_urn)
            if n.holder is Holder.SLICE and n.client_id not in leaving
            for url, _ in n.tarballs))

    # ---- creation
    def create(self, slice_row: SliceRow, owner_urn: str, request: RSpec,
               keys: list[dict[str, Any]]) -> Change:
        ctx = self.ctx
        if request.type is not RSpecType.REQUEST:  # (a manifest was taken as a request)
            raise GeniFault(GeniCode.BADARGS,
                            f"{'An' if request.type is RSpecType.ADVERTISEMENT else 'A'} "
                            f"{request.type.value} is not a request rspec")
        if not request.nodes:
            raise GeniFault(GeniCode.BADARGS, "The request rspec has no nodes")
        ids = [n.client_id or "" for n in request.nodes]
        self._check_client_ids(ids, set())
        request.check_request(lambda problem: GeniFault(GeniCode.BADARGS, problem))
        self._check_bound_here(request)
        iface_owner = {i.client_id: n.client_id for n in request.nodes for i in n.interfaces}
        for link in request.links:
            for ref in link.interfaces:
                if ref not in iface_owner:
                    raise GeniFault(GeniCode.BADARGS, f"Link {link.client_id} names unknown "
                                                      f"interface {ref}")
        if ctx.store.get_sliver(slice_row.urn) is not None:  # before fetching anything
            raise GeniFault(GeniCode.REFUSED, "Must delete existing sliver first")
        with ctx.lock:  # the mapper first (nothing fetched in vain), as on CloudLab
            self._pick([pool.NodeRequest(n.client_id or "", n.hardware_type, n.component_id)
                        for n in request.nodes])
        # the tarfiles step: every URL fetched before anything is allocated, outside the lock
        staging = self.tarfiles.fetch_all(url for n in request.nodes for url, _ in n.installs)
        try:
            return self._create(slice_row, owner_urn, request, keys, staging)
        finally:
            self.tarfiles.drop(staging)  # committed to the sliver, or not wanted

    def _create(self, slice_row: SliceRow, owner_urn: str, request: RSpec,
                keys: list[dict[str, Any]], staging: Staging) -> Change:
        ctx = self.ctx
        with ctx.lock:
            if ctx.store.get_sliver(slice_row.urn) is not None:
                raise GeniFault(GeniCode.REFUSED, "Must delete existing sliver first")
            wanted = [pool.NodeRequest(n.client_id or "", n.hardware_type, n.component_id)
                      for n in request.nodes]
            rows = self._pick(wanted)
            now = ctx.clock()
            sliver = SliverRow(slice_row.urn, ctx.identity.sliver_urn(str(ctx.next_id("sliver"))),
                               new_uuid(), owner_urn, slice_row.expires, now, [], keys)
            links = []
            for link in request.links:
                lan = ctx.next_id("lan")
                links.append({"client_id": link.client_id,
                              "sliver_id": ctx.identity.sliver_urn(str(ctx.next_id("sliver"))),
                              "interfaces": list(link.interfaces),
                              "link_type": link.link_type or "lan", "vlantag": str(lan),
                              "subnet": f"10.{10 + lan // 250}.{lan % 250 + 1}",
                              "next_host": 1, "vlan_tagging": link.vlan_tagging,
                              "link_multiplexing": link.link_multiplexing,
                              "best_effort": link.best_effort})
            sliver.links = links
            iface_link = {ref: link for link in links for ref in link["interfaces"]}
            logins = self._logins(owner_urn, keys)
            with ctx.store.transaction():
                for req_node, row in zip(request.nodes, rows):
                    ifaces = [(i.client_id or "", i.ip, i.netmask) for i in req_node.interfaces]
                    self._assign(row, sliver, req_node.client_id or "", req_node.sliver_type,
                                 req_node.disk_image, req_node.installs, req_node.executes,
                                 ifaces, iface_link, logins, now)
                    row.attrs["routable_control_ip"] = req_node.routable_control_ip
                ctx.store.put_sliver(sliver)
                ctx.store.put_nodes(rows)
            self.tarfiles.commit(staging, slice_row.urn, self._held_urls(slice_row.urn))
            change = self._change(sliver)
        self._boot(rows)
        log.info("sliver %s for %s: %d nodes", sliver.sliver_urn, slice_row.urn, len(rows))
        return change

    def _check_bound_here(self, request: RSpec) -> None:
        """Every node bound to a CM (``component_manager_id``), or pinned to a physical node
        (``component_id``), must be bound to this one: BADARGS otherwise. CloudLab's CM
        skips a node bound to another CM (a request for several clusters is sent whole to
        each); the box refuses it (docs/emulator.md, "Several clusters")."""
        ours = self.ctx.identity
        for node in request.nodes:
            cm = node.component_manager_id
            if cm and cm.lower() != ours.cm_urn.lower():
                raise GeniFault(GeniCode.BADARGS, f"Node {node.client_id} is bound to another "
                                                  f"CM ({cm}), not this one ({ours.cm_urn})")
            pinned = Urn.parse(node.component_id or "")
            if pinned is not None and pinned.authority.lower() != ours.domain.lower():
                raise GeniFault(GeniCode.BADARGS, f"Node {node.client_id} names a node of "
                                                  f"another CM ({node.component_id})")

    def add(self, sliver: SliverRow, specs: list[Any]) -> Change:
        """AddNodes: ``specs`` are :class:`elasticslice.rspec.NodeSpec` records. The
        tarfiles step fetches every URL of the sliver's nodes and of the new ones."""
        with self.ctx.lock:  # what can be refused at once is, before anything is fetched
            self._check_add(self.current(sliver), specs)
            held = self._held_urls(sliver.slice_urn)
        staging = self.tarfiles.fetch_all(held + [url for s in specs for url, _ in s.installs])
        try:
            return self._add(sliver, specs, staging)
        finally:
            self.tarfiles.drop(staging)

    def _check_add(self, sliver: SliverRow, specs: list[Any]) -> list[NodeRow]:
        """The new nodes' client_ids and LANs checked and nodes mapped (not yet held)."""
        current = self.ctx.store.nodes(slice_urn=sliver.slice_urn)
        self._check_client_ids([s.client_id for s in specs], {n.client_id for n in current})
        names = {link["client_id"] for link in sliver.links}
        for spec in specs:
            for lan in spec.lans:
                if lan not in names:
                    raise GeniFault(GeniCode.BADARGS, f"No such {lan} (a LAN asked for by "
                                                      f"node {spec.client_id})")
        return self._pick([pool.NodeRequest(s.client_id, s.hardware_type, s.component_id)
                           for s in specs])

    def _add(self, sliver: SliverRow, specs: list[Any], staging: Staging) -> Change:
        ctx = self.ctx
        with ctx.lock:
            sliver = self.current(sliver)
            rows = self._check_add(sliver, specs)
            by_name = {link["client_id"]: link for link in sliver.links}
            now = ctx.clock()
            logins = self._logins(sliver.creator_urn, sliver.keys)
            with ctx.store.transaction():
                for spec, row in zip(specs, rows):
                    iface_link = {}
                    for (cid, _, _), lan in zip(spec.interfaces, spec.lans):
                        by_name[lan]["interfaces"].append(cid)
                        iface_link[cid] = by_name[lan]
                    self._assign(row, sliver, spec.client_id, spec.sliver_type, spec.disk_image,
                                 spec.installs, spec.executes, spec.interfaces, iface_link,
                                 logins, now)
                ctx.store.put_sliver(sliver)
                ctx.store.put_nodes(rows)
            self.tarfiles.commit(staging, sliver.slice_urn, self._held_urls(sliver.slice_urn))
            change = self._change(sliver)
        self._boot(rows)
        return change

    def renew(self, sliver: SliverRow, expires: float) -> SliverRow:
        """RenewSlice: a new expiry for the sliver as stored now."""
        with self.ctx.lock:
            sliver = self.current(sliver)
            sliver.expires = expires
            self.ctx.store.put_sliver(sliver)
        return sliver

    def _check_client_ids(self, new: list[str], existing: set[str]) -> None:
        seen = set(existing)
        for cid in new:
            if not cid:
                raise GeniFault(GeniCode.BADARGS, "Every node needs a client_id")
            if cid in seen:
                raise GeniFault(GeniCode.BADARGS, f"Duplicate client_id: {cid}")
            seen.add(cid)

    def _logins(self, owner_urn: str, keys: list[dict[str, Any]]) -> list[str]:
        users = [owner_urn.rsplit("+", 1)[-1]]
        for entry in keys or []:
            if isinstance(entry, dict):
                login = entry.get("login") or str(entry.get("urn", "")).rsplit("+", 1)[-1]
                if login and login not in users:
                    users.append(login)
        return users

    def _assign(self, row: NodeRow, sliver: SliverRow, client_id: str, sliver_type: str | None,
                disk_image: str | None, installs: list[tuple[str, str]],
                executes: list[tuple[str, str]], ifaces: list[tuple[str, str | None, str | None]],
                iface_link: dict[str, dict[str, Any]], logins: list[str], now: float) -> None:
        ctx = self.ctx
        ident = ctx.identity
        slice_name = ident.slice_name(sliver.slice_urn)
        row.holder = Holder.SLICE
        row.tenant = ""
        row.slice_urn = sliver.slice_urn
        row.client_id = client_id
        row.sliver_urn = ident.sliver_urn(str(ctx.next_id("sliver")))
        row.sliver_type = sliver_type or "raw-pc"
        default_image = ctx.inventory.images[0] if ctx.inventory.images else "UBUNTU22-64-STD"
        row.disk_image = disk_image or ident.image_urn(default_image)
        row.boot_state = BootState.NOTREADY
        row.boot_started = row.allocated_at = now
        row.tarballs = [[u, p] for u, p in installs]
        row.attrs = {"hostname": f"{client_id}.{slice_name}.{ctx.config.project}.{ident.domain}",
                     "executes": _executes(executes), "logins": logins}
        row.interfaces = []
        for port, (cid, ip, netmask) in enumerate(ifaces, start=1):
            link = iface_link.get(cid)
            if ip is None and link is not None:
                ip = f"{link['subnet']}.{link['next_host']}"
                link["next_host"] += 1
                netmask = netmask or "255.255.255.0"
            row.interfaces.append({"client_id": cid, "ip": ip, "netmask": netmask,
                                   "mac": mac_for(row.node_id, cid), "port": f"eth{port}",
                                   "sliver_id": ident.sliver_urn(str(ctx.next_id("sliver")))})
        row.value = 1.0
        row.attrs["geni_key"] = secrets.token_urlsafe(24)  # what its geni-get shows (tmcd)
        boot = ctx.settings.latency.boot_seconds()
        if boot is not None:
            row.attrs["boot_seconds"] = boot

    def _boot(self, rows: list[NodeRow]) -> None:
        if self.ctx.boot is not None:
            for row in rows:
                self.ctx.boot.schedule(row)

    # ---- deletion
    def delete_nodes(self, sliver: SliverRow, client_ids: list[str], *, reason: str = "client",
                     allow_all: bool = False, tarfiles: bool = False) -> Change:
        """DeleteNodes (and reclamations): the nodes leave now; their teardown runs on. With
        ``tarfiles`` (a client's DeleteNodes, not the dynamic-slice server's reclamations)
        the tarfiles step runs first: every URL of the nodes that stay is fetched again,
        and when one cannot be, the call fails and the nodes stay."""
        if not tarfiles:
            return self._delete_nodes(sliver, client_ids, reason, allow_all, None)
        with self.ctx.lock:
            self._doomed(self.current(sliver), client_ids, allow_all)
            held = self._held_urls(sliver.slice_urn, leaving=set(client_ids))
        staging = self.tarfiles.fetch_all(held)
        try:
            return self._delete_nodes(sliver, client_ids, reason, allow_all, staging)
        finally:
            self.tarfiles.drop(staging)

    def _doomed(self, sliver: SliverRow, client_ids: list[str], allow_all: bool
                ) -> list[NodeRow]:
        current = {n.client_id: n for n in self.ctx.store.nodes(slice_urn=sliver.slice_urn)}
        for cid in client_ids:
            if cid not in current:
                raise GeniFault(GeniCode.BADARGS, f"No such node in sliver: {cid}")
        doomed = [current[c] for c in dict.fromkeys(client_ids)]
        if len(doomed) == len(current) and not allow_all:
            raise GeniFault(GeniCode.BADARGS, "Not allowed to delete all nodes; "
                                              "use DeleteSliver")
        return doomed

    def _delete_nodes(self, sliver: SliverRow, client_ids: list[str], reason: str,
                      allow_all: bool, staging: Staging | None) -> Change:
        ctx = self.ctx
        with ctx.lock:
            sliver = self.current(sliver)
            doomed = self._doomed(sliver, client_ids, allow_all)
            gone = {i["client_id"] for n in doomed for i in n.interfaces}
            for link in sliver.links:
                link["interfaces"] = [i for i in link["interfaces"] if i not in gone]
            with ctx.store.transaction():
                ctx.store.put_sliver(sliver)
                teardown = self.release(doomed, reason)
            if staging is not None:
                self.tarfiles.commit(staging, sliver.slice_urn,
                                     self._held_urls(sliver.slice_urn))
            return self._change(sliver, teardown)

    def delete_sliver(self, sliver: SliverRow, reason: str = "client", *,
                      cancel: bool = True) -> Teardown:
        """The sliver and its nodes go now; the nodes' teardown runs on (wait on the result
        for it). Unless ``cancel``, a sliver whose nodes are still booting is BUSY."""
        ctx = self.ctx
        with ctx.lock:
            sliver = self.current(sliver)
            rows = ctx.store.nodes(slice_urn=sliver.slice_urn)
            if not cancel and any(r.holder is Holder.SLICE and r.boot_state in (
                    BootState.NOTREADY, BootState.CHANGING) for r in rows):
                raise GeniFault(GeniCode.BUSY, "Slice is busy; setup is in progress")
            with ctx.store.transaction():
                teardown = self.release(rows, reason)
                ctx.store.delete_sliver(sliver.slice_urn)
            self.tarfiles.discard(sliver.slice_urn)
        log.info("sliver %s of %s deleted (%s)", sliver.sliver_urn, sliver.slice_urn, reason)
        return teardown

    def release(self, rows: list[NodeRow], reason: str) -> Teardown:
        """Take nodes out of their slice and free them (under ``ctx.lock``: quick); their
        processes are stopped and their sandboxes wiped by the reaper, and no slice gets
        them before that is done."""
        ctx = self.ctx
        with ctx.lock, ctx.store.transaction():
            for row in rows:
                old = NodeRow(**{k: getattr(row, k) for k in row.__dataclass_fields__})
                pool.release(row)
                ctx.store.put_node(row)
                for hook in self.release_hooks:
                    hook(old, reason)
            return self.reaper.hand_over(r.node_id for r in rows)
