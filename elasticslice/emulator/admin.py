"""Admin calls on ``/protogeni/xmlrpc/admin``: only the emulator's own admin certificate.

``Revoke {nodes: [node_id...]}``, ``Reboot {nodes: [node_id...]}``, ``SetLoad {busy: N}``,
``Report {}``, ``Status {}``. The ``elasticslice emulator revoke|reboot|load|report|status``
commands use them; ``report`` can also read the state file directly when no server runs.
"""
from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from elasticslice.emulator import pool
from elasticslice.emulator.context import Context
from elasticslice.emulator.dispatch import Call, Service
from elasticslice.emulator.geni import GeniFault, require
from elasticslice.emulator.boot import rebootable
from elasticslice.emulator.store import Store
from elasticslice.rpc.codes import GeniCode

if TYPE_CHECKING:
    from elasticslice.emulator.dynamic import Reclaimer


def _iso(ts: float) -> str:
    if not ts:
        return ""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def reclamation_report(store: Store) -> list[dict[str, Any]]:
    """Every reclamation: node, slice, why, when notified and released, forced or early."""
    return [{"node_id": r.node_id, "slice_urn": r.slice_urn, "client_id": r.client_id,
             "reason": r.reason, "tenant": r.tenant, "notified_at": _iso(r.notified_at),
             "deadline": _iso(r.deadline), "released_at": _iso(r.released_at),
             "notifications": r.notifications, "outcome": r.outcome}
            for r in store.reclaims()]


class AdminService(Service):
    module = "admin"
    METHODS = frozenset({"Revoke", "Reboot", "SetLoad", "Report", "Status"})

    def __init__(self, ctx: Context, reclaimer: Reclaimer) -> None:
        self.ctx = ctx
        self.reclaimer = reclaimer

    def Revoke(self, call: Call) -> Any:  # noqa: N802
        nodes = require(call.params, "nodes", list)
        if not nodes or not all(isinstance(n, str) for n in nodes):
            raise GeniFault(GeniCode.BADARGS, "nodes must be a list of node ids")
        return self.reclaimer.revoke(nodes)

    def Reboot(self, call: Call) -> Any:  # noqa: N802
        """Reboot nodes of slices (:meth:`elasticslice.emulator.boot.BootRunner.reboot`):
        every node is checked first, so one that cannot be rebooted reboots none."""
        nodes = require(call.params, "nodes", list)
        if not nodes or not all(isinstance(n, str) and n for n in nodes):
            raise GeniFault(GeniCode.BADARGS, "nodes must be a list of node ids")
        boot = self.ctx.boot
        if boot is None:
            raise GeniFault(GeniCode.ERROR, "this emulator boots no nodes")
        for node_id in dict.fromkeys(nodes):  # every node checked first: one bad, none goes
            rebootable(self.ctx.store.get_node(node_id), node_id)
        return {node_id: f"rebooting ({boot.reboot(node_id).client_id})"
                for node_id in dict.fromkeys(nodes)}

    def SetLoad(self, call: Call) -> Any:  # noqa: N802
        busy = require(call.params, "busy", int)
        if busy < 0:
            raise GeniFault(GeniCode.BADARGS, "busy must be >= 0")
        self.reclaimer.tenants.set_target(busy)
        self.reclaimer.wake()
        return self.reclaimer.tenants.target

    def Report(self, call: Call) -> Any:  # noqa: N802
        return reclamation_report(self.ctx.store)

    def Status(self, call: Call) -> Any:  # noqa: N802
        return {"pool": pool.counts(self.ctx.store),
                "slivers": [s.slice_urn for s in self.ctx.store.all_slivers()],
                "tenant_target": self.reclaimer.tenants.target if
                self.reclaimer.tenants.target is not None else -1,
                "faults": {k.value: v for k, v in self.ctx.faults.counts.items()}}
