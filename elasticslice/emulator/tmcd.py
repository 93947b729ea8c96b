"""The box's node configuration server: what ``geni-get`` on a node asks.

On CloudLab a node's ``geni-get`` asks the testbed's tmcd (TCP 7777), which knows the node by
its control address. Nodes of the box share the host's network (until they get their own),
so a node proves who it is with a key of its own instead: ``GET /geni/<command>[/<argument>]``
with ``X-Geni-Key``, plain HTTP on 127.0.0.1 (port 0: any free port). The key is given to the
node at allocation (in its ``tmcd.json``, which only that node sees) and dies with the
allocation. Answers come from :mod:`elasticslice.emulator.geniget`: 200 with the value, or
404 with the refusal (unknown key, unknown command, "not available").
"""
from __future__ import annotations

import hmac
import http.server
import logging
import sys
import threading
import urllib.parse

from elasticslice.emulator.context import Context
from elasticslice.emulator.geniget import Refusal, answer
from elasticslice.emulator.store import Holder, NodeRow

log = logging.getLogger(__name__)

MAX_PATH = 512


class _Handler(http.server.BaseHTTPRequestHandler):
    server: NodeConfigServer
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        parts = urllib.parse.urlsplit(self.path[:MAX_PATH]).path.split("/")
        if len(parts) < 3 or parts[1] != "geni" or not parts[2]:
            self._send(404, "unknown request")
            return
        command = urllib.parse.unquote(parts[2])
        argument = urllib.parse.unquote("/".join(parts[3:]))
        node = self.server.node_by_key(self.headers.get("X-Geni-Key", ""))
        if node is None:
            self._send(403, "unknown node (no key, or the node was given back)")
            return
        try:
            text = answer(self.server.ctx, node, command, argument)
        except Refusal as refusal:
            self._send(404, str(refusal))
            return
        except Exception:  # one bad answer must not stop the server
            log.exception("geni-get %s for %s failed", command, node.node_id)
            self._send(500, "internal error handling request")
            return
        self._send(200, text)

    def _send(self, status: int, text: str) -> None:
        body = (text if text.endswith("\n") else text + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("geni-get %s", format % args)


class NodeConfigServer(http.server.ThreadingHTTPServer):
    """Answers nodes' ``geni-get`` on 127.0.0.1; :attr:`url` once started."""

    daemon_threads = True

    def __init__(self, ctx: Context, host: str = "127.0.0.1", port: int = 0) -> None:
        self.ctx = ctx
        self._thread: threading.Thread | None = None
        super().__init__((host, port), _Handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """A node that went away mid-answer (rebooted, deleted) is no error of ours: one
        debug line, never a traceback on the emulator's stderr."""
        err = sys.exc_info()[1]
        if isinstance(err, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            log.debug("geni-get from %s: the node went away: %s", client_address, err)
            return
        log.exception("geni-get from %s failed", client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def node_by_key(self, key: str) -> NodeRow | None:
        if not key:
            return None
        for node in self.ctx.store.nodes(holder=Holder.SLICE):
            mine = str(node.attrs.get("geni_key", ""))
            if mine and hmac.compare_digest(mine.encode(), key.encode()):
                return node
        return None

    def start(self) -> NodeConfigServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="emulator-tmcd", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()
