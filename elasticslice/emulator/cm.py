"""The component manager, API 2.0 (``/cm``, ``/cm/2.0``), as CloudLab's CM answers it."""
from __future__ import annotations

import logging
import xmlrpc.client
import zlib
from typing import Any

from elasticslice.emulator import manifest as mf
from elasticslice.emulator.authority import Privilege, Urn, from_epoch, utcnow
from elasticslice.emulator.context import Context
from elasticslice.emulator.dispatch import Call, Service
from elasticslice.emulator.geni import GeniFault, optional, require
from elasticslice.emulator.sa import parse_expiration
from elasticslice.emulator.sliver import SliverOps
from elasticslice.emulator.store import BootState, Holder, SliceRow, SliverRow
from elasticslice.errors import RSpecError
from elasticslice.rpc.codes import GeniCode
from elasticslice.rspec import AddNodesXMLError, nodespecs_from_add_args, parse

log = logging.getLogger(__name__)

RSPEC_VERSIONS = ["0.1", "0.2", "2", "3"]


class ComponentManager(Service):
    module = "cm"
    METHODS = frozenset({"GetVersion", "Resolve", "DiscoverResources", "CreateSliver",
                         "GetSliver", "SliverStatus", "RenewSlice", "DeleteSlice",
                         "DeleteSliver", "AddNodes", "DeleteNodes"})

    def __init__(self, ctx: Context, slivers: SliverOps) -> None:
        self.ctx = ctx
        self.slivers = slivers

    # ---- slice and credential resolution
    def _slice_of(self, urn: str) -> SliceRow:
        row = self.ctx.store.get_slice(urn)
        if row is None or row.expires <= self.ctx.clock():
            raise GeniFault(GeniCode.SEARCHFAILED, f"No such slice: {urn}")
        return row

    def _authorised(self, call: Call, *, need_sliver: bool
                    ) -> tuple[SliceRow, SliverRow | None]:
        """The slice (and sliver) a call is about, given a credential that grants it."""
        params = call.params
        credentials = require(params, "credentials", (list, str))
        slice_urn = optional(params, "slice_urn", str)
        privilege = Privilege.for_method(call.method)
        if slice_urn is None:
            # Classic clients: the CM finds the slice from the credential's target.
            cred = self.ctx.authority.pick(credentials, call.caller, None, privilege)
            target = Urn.parse(cred.target_urn)
            if target is not None and target.kind == "sliver":
                found = self.ctx.store.sliver_by_urn(cred.target_urn)
                if found is None:
                    raise GeniFault(GeniCode.SEARCHFAILED, f"No such sliver: {cred.target_urn}")
                slice_urn = found.slice_urn
            elif target is not None and target.kind == "slice":
                slice_urn = cred.target_urn
            else:
                raise GeniFault(GeniCode.BADARGS, "Missing argument: slice_urn")
        sliver = self.ctx.store.get_sliver(slice_urn)
        targets = {slice_urn} | ({sliver.sliver_urn} if sliver else set())
        self.ctx.authority.pick(credentials, call.caller, targets, privilege)
        slice_row = self._slice_of(slice_urn)
        if need_sliver and sliver is None:
            raise GeniFault(GeniCode.SEARCHFAILED, f"No sliver for slice {slice_urn}")
        return slice_row, sliver

    def _manifest(self, sliver: SliverRow) -> str:
        change = self.slivers.snapshot(sliver)
        return mf.manifest(self.ctx, change.sliver, change.nodes)

    # ---- methods
    def GetVersion(self, call: Call) -> Any:  # noqa: N802
        ident = self.ctx.identity
        return {"api": 2, "level": 1, "urn": ident.cm_urn, "hrn": f"{ident.domain}.cm",
                "input_rspec": RSPEC_VERSIONS, "output_rspec": "2",
                "ad_rspec": RSPEC_VERSIONS, "interface": "emulator",
                "geni_api": 2, "peers": {}, **self._box_network()}

    def _box_network(self) -> dict[str, Any]:
        """An extension of the box: where its nodes reach the control machine when they
        are on networks of their own (docs/emulator.md, "The node's network")."""
        fabric = self.ctx.boot.fabric if self.ctx.boot is not None else None
        return {"box_control_address": fabric.control_ip} if fabric is not None else {}

    def Resolve(self, call: Call) -> Any:  # noqa: N802
        urn = require(call.params, "urn")
        parsed = Urn.parse(urn)
        if parsed is None:
            raise GeniFault(GeniCode.BADARGS, f"Malformed urn: {urn}")
        if parsed.kind == "node":
            self.ctx.authority.pick(require(call.params, "credentials", (list, str)),
                                    call.caller, None, Privilege.INFO)
            node = self.ctx.store.get_node(parsed.name)
            if node is None:
                raise GeniFault(GeniCode.SEARCHFAILED, f"No such node: {urn}")
            return {"hrn": f"{parsed.authority}.{node.node_id}", "uuid": node.node_id,
                    "role": "node", "hostname": f"{node.node_id}.{parsed.authority}",
                    "urn": urn, "hardware_type": node.hardware_type,
                    "available": node.holder is Holder.FREE,
                    "rspec": mf.advertisement(self.ctx, False, "3", [node])}
        if parsed.kind == "sliver":
            found = self.ctx.store.sliver_by_urn(urn)
            if found is None:
                raise GeniFault(GeniCode.SEARCHFAILED, f"No such sliver: {urn}")
            call.params.setdefault("slice_urn", found.slice_urn)
            _, sliver = self._authorised(call, need_sliver=True)
            assert sliver is not None
            return {"urn": sliver.sliver_urn, "slice_urn": sliver.slice_urn,
                    "manifest": self._manifest(sliver)}
        if parsed.kind == "slice":
            call.params.setdefault("slice_urn", urn)
            slice_row, sliver = self._authorised(call, need_sliver=True)
            assert sliver is not None
            return {"urn": slice_row.urn, "sliver_urn": sliver.sliver_urn,
                    "creator_urn": sliver.creator_urn, "manifest": self._manifest(sliver),
                    "publicid": slice_row.urn}
        raise GeniFault(GeniCode.BADARGS, f"Cannot resolve a {parsed.kind}")

    def DiscoverResources(self, call: Call) -> Any:  # noqa: N802
        params = call.params
        self.ctx.authority.pick(require(params, "credentials", (list, str)), call.caller, None,
                                Privilege.INFO)
        version = str(params.get("rspec_version") or "2")
        if version not in ("2", "3"):
            raise GeniFault(GeniCode.BADVERSION, f"Unsupported rspec_version: {version}")
        ad = mf.advertisement(self.ctx, bool(params.get("available")), version)
        if params.get("compress"):
            return xmlrpc.client.Binary(zlib.compress(ad.encode("utf-8")))
        return ad

    def CreateSliver(self, call: Call) -> Any:  # noqa: N802
        slice_row, sliver = self._authorised(call, need_sliver=False)
        if sliver is not None:
            raise GeniFault(GeniCode.REFUSED, "Must delete existing sliver first")
        text = require(call.params, "rspec")
        keys = optional(call.params, "keys", list, [])
        try:
            request = parse(text, "rspec")
        except RSpecError as err:
            raise GeniFault(GeniCode.BADARGS, f"Bad rspec: {err}") from err
        change = self.slivers.create(slice_row, call.caller, request, keys)
        return [self._sliver_credential(slice_row, change.sliver, call),
                mf.manifest(self.ctx, change.sliver, change.nodes)]

    def _sliver_credential(self, slice_row: SliceRow, sliver: SliverRow, call: Call) -> str:
        """Signed by the CM, for the sliver: in full for the slice's creator, else (a
        delegate) within the credential the caller presented."""
        authority = self.ctx.authority
        within = None
        if call.caller != slice_row.creator_urn:
            within = authority.pick(call.params["credentials"], call.caller,
                                    {slice_row.urn, sliver.sliver_urn}, Privilege.INFO)
        return authority.credential(call.cert_pem, call.caller,
                                    authority.sliver_gid(sliver.sliver_urn), sliver.sliver_urn,
                                    from_epoch(sliver.expires), by_cm=True, within=within)

    def GetSliver(self, call: Call) -> Any:  # noqa: N802
        slice_row, sliver = self._authorised(call, need_sliver=True)
        assert sliver is not None
        return self._sliver_credential(slice_row, sliver, call)

    def SliverStatus(self, call: Call) -> Any:  # noqa: N802
        _, sliver = self._authorised(call, need_sliver=True)
        assert sliver is not None
        rows = [r for r in self.ctx.store.nodes(slice_urn=sliver.slice_urn)
                if r.holder is Holder.SLICE]
        status = mf.aggregate_status(rows)
        errors = [f"{r.client_id}: {r.attrs.get('error')}" for r in rows
                  if r.boot_state is BootState.FAILED]
        return {"state": "started", "status": status,
                "utc": int(self.ctx.clock()), "error": "; ".join(errors),
                "details": {r.sliver_urn: mf.node_details(self.ctx, r) for r in rows}}

    def RenewSlice(self, call: Call) -> Any:  # noqa: N802
        slice_row, sliver = self._authorised(call, need_sliver=True)
        assert sliver is not None
        raw = call.params.get("expiration") or call.params.get("valid_until")
        if raw is None:
            raise GeniFault(GeniCode.BADARGS, "Missing argument: expiration")
        expires = parse_expiration(raw)
        if expires <= utcnow():  # refusals are ERROR, as at the SA (PROTOCOL.md)
            raise GeniFault(GeniCode.ERROR, "Expiration is in the past")
        if expires.timestamp() > slice_row.expires + 1:
            raise GeniFault(GeniCode.ERROR, "Cannot renew past the slice expiration "
                                              f"({from_epoch(slice_row.expires):%Y-%m-%dT%H:%M:%SZ}); "
                                              "renew the slice at the SA first")
        self.slivers.renew(sliver, expires.timestamp())
        return expires.strftime("%Y-%m-%dT%H:%M:%S GMT")

    def DeleteSlice(self, call: Call) -> Any:  # noqa: N802
        _, sliver = self._authorised(call, need_sliver=True)
        assert sliver is not None
        cancel = bool(optional(call.params, "cancel", (bool, int), False))
        blocking = bool(optional(call.params, "blocking", (bool, int), False))
        return self._delete(sliver, cancel=cancel, blocking=blocking)

    def DeleteSliver(self, call: Call) -> Any:  # noqa: N802
        urn = require(call.params, "sliver_urn")
        found = self.ctx.store.sliver_by_urn(urn)
        if found is None:
            raise GeniFault(GeniCode.SEARCHFAILED, f"No such sliver: {urn}")
        call.params["slice_urn"] = found.slice_urn
        _, sliver = self._authorised(call, need_sliver=True)
        assert sliver is not None
        return self._delete(sliver)

    def _delete(self, sliver: SliverRow, *, cancel: bool = False, blocking: bool = False
                ) -> int:
        """DeleteSlice and DeleteSliver: BUSY while booting (unless ``cancel``); the endpoint
        goes too. The nodes' teardown continues in the background unless ``blocking``."""
        with self.ctx.lock:  # the sliver and its endpoint go together
            teardown = self.slivers.delete_sliver(sliver, cancel=cancel)
            self.ctx.store.delete_endpoint(sliver.slice_urn)
        if blocking:
            teardown.wait()
        return 1

    def AddNodes(self, call: Call) -> Any:  # noqa: N802
        """As GeniCMV2.pm.in ``AddNodes`` reads it (:mod:`elasticslice.rspec.addnodes`): five
        keys per node, a value that breaks the CM's XML is ERROR, the rest BADARGS; a named
        physical node must exist and be free; then the mapper and the tarfiles step."""
        _, sliver = self._authorised(call, need_sliver=True)
        assert sliver is not None
        if "nodes" not in call.params:
            raise GeniFault(GeniCode.BADARGS, "Missing argument: nodes")
        try:
            specs = nodespecs_from_add_args(call.params["nodes"])
        except AddNodesXMLError as err:
            raise GeniFault(GeniCode.ERROR, str(err)) from err
        except RSpecError as err:
            raise GeniFault(GeniCode.BADARGS, str(err)) from err
        for spec in specs:
            if spec.component_id:
                self._check_physical_node(spec.component_id)
        change = self.slivers.add(sliver, specs)
        return mf.manifest(self.ctx, change.sliver, change.nodes)

    def _check_physical_node(self, name: str) -> None:
        """GeniCMV2.pm.in ``AddNodes``: ``Node->Lookup``, then ``IsReserved``."""
        node = self.ctx.store.get_node(name)
        if node is None:
            raise GeniFault(GeniCode.BADARGS, f"Physical node {name} does not exist")
        if node.holder is not Holder.FREE or name in self.slivers.reaper.busy():
            raise GeniFault(GeniCode.BADARGS, f"Physical node {name} is not available")

    def DeleteNodes(self, call: Call) -> Any:  # noqa: N802
        _, sliver = self._authorised(call, need_sliver=True)
        assert sliver is not None
        nodes = require(call.params, "nodes", list)
        if not nodes or not all(isinstance(n, str) for n in nodes):
            raise GeniFault(GeniCode.BADARGS, "Malformed argument: nodes (client_ids)")
        change = self.slivers.delete_nodes(sliver, nodes, tarfiles=True)
        change.teardown.wait()  # outside the lock: the caller waits, nobody else does
        return mf.manifest(self.ctx, change.sliver, change.nodes)

