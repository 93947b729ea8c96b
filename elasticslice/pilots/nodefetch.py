"""How the node's installer fetches from the control node: one GET, pinned to the cluster CA.

Part of the installer program (:func:`elasticslice.pilots.bootstrap.installer` embeds it
between :mod:`~elasticslice.pilots.wheeltags` and :mod:`~elasticslice.pilots.nodeinstall`):
standard library only, and it parses on Python 3.6. After :func:`pin`, https is verified
against the cluster CA alone and must reach a server of the role ``control``
(:class:`ControlConnection`); whatever fails verification is :class:`Failed` with one line
that never prints the URL's path.
"""
from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional


class Failed(Exception):
    """One line for stderr."""


class Answer(Exception):
    """An HTTP status other than 200, with the body's line (text/plain) and Retry-After."""

    def __init__(self, code: int, reason: str, retry_after: Optional[float]) -> None:
        super().__init__(code, reason)
        self.code, self.reason, self.retry_after = code, reason, retry_after


def where(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return "%s://%s/..." % (parts.scheme, parts.netloc)


class Unverified(OSError):
    """The server is not the control node: why, one line."""


class ControlConnection(http.client.HTTPSConnection):
    """HTTPS to a server whose certificate the context's CA signed for the URL's host, and
    whose role (its subject's OU) is ``control``: a node's own certificate, signed by the
    same CA, is refused."""

    def connect(self) -> None:
        http.client.HTTPSConnection.connect(self)
        subject = (self.sock.getpeercert() or {}).get("subject", ())
        units = [value for rdn in subject for key, value in rdn
                 if key == "organizationalUnitName"]
        if units != ["control"]:
            self.sock.close()
            raise Unverified("its certificate is not the control node's (OU %s)"
                             % (",".join(units) or "none"))


class ControlHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):  # type: ignore[no-untyped-def]
        return self.do_open(ControlConnection, req, context=self.context)

    def __init__(self, context: ssl.SSLContext) -> None:
        urllib.request.HTTPSHandler.__init__(self, context=context)
        self.context = context


#: how the wheelhouse is fetched: urllib's default, or pinned to the cluster CA (pin())
OPENER = urllib.request.build_opener()


def pin(ca_pem: str) -> None:
    """From now on, https is verified against ``ca_pem`` only, and must reach a control
    node (:class:`ControlConnection`)."""
    global OPENER
    context = ssl.create_default_context(cadata=ca_pem)
    OPENER = urllib.request.build_opener(ControlHandler(context))


def unverified(err: BaseException) -> Optional[str]:
    """Why a server failed verification (None: it did not, this is another error)."""
    reason = getattr(err, "reason", err)
    if isinstance(reason, Unverified):
        return str(reason)
    if isinstance(reason, ssl.CertificateError):  # SSLCertVerificationError too
        text = getattr(reason, "verify_message", None) or str(reason)
        return "its certificate is not the control node's (%s)" % " ".join(text.split())
    return None


def get(url: str) -> bytes:
    """One GET; :class:`Answer` for an HTTP error status, :class:`Failed` for a server that
    failed verification (not the control node), OSError for the rest."""
    try:
        with OPENER.open(url, timeout=60) as answer:
            return answer.read()
    except urllib.error.HTTPError as err:
        reason = ""
        try:
            if (err.headers.get("Content-Type") or "").startswith("text/plain"):
                reason = " ".join(err.read(400).decode("utf-8", "replace").split())
        except Exception:  # noqa: BLE001 - the status is enough
            pass
        try:
            retry = float(err.headers.get("Retry-After") or "")  # type: Optional[float]
        except ValueError:
            retry = None
        raise Answer(err.code, reason or "HTTP %d" % err.code, retry) from None
    except OSError as err:
        why = unverified(err)
        if why is None:
            raise
        name = urllib.parse.urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
        raise Failed("%s from the wheelhouse at %s failed verification: %s"
                     % (name or "the wheelhouse", where(url), why)) from None
