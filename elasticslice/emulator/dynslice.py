"""The dynamic-slice server the client registers with: ``/protogeni/xmlrpc/dynslice``.

GetVersion, GetServerDefaults, SetSliceClientEndpoint, RemoveSliceClientEndpoint, and
SetResourceValues as an emulator extension (the client states its own node values for the
``CLIENT`` policy, missing = 1.0; CloudLab documents no such call). Reclamation itself is
:class:`elasticslice.emulator.dynamic.Reclaimer`.
"""
from __future__ import annotations

import ipaddress
import logging
import urllib.parse
from typing import TYPE_CHECKING, Any

from elasticslice.emulator.context import Context
from elasticslice.emulator.dispatch import Call, Service
from elasticslice.emulator.geni import GeniFault, optional, require
from elasticslice.emulator.store import EndpointRow, NodeRow
from elasticslice.rpc.codes import GeniCode

if TYPE_CHECKING:
    from elasticslice.emulator.dynamic import Reclaimer

log = logging.getLogger(__name__)

POLICIES = ("LIFO", "CLIENT")
DYNSLICE_VERSION = 1
MAX_URL = 2048


def _loopback(host: str | None) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


class DynamicSliceService(Service):
    module = "dynslice"
    METHODS = frozenset({"GetVersion", "GetServerDefaults", "SetSliceClientEndpoint",
                         "RemoveSliceClientEndpoint", "SetResourceValues"})
    POSITIONAL = {
        "SetSliceClientEndpoint": ("slice_urn", "url", "credentials", "policy", "defwaittime"),
        "RemoveSliceClientEndpoint": ("slice_urn", "credentials"),
        "SetResourceValues": ("slice_urn", "credentials", "nodelist"),
    }

    def __init__(self, ctx: Context, reclaimer: Reclaimer) -> None:
        self.ctx = ctx
        self.reclaimer = reclaimer

    def _authorise(self, call: Call) -> str:
        slice_urn = require(call.params, "slice_urn")
        credentials = require(call.params, "credentials", (list, str))
        sliver = self.ctx.store.get_sliver(slice_urn)
        targets = {slice_urn} | ({sliver.sliver_urn} if sliver else set())
        self.ctx.authority.pick(credentials, call.caller, targets)
        if self.ctx.store.get_slice(slice_urn) is None:
            raise GeniFault(GeniCode.SEARCHFAILED, f"No such slice: {slice_urn}")
        return slice_urn

    def GetVersion(self, call: Call) -> Any:  # noqa: N802
        return DYNSLICE_VERSION

    def GetServerDefaults(self, call: Call) -> Any:  # noqa: N802
        return {"maxwaittime": int(self.ctx.settings.max_wait), "policy": "LIFO"}

    def SetSliceClientEndpoint(self, call: Call) -> Any:  # noqa: N802
        slice_urn = self._authorise(call)
        url = require(call.params, "url")
        if len(url) > MAX_URL:
            raise GeniFault(GeniCode.BADARGS, f"Endpoint url longer than {MAX_URL} characters")
        parts = urllib.parse.urlparse(url)
        if parts.scheme != "https" or not parts.hostname:
            raise GeniFault(GeniCode.BADARGS, f"Endpoint url must be https://host:port/...: {url}")
        box = self.ctx.control_ips()  # this machine on the box's node networks (network.py)
        if not _loopback(parts.hostname) and not self.ctx.settings.allow_remote_endpoints \
                and parts.hostname not in box:
            raise GeniFault(GeniCode.BADARGS, "This emulator only calls endpoints on "
                                              f"127.0.0.1 (got {parts.hostname})")
        policy = str(optional(call.params, "policy", str, "LIFO")).upper()
        if policy not in POLICIES:
            raise GeniFault(GeniCode.BADARGS, f"Unknown policy {policy} (LIFO or CLIENT)")
        wait = optional(call.params, "defwaittime", int, 0)
        if wait < 0:
            raise GeniFault(GeniCode.BADARGS, f"defwaittime must be 0 (the server's maximum) "
                                              f"or more: {wait}")
        if wait > self.ctx.settings.max_wait:
            raise GeniFault(GeniCode.BADARGS, f"defwaittime {wait} is more than the server's "
                                              f"maxwaittime {self.ctx.settings.max_wait}")
        self.ctx.store.put_endpoint(EndpointRow(slice_urn, url, policy, wait,
                                                call.caller))
        log.info("slice %s: client endpoint %s, policy %s", slice_urn, url, policy)
        self.reclaimer.values.mark(slice_urn)
        return 1

    def RemoveSliceClientEndpoint(self, call: Call) -> Any:  # noqa: N802
        slice_urn = self._authorise(call)
        if self.ctx.store.get_endpoint(slice_urn) is None:
            raise GeniFault(GeniCode.SEARCHFAILED, f"No endpoint for {slice_urn}")
        self.ctx.store.delete_endpoint(slice_urn)
        return 1

    def SetResourceValues(self, call: Call) -> Any:  # noqa: N802
        """Emulator extension, client -> server: the client's own node values, which only
        the CLIENT policy uses. (On CloudLab, SetResourceValues is a call the server makes
        to the client's endpoint: see ``values.py``.)"""
        slice_urn = self._authorise(call)
        nodelist = require(call.params, "nodelist", list)
        nodes = {n.node_id: n for n in self.ctx.store.nodes(slice_urn=slice_urn)}
        by_client = {n.client_id: n for n in nodes.values()}
        updates: list[tuple[NodeRow, float]] = []
        for item in nodelist:
            if not isinstance(item, dict) or not isinstance(item.get("value"), (int, float)):
                raise GeniFault(GeniCode.BADARGS, "nodelist items need node_id|client_id, value")
            node = nodes.get(str(item.get("node_id", ""))) or \
                by_client.get(str(item.get("client_id", "")))
            if node is None:
                which = item.get("node_id", item.get("client_id"))
                raise GeniFault(GeniCode.BADARGS,
                                f"Not a node of this slice: {str(which)[:64]!r}")
            value = float(item["value"])
            if not 0.0 <= value <= 1.0:
                raise GeniFault(GeniCode.BADARGS, f"value must be within 0..1: {value}")
            updates.append((node, value))
        for node, value in updates:
            self.ctx.store.update_node(node.node_id, node.sliver_urn, value=value)
        return len(updates)
