"""The emulator's calls to a client endpoint: HTTPS, with the CM's certificate.

The client endpoint's server certificate must chain to the emulator's CA and match the
URL's host; at the box's control address (nodes on networks of their own: the user's
certificate names 127.0.0.1, not that address) it must instead name, in its subjectAltName
URN, the user who registered the endpoint, so that another user of the CA, or a server
certificate, holding that port gets none of the slice's callbacks. The emulator presents
its CM's certificate (``D/cm.pem``; a cluster's ``D/cms/<name>/cm.pem``) as its
client certificate, so the endpoint can accept only callers the emulator
CA vouches for.

``CallbackClient.fail_for(seconds)`` makes every call fail for a while as a dropped
connection does (the chaos suite's ``callback_drop``): nothing reaches the endpoint, the
caller sees a failed call and retries on its own schedule.
"""
from __future__ import annotations

import http.client
import logging
import ssl
import time
import urllib.parse
import xmlrpc.client
from typing import Any

from elasticslice.emulator.context import Context
from elasticslice.emulator.store import EndpointRow
from elasticslice.rpc import pki

log = logging.getLogger(__name__)


class _Transport(xmlrpc.client.SafeTransport):
    """``expect_urn``: the URN the endpoint's certificate must name (else the connection is
    refused before anything is sent)."""

    def __init__(self, context: ssl.SSLContext, timeout: float,
                 expect_urn: str | None = None) -> None:
        super().__init__(context=context)
        self._timeout = timeout
        self._expect_urn = expect_urn

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        conn = super().make_connection(host)
        conn.timeout = self._timeout
        expect, connect = self._expect_urn, conn.connect
        if expect is not None:
            def checked() -> None:
                connect()
                got = pki.peer_urn(conn.sock)  # type: ignore[arg-type]
                if got != expect:
                    conn.close()
                    raise ssl.SSLError(f"the endpoint's certificate names "
                                       f"{got or 'no URN'}, not {expect}, who registered it")
            conn.connect = checked  # type: ignore[method-assign]
        return conn


class CallbackClient:
    """SetResourceValues, NotifyDeletePending, NotifyDeleteComplete to registered endpoints."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._ssl: ssl.SSLContext | None = None
        self._ssl_box: ssl.SSLContext | None = None
        self.failures = 0
        self.down_until = 0.0  # time.monotonic() before which every call fails

    def fail_for(self, seconds: float) -> None:
        """Every call fails (nothing is sent) for the next ``seconds``: a dropped
        connection as the endpoint's side sees it."""
        self.down_until = time.monotonic() + max(0.0, seconds)

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            d, cm = self.ctx.directory, self.ctx.authority.cm_home  # this CM's certificate
            ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
            ctx.load_cert_chain(str(cm / "cm.pem"), str(cm / "cm-key.pem"))
            self._ssl = ctx
        return self._ssl

    def _at_control_address(self, url: str) -> bool:
        return urllib.parse.urlsplit(url).hostname in self.ctx.control_ips()  # any CM's

    def _context_for(self, url: str) -> ssl.SSLContext:
        """At the control machine's address on the box's control network (this machine,
        network.py), the certificate is checked against the CA but not for that address
        (the user's certificate names 127.0.0.1, and the control address is chosen at
        ``serve``): :meth:`_call` checks that it names the endpoint's registrant instead."""
        if not self._at_control_address(url):
            return self._context()
        if self._ssl_box is None:
            d, cm = self.ctx.directory, self.ctx.authority.cm_home
            ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
            ctx.check_hostname = False
            ctx.load_cert_chain(str(cm / "cm.pem"), str(cm / "cm-key.pem"))
            self._ssl_box = ctx
        return self._ssl_box

    def _call(self, endpoint: EndpointRow, method: str, params: dict[str, Any],
              timeout: float | None = None) -> Any:
        if time.monotonic() < self.down_until:
            self.failures += 1
            log.warning("%s to %s failed: the connection is down", method, endpoint.url)
            return None
        transport = _Transport(self._context_for(endpoint.url),
                               timeout or self.ctx.settings.callback_timeout,
                               expect_urn=endpoint.owner_urn
                               if self._at_control_address(endpoint.url) else None)
        proxy = xmlrpc.client.ServerProxy(endpoint.url, transport=transport, allow_none=False)
        started = time.monotonic()
        try:
            result = getattr(proxy, method)(params)
        except (OSError, xmlrpc.client.Error, ssl.SSLError, http.client.HTTPException) as err:
            self.failures += 1
            log.warning("%s to %s failed: %s", method, endpoint.url, err)
            return None
        finally:
            transport.close()
        log.info("%s to %s (%d nodes) in %.0f ms", method, endpoint.url,
                 len(params.get("nodelist", [])), (time.monotonic() - started) * 1000)
        return result

    def notify_delete_pending(self, endpoint: EndpointRow, nodelist: list[dict[str, Any]]
                              ) -> set[str]:
        """Send the countdown; the node_ids the client says we may take at once."""
        result = self._call(endpoint, "NotifyDeletePending", {"nodelist": nodelist})
        if isinstance(result, dict) and "code" in result:
            if result.get("code") != 0:
                return set()
            result = result.get("value")
        early: set[str] = set()
        if isinstance(result, list):
            for item in result:
                if isinstance(item, dict) and item.get("max_wait_time") == 0 and \
                        isinstance(item.get("node_id"), str):
                    early.add(item["node_id"])
        return early

    def set_resource_values(self, endpoint: EndpointRow, nodelist: list[dict[str, Any]]
                            ) -> bool:
        """Tell the client what its nodes are worth; False when it did not take them."""
        result = self._call(endpoint, "SetResourceValues", {"nodelist": nodelist},
                            timeout=self.ctx.settings.values_timeout)
        if result is None:
            return False
        if isinstance(result, dict) and result.get("code", 0) != 0:
            self.failures += 1
            log.warning("SetResourceValues to %s answered code %s", endpoint.url,
                        result.get("code"))
            return False
        return True

    def notify_delete_complete(self, endpoint: EndpointRow, nodelist: list[dict[str, Any]]
                               ) -> None:
        self._call(endpoint, "NotifyDeleteComplete", {"nodelist": nodelist})
