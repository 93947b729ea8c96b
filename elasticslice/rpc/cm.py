"""CM v2 and dynamic-slice calls at one component manager, and the sliver status record.

Every CM call that needs a credential sends ``credentials`` as an ARRAY (a singleton is
refused by CloudLab) holding the slice credential, or the self credential where no slice
is involved (DiscoverResources, resolving a node).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
import zlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from elasticslice.errors import RPCError

if TYPE_CHECKING:
    from elasticslice.rpc.client import ProtoGeniServer

log = logging.getLogger(__name__)

MAX_ADVERTISEMENT = 256 * 1024 * 1024


def default_dynslice_url(cm_url: str) -> str:
    """``https://h:p/protogeni/xmlrpc/cm[/2.0]`` → ``https://h:p/protogeni/xmlrpc/dynslice``."""
    parts = urlsplit(cm_url)
    path = re.sub(r"/cm(/2\.0)?/?$", "", parts.path) + "/dynslice"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass
class NodeStatus:
    """One node of SliverStatus ``details`` (CloudLab's strings, unchanged)."""

    sliver_urn: str
    client_id: str
    status: str
    state: str
    component_id: str = ""
    error: str = ""
    rawstate: str = ""
    execute_state: str | None = None
    execute_status: str | None = None

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def startup_failed(self) -> bool:
        """Its startup command exited non-zero (the node may be up, but it is not what its
        experiment asked for)."""
        return self.execute_state == "exited" and self.execute_status not in (None, "", "0")


