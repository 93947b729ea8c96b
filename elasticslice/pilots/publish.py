"""Each node's install tarball, served over plain HTTP as CloudLab fetches tarballs.

CloudLab's CM fetches every install tarball itself, by URL, before CreateSliver or AddNodes
returns, and only URLs that pass its rule (:mod:`elasticslice.rspec.tarball`: http(s) or
ftp, a name ending ``.tar.gz``..., no query string). :class:`TarballPublisher` serves the
files it is given at ``http://HOST:PORT/<token>/<name>.tar.gz``: the token is random and per
file (32 URL-safe characters, which the rule allows), so nobody who was not given the URL
can fetch the file, and a file withdrawn is gone. It listens on 127.0.0.1 (port 0 by
default: any free port): the box's CM runs on this machine. (Issue 20 moves the key out of
the tarball; until then the URL is a capability: it is never logged.)
"""
from __future__ import annotations

import http.server
import logging
import os
import secrets
import threading
from pathlib import Path

from elasticslice.errors import ElasticSliceError
from elasticslice.rspec.tarball import tarball_problem

log = logging.getLogger(__name__)

CHUNK = 1 << 16


class PublishError(ElasticSliceError):
    """A tarball cannot be published."""


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._serve(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path = self.server.publisher.lookup(self.path)
        if path is None:
            self.send_error(404)
            return
        try:
            handle = open(path, "rb")
        except OSError:
            self.send_error(404)
            return
        with handle:
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(os.fstat(handle.fileno()).st_size))
            self.end_headers()
            while body and (chunk := handle.read(CHUNK)):
                self.wfile.write(chunk)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # the path is a capability: not logged


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, publisher: TarballPublisher, host: str, port: int) -> None:
        self.publisher = publisher
        super().__init__((host, port), _Handler)


class TarballPublisher:
    """Serves files at unguessable URLs the tarball rule accepts; :meth:`start` first."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._files: dict[str, Path] = {}  # "/<token>/<name>" -> file
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:  # never the tokens
        return f"TarballPublisher({self.base_url if self._server else 'not started'})"

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise PublishError("the tarball publisher is not started")
        host, port = self._server.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}"

    def start(self) -> TarballPublisher:
        try:
            self._server = _Server(self, self.host, self.port)
        except OSError as err:
            raise PublishError(f"cannot serve tarballs on {self.host}:{self.port}: "
                               f"{err.strerror or err}") from err
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="pilot-tarballs", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def publish(self, path: Path, name: str) -> str:
        """Serve ``path`` as ``<name>`` (ending in ``.tar.gz``...) at a new URL; the URL."""
        segment = f"/{secrets.token_urlsafe(24)}/{name}"
        url = self.base_url + segment
        problem = tarball_problem(url)
        if problem:
            raise PublishError(f"cannot publish {name!r}: {problem}")
        with self._lock:
            self._files[segment] = Path(path)
        return url

    def withdraw(self, url: str) -> None:
        """Stop serving ``url``."""
        with self._lock:
            self._files.pop(url.removeprefix(self.base_url) if self._server else url, None)

    def lookup(self, request_path: str) -> Path | None:
        with self._lock:
            return self._files.get(request_path)
