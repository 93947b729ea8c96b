"""The endpoint registrar: serves the callback endpoint and registers it at every CM
(SetSliceClientEndpoint), removes it at the end (RemoveSliceClientEndpoint).

Who may call is known before any CM can call: each CM's URN (``[endpoint] cm_urn``, else
its GetVersion ``urn``) is asked in :meth:`EndpointRegistrar.register`, on the cycle's
thread, before the CM learns our URL. The endpoint itself never makes an RPC.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from elasticslice.config import load_passphrase
from elasticslice.errors import ElasticSliceError, RPCError
from elasticslice.managers.cycle import one_line
from elasticslice.rpc.codes import GeniCode

log = logging.getLogger("elasticslice.managers.manager")


class EndpointRegistrar:
    """``config``: the ``EndpointConfig``; ``served``: the object the endpoint serves (a
    ``SimpleElasticSliceClientEndpoint``)."""

    def __init__(self, server: Any, cms: Sequence[Any], config: Any, served: Any) -> None:
        self.server = server
        self.cms = list(cms)
        self.config = config
        self.served = served
        self.endpoint_server: Any = None
        self.url: str | None = None
        self.registered: set[str] = set()
        self.urns: set[str] = {config.cm_urn} if config.cm_urn else set()
        #: the reclaim policy we asked for: CLIENT (our values decide) where the server
        #: offers it, else LIFO; :attr:`policies` says what each CM took
        self.prefer = str(getattr(config, "policy", None) or "CLIENT").upper()
        self.policies: dict[str, str] = {}
        self.waits: dict[str, int] = {}   # CM url -> the countdown we registered (0: its max)
        self.cm_of_urn: dict[str, str] = {}   # a CM's URN -> its URL (learnt in register)

    def allowed(self) -> frozenset[str]:
        """Who may call (read at each connection; no RPC here)."""
        return frozenset(self.urns)

    def start(self) -> None:
        from elasticslice.rpc.endpoint import EndpointServer
        ecfg = self.config
        client = self.server.config
        certfile = ecfg.certificate or client.certificate
        if ecfg.certificate is None:
            password = self.server._passphrase or load_passphrase(client)
        elif getattr(ecfg, "passphrase_file", None) is not None:
            password = ecfg.passphrase_file.read_text().strip()
        else:
            password = None
        if client.ca_bundle is None:
            raise ElasticSliceError("the callback endpoint needs [protogeni] ca_bundle (the "
                                    "CA the CM's certificate chains to)")
        server = EndpointServer(self.served, certfile=certfile,
                                keyfile=getattr(ecfg, "keyfile", None), password=password,
                                ca_file=client.ca_bundle, allowed_urns=self.allowed,
                                host=ecfg.address, port=ecfg.port)
        server.start()
        self.endpoint_server = server
        self.url = ecfg.url or server.url
        self.registered = set()
        log.info("callback endpoint at %s", self.url)

    def register(self, cm: Any) -> None:
        """Learn who ``cm`` is, then register the endpoint there (once)."""
        if self.endpoint_server is None or cm.url in self.registered:
            return
        if not self.config.cm_urn:
            urn = str(cm.get_version().get("urn", ""))
            if urn and urn not in self.urns:
                self.urns.add(urn)
                log.info("callbacks accepted from %s", ", ".join(sorted(self.urns)))
            if urn:
                self.cm_of_urn.setdefault(urn, cm.url)
        try:
            wait = int(cm.get_server_defaults().get("maxwaittime", 0))
        except (RPCError, AttributeError, TypeError, ValueError):
            wait = 0
        policy = self._register(cm, max(0, wait))
        self.waits[cm.url] = max(0, wait)
        self.registered.add(cm.url)
        self.policies[cm.url] = policy
        log.info("registered the endpoint %s at %s (policy %s)", self.url, cm.dynslice_url,
                 policy)

    def _register(self, cm: Any, wait: int) -> str:
        """SetSliceClientEndpoint with the preferred policy; a server that refuses CLIENT
        (BADARGS: it does not know it) gets LIFO."""
        if self.prefer == "CLIENT":
            try:
                cm.set_slice_client_endpoint(self.url, policy="CLIENT", defwaittime=wait)
                return "CLIENT"
            except RPCError as err:
                if err.code != GeniCode.BADARGS:
                    raise
                log.info("%s does not offer the CLIENT policy (%s): LIFO", cm.dynslice_url,
                         one_line(err))
        cm.set_slice_client_endpoint(self.url, policy="LIFO", defwaittime=wait)
        return "LIFO"

    def calling_cm(self) -> str | None:
        """The URL of the CM whose callback is being handled (None: not known, e.g. with
        ``[endpoint] cm_urn``, or two CMs of one URN): its notices count for its nodes only."""
        from elasticslice.rpc.endpoint import CALLER
        urn = CALLER.get()
        return self.cm_of_urn.get(urn) if urn is not None else None

    def client_cms(self) -> list[Any]:
        """The CMs where our values decide the reclaim order (registered with CLIENT)."""
        return [c for c in self.cms if self.policies.get(c.url) == "CLIENT"
                and c.url in self.registered]

    def fall_back(self, cm: Any, why: str) -> None:
        """``cm`` took CLIENT but refuses our values: register LIFO there instead (with
        CLIENT and no values, every node would count 1.0)."""
        log.warning("%s refuses our resource values (%s): LIFO there", cm.dynslice_url, why)
        cm.set_slice_client_endpoint(self.url, policy="LIFO",
                                     defwaittime=self.waits.get(cm.url, 0))
        self.policies[cm.url] = "LIFO"

    def stop(self) -> None:
        """Remove the endpoint at every CM it was registered at, then stop serving."""
        server, self.endpoint_server = self.endpoint_server, None
        for url in sorted(self.registered):
            cm = next(c for c in self.cms if c.url == url)
            try:
                cm.remove_slice_client_endpoint()
                log.info("removed the endpoint at %s", cm.dynslice_url)
            except ElasticSliceError as err:
                log.warning("cannot remove the endpoint at %s: %s", cm.dynslice_url,
                            one_line(err))
        self.registered = set()
        self.policies = {}
        if server is not None:
            server.stop()