@dataclass
class SliverStatus:
    """SliverStatus: aggregate ``status`` (ready|notready|changing|failed|mixed), ``state``
    (started|stopped|mixed), and one :class:`NodeStatus` per node, sorted by client_id."""

    status: str
    state: str
    error: str = ""
    utc: int | None = None
    nodes: list[NodeStatus] = field(default_factory=list)

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> SliverStatus:
        if not isinstance(value, dict):
            raise RPCError("SliverStatus answered something that is not a struct",
                           method="SliverStatus")
        nodes = []
        details = value.get("details") or {}
        for sliver_urn, d in (details.items() if isinstance(details, dict) else ()):
            d = d if isinstance(d, dict) else {}
            nodes.append(NodeStatus(
                sliver_urn=str(sliver_urn), client_id=str(d.get("client_id", "")),
                status=str(d.get("status", "")), state=str(d.get("state", "")),
                component_id=str(d.get("component_urn", "") or ""),
                error=str(d.get("error", "") or ""), rawstate=str(d.get("rawstate", "") or ""),
                execute_state=_opt(d.get("execute_state")),
                execute_status=_opt(d.get("execute_status"))))
        nodes.sort(key=lambda n: n.client_id)
        utc = value.get("utc")
        return cls(status=str(value.get("status", "")), state=str(value.get("state", "")),
                   error=str(value.get("error", "") or ""),
                   utc=utc if isinstance(utc, int) else None, nodes=nodes)

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def node(self, client_id: str) -> NodeStatus | None:
        return next((n for n in self.nodes if n.client_id == client_id), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _same_but_utc(value: dict[str, Any], last: dict[str, Any]) -> bool:
    """Two SliverStatus values alike in all but their time (a C-level compare of the
    details: a tenth of reading them again)."""
    return value.keys() == last.keys() and all(
        value[k] == last[k] for k in value if k != "utc")


def _opt(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def format_expiration(when: dt.datetime) -> str:
    """ISO-8601 UTC (``YYYY-MM-DDTHH:MM:SSZ``), which SA and CM both accept."""
    if when.tzinfo is None:
        raise ValueError("expiration must be timezone-aware")
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ComponentManager:
    """The calls of one CM (``url``) on behalf of ``server``'s user and slice."""

    def __init__(self, server: ProtoGeniServer, url: str, dynslice_url: str | None = None) -> None:
        self.server = server
        self.url = url
        self.dynslice_url = dynslice_url or default_dynslice_url(url)
        self.host = urlsplit(url).hostname or url
        # the last SliverStatus (its value, what it was read into): an unchanged one is not
        # read again
        self._last_status: tuple[dict[str, Any], SliverStatus] | None = None
        #: SliverStatus calls this CM answered (each: our sliver was there)
        self.status_answers = 0

    def __repr__(self) -> str:
        return f"ComponentManager({self.url!r})"

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One raw CM call; the value on SUCCESS, else RPCError."""
        return self.server.transport.call(self.url, method, params or {})

    def _slice_call(self, method: str, params: dict[str, Any] | None = None,
                    url: str | None = None) -> Any:
        slice_urn = self.server.slice_urn()
        target = url or self.url

        def use(cred: str) -> Any:
            args = {"slice_urn": slice_urn, "credentials": [cred], **(params or {})}
            return self.server.transport.call(target, method, args)
        return self.server.with_slice_credential(use, slice_urn)

    def _self_call(self, method: str, params: dict[str, Any]) -> Any:
        server = self.server
        return server.with_credential(
            server.user_urn, lambda: server.sa_call("GetCredential"),
            lambda c: self.call(method, {**params, "credentials": [c]}))

    # ---- CM v2
    def get_version(self) -> dict[str, Any]:
        return self.call("GetVersion")

    def resolve(self, urn: str | None = None) -> dict[str, Any]:
        """Resolve a slice (default: ours), sliver or node at this CM."""
        urn = urn or self.server.slice_urn()
        if "+node+" in urn:
            return self._self_call("Resolve", {"urn": urn})
        return self.server.with_slice_credential(
            lambda c: self.call("Resolve", {"urn": urn, "credentials": [c]}))

    def discover_resources(self, available: bool = False, compress: bool = True,
                           rspec_version: str = "3") -> str:
        """The advertisement RSpec (text); ``compress`` transfers it zlib-compressed."""
        text = self.advertisement(available, compress=compress, rspec_version=rspec_version)[1]
        assert text is not None
        return text

    def advertisement(self, available: bool = False, *, since: bytes | None = None,
                      compress: bool = True, rspec_version: str = "3"
                      ) -> tuple[bytes, str | None]:
        """DiscoverResources as ``(digest, text)``: the digest of the answer as it came, and
        the advertisement's text, or None when that digest is ``since`` (the caller read
        this very answer before: nothing is inflated or decoded)."""
        value = self._self_call("DiscoverResources", {"available": bool(available),
                                                      "compress": bool(compress),
                                                      "rspec_version": str(rspec_version)})
        if isinstance(value, (bytes, bytearray)):
            digest = hashlib.blake2b(value, digest_size=16).digest()
            if digest == since:
                return digest, None
            inflater = zlib.decompressobj()
            try:
                data = inflater.decompress(bytes(value), MAX_ADVERTISEMENT)
            except zlib.error as err:
                raise RPCError(f"compressed advertisement is corrupt: {err}",
                               method="DiscoverResources", server=self.url) from err
            if inflater.unconsumed_tail:
                raise RPCError("advertisement too large", method="DiscoverResources",
                               server=self.url)
            return digest, data.decode("utf-8")
        if not isinstance(value, str):
            raise RPCError("advertisement is neither text nor base64",
                           method="DiscoverResources", server=self.url)
        digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"),
                                 digest_size=16).digest()
        return digest, (None if digest == since else value)

    def create_sliver(self, rspec: str, keys: list[dict[str, Any]] | None = None
                      ) -> tuple[str, str]:
        """CreateSliver; returns ``(sliver_credential, manifest)``. ``keys`` default: the
        user's keys from the SA (GetKeys v2), as CloudLab's own clients do."""
        if keys is None:
            keys = [k for k in self.server.get_keys(2) if isinstance(k, dict)]
        value = self._slice_call("CreateSliver", {"rspec": rspec, "keys": keys})
        if not (isinstance(value, list) and len(value) == 2):
            raise RPCError("CreateSliver answered something other than [credential, manifest]",
                           method="CreateSliver", server=self.url)
        return str(value[0]), str(value[1])

    def get_sliver(self) -> str:
        """The sliver credential."""
        return self._slice_call("GetSliver")

    def sliver_status(self) -> SliverStatus:
        """SliverStatus. When only its ``utc`` changed since the last one, the answer shares
        the last one's ``nodes`` list (the same object: a reader may skip what it read)."""
        value = self._slice_call("SliverStatus")
        self.status_answers += 1
        last = self._last_status
        if last is not None and isinstance(value, dict) and _same_but_utc(value, last[0]):
            before = last[1]
            utc = value.get("utc")
            return SliverStatus(status=before.status, state=before.state, error=before.error,
                                utc=utc if isinstance(utc, int) else None, nodes=before.nodes)
        status = SliverStatus.from_value(value)
        self._last_status = (value, status)
        return status

    def renew_slice(self, expiration: dt.datetime) -> str:
        """Extend the sliver (not past the slice's expiry at the SA)."""
        return str(self._slice_call("RenewSlice", {"expiration": format_expiration(expiration)}))

    def delete_slice(self, cancel: bool = False, blocking: bool = False) -> None:
        """DeleteSlice. ``cancel``: delete even while setup still runs (else BUSY);
        ``blocking``: return once the delete is complete (else it continues in the
        background)."""
        params = {name: True for name, on in (("cancel", cancel), ("blocking", blocking)) if on}
        self._slice_call("DeleteSlice", params)

    def delete_sliver(self, sliver_urn: str) -> None:
        self.server.with_slice_credential(
            lambda c: self.call("DeleteSliver", {"sliver_urn": sliver_urn, "credentials": [c]}))

    def add_nodes(self, nodes: dict[str, dict[str, Any]]) -> str:
        """AddNodes ``{client_id: {diskimage, startup, tarballs, lans, node}}`` (the five keys
        CloudLab's CM reads: one startup string, tarball URLs, LAN names, a physical node
        name); returns the updated manifest. What the CM would refuse or misread is
        refused here first (:class:`~elasticslice.rspec.BadAddNodesArgs`, one line naming
        ``nodes[<client_id>].<key>``), before any call."""
        # imported here: the RSpec package (lxml) is not needed by the other calls
        from elasticslice.rspec.addnodes import check_add_args
        check_add_args(nodes)
        return str(self._slice_call("AddNodes", {"nodes": nodes}))

    def delete_nodes(self, client_ids: list[str]) -> str:
        """DeleteNodes by client_id; returns the updated manifest."""
        return str(self._slice_call("DeleteNodes", {"nodes": list(client_ids)}))

    # ---- the dynamic-slice server next to this CM
    def get_server_defaults(self) -> dict[str, Any]:
        """``{maxwaittime, policy}``."""
        return self.server.transport.call(self.dynslice_url, "GetServerDefaults", {})

    def set_slice_client_endpoint(self, url: str, policy: str = "LIFO",
                                  defwaittime: int = 600) -> Any:
        """Register our callback endpoint ``url`` for the slice."""
        return self._slice_call("SetSliceClientEndpoint",
                                {"url": url, "policy": policy, "defwaittime": int(defwaittime)},
                                url=self.dynslice_url)

    def set_resource_values(self, nodelist: list[dict[str, Any]]) -> Any:
        """Our own node values for the CLIENT policy (``[{client_id|node_id, value}]``,
        values 0..1, lower reclaimed sooner; a node without one counts 1.0)."""
        return self._slice_call("SetResourceValues", {"nodelist": list(nodelist)},
                                url=self.dynslice_url)

    def remove_slice_client_endpoint(self) -> Any:
        return self._slice_call("RemoveSliceClientEndpoint", url=self.dynslice_url)
