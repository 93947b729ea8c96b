"""How admin commands reach a running emulator: ``D/server.json`` names its URL, and the
calls go over TLS with ``D/admin.pem`` (the only certificate the admin path accepts)."""
from __future__ import annotations

import json
import ssl
import xmlrpc.client
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError, RPCError


def _not_running(d: Path) -> ElasticSliceError:
    return ElasticSliceError(f"{d}: no emulator is running here (start it with "
                             f"`elasticslice emulator serve --dir {d}`)")


class AdminClient:
    """Calls ``/protogeni/xmlrpc/admin`` of the emulator serving directory ``d`` (with
    ``cluster``: ``/cluster/<name>/protogeni/xmlrpc/admin``, that cluster's)."""

    def __init__(self, directory: str | Path, timeout: float = 30.0,
                 cluster: str | None = None) -> None:
        self.directory = Path(directory).resolve()
        self.timeout = timeout
        self.cluster = cluster  # a cluster of a box of several CMs (clusters.py)

    def _proxy(self) -> xmlrpc.client.ServerProxy:
        d = self.directory
        try:
            info = json.loads((d / "server.json").read_text())
            url = str(info["url"])
            if self.cluster is not None:
                url = str(info["clusters"][self.cluster]["url"])
        except FileNotFoundError as err:
            raise _not_running(d) from err
        except (OSError, ValueError, KeyError) as err:
            raise ElasticSliceError(f"{d / 'server.json'}: unreadable: {err}") from err
        try:
            ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
            ctx.load_cert_chain(str(d / "admin.pem"))
        except (OSError, ssl.SSLError) as err:
            raise ElasticSliceError(f"{d}: cannot load the admin certificate (ca.pem, "
                                    f"admin.pem): {getattr(err, 'strerror', None) or err}"
                                    ) from err
        return xmlrpc.client.ServerProxy(f"{url}/admin", context=ctx)

    def call(self, method: str, **params: Any) -> Any:
        proxy = self._proxy()
        try:
            result = getattr(proxy, method)(params)
        except ConnectionRefusedError as err:
            raise _not_running(self.directory) from err
        except (OSError, xmlrpc.client.Error) as err:
            raise RPCError(str(err), method=method, server="emulator admin") from err
        finally:
            proxy("close")()
        if result.get("code") != 0:
            raise RPCError(result.get("output") or "failed", code=result.get("code"),
                           method=method, server="emulator admin")
        return result.get("value")
