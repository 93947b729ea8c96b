"""Each node's install tarball, served over plain HTTP as CloudLab fetches tarballs.

CloudLab's CM fetches every install tarball itself, by URL, before CreateSliver or AddNodes
returns, and only URLs that pass its rule (:mod:`elasticslice.rspec.tarball`: http(s) or
ftp, a name ending ``.tar.gz``..., no query string). :class:`TarballPublisher` serves the
files it is given at ``<public_url>/<token>/<name>.tar.gz``: the token is random and per
file (32 URL-safe characters, which the rule allows), so nobody who was not given the URL
can fetch the file, and a file withdrawn is gone. :meth:`TarballPublisher.publish_tree`
serves a whole directory read-only the same way (under ``<public_url>/<token>/<name>/``), and
:meth:`TarballPublisher.publish_resolver` a tree whose files a function finds when they are
asked for (a wheelhouse built for the Python a node says it has). A caller may give the token
(``token=``) to keep a URL across restarts of the control node: CloudLab's CM fetches every
tarball URL of a sliver again at every sliver change, for as long as its node is held.
It listens on ``host`` (127.0.0.1 and port 0 by default: any free port; the box's CM runs
on this machine); ``public_url`` is the base URL the CM fetches from (default: its own
address). Plain HTTP is enough: a tarball carries no secret (its enrolment token is single
use and bound to its node), but its URL is still never logged. What nodes install is
another matter: a publisher made with ``tls=`` (a server context of the cluster CA) serves
HTTPS, which is how the nodes' wheelhouse is served
(:meth:`~elasticslice.pilots.wheelroot.WheelhouseRoot.publish_tls`). The listener is guarded
(:mod:`elasticslice.serving`, :data:`LIMITS`): a cap of connections, 5 s for a TLS
handshake, 10 s for a whole request, 60 s for an answer (more for a big file), no thread
for an idle stranger.
"""
from __future__ import annotations

import html
import json
import logging
import math
import mimetypes
import os
import re
import secrets
import socketserver
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elasticslice.errors import ElasticSliceError
from elasticslice.rspec.tarball import tarball_problem
from elasticslice.serving import BufferedRequestHandler, GuardedServer, Limits, default_cap

log = logging.getLogger(__name__)

CHUNK = 1 << 16
MAX_REPORT = 4096  # bytes of one POST to an inbox


def server_url(server: socketserver.BaseServer, scheme: str) -> str:
    """``scheme://HOST:PORT`` of a bound server (an IPv6 host in brackets)."""
    host, port = server.server_address[:2]  # type: ignore[attr-defined]
    shown = f"[{host}]" if ":" in str(host) else host
    return f"{scheme}://{shown}:{port}"


def serve_in_thread(server: socketserver.BaseServer, name: str) -> threading.Thread:
    """Serve ``server`` in a daemon thread called ``name`` (started)."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name=name, daemon=True)
    thread.start()
    return thread


def stop_serving(server: socketserver.BaseServer | None,
                 thread: threading.Thread | None) -> None:
    """Shut ``server`` down, close its socket and wait (bounded) for its thread."""
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(timeout=5)


class PublishError(ElasticSliceError):
    """A tarball cannot be published."""


@dataclass(frozen=True)
class Unavailable:
    """What a resolver answers for a path it cannot serve now: ``status`` (404: not there,
    503: being made, come back after ``retry_after`` seconds) and one line saying why, which
    the client is sent as the body."""

    status: int
    reason: str
    retry_after: float | None = None


#: ``resolve(path)``: the file (or folder) a published resolver serves for ``path`` (relative
#: to its URL, "" for its root, never with ``..`` or hidden names), an :class:`Unavailable`,
#: or None (404)
Resolver = Callable[[str], "Path | Unavailable | None"]

#: ``on_post(data, peer_address)``: what an inbox does with a POSTed JSON object
Inbox = Callable[[dict, str], None]

TOKEN = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def new_token() -> str:
    """A fresh unguessable URL segment (32 URL-safe characters: 192 bits)."""
    return secrets.token_urlsafe(24)


class _Handler(BufferedRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._serve(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def do_POST(self) -> None:  # noqa: N802
        """A small JSON object for an inbox (:meth:`TarballPublisher.accept_reports`)."""
        inbox = self.server.publisher.inbox(self.path)
        if inbox is None:
            self.send_error(404)
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if not 0 < length <= MAX_REPORT:
            self.send_error(413 if length > MAX_REPORT else 411)
            return
        try:
            data = json.loads(self.rfile.read(length))
        except ValueError:
            data = None
        if not isinstance(data, dict):
            self.send_error(400, "expected a JSON object")
            return
        try:
            inbox(data, str(self.client_address[0]))
        except Exception:  # noqa: BLE001 - never a traceback to a node
            log.exception("publisher: an inbox failed")
            self.send_error(500)
            return
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _serve(self, body: bool) -> None:
        path = self.server.publisher.lookup(self.path)
        if isinstance(path, Unavailable):
            self._unavailable(path, body)
            return
        if path is not None and path.is_dir():
            self._listing(path, body)
            return
        if path is None or not path.is_file():
            self.send_error(404)
            return
        try:
            handle = open(path, "rb")
        except OSError:
            self.send_error(404)
            return
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if body:  # a big file gets its time, at MIN_RATE at least
                self.server.extend(self.request, LIMITS.response_deadline + size / MIN_RATE)
            self.send_response(200)
            kind = ("application/gzip" if path.name.endswith((".gz", ".tgz"))
                    else mimetypes.guess_type(path.name)[0] or "application/octet-stream")
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            while body and (chunk := handle.read(CHUNK)):
                self.wfile.write(chunk)

    def _unavailable(self, answer: Unavailable, body: bool) -> None:
        data = (" ".join(answer.reason.split())[:300] + "\n").encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if answer.retry_after is not None:
            self.send_header("Retry-After", str(max(1, math.ceil(answer.retry_after))))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _listing(self, directory: Path, body: bool) -> None:
        """A directory of a published tree: its ``index.html``, else a list of links (what
        ``pip --find-links`` reads)."""
        if not self.path.endswith("/"):  # relative links need the slash
            self.send_response(301)
            self.send_header("Location", self.path + "/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        index = directory / "index.html"
        if index.is_file():
            data = index.read_bytes()
        else:
            names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir()
                           if not p.name.startswith("."))
            links = "".join(f'<a href="{urllib.parse.quote(n)}">{html.escape(n)}</a><br>\n'
                            for n in names)
            data = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # the path is a capability: not logged


#: a node or the CM fetches a file and goes; a report is small. Eight workers: the CM
#: fetches the slice's tarballs while booting nodes fetch their software
LIMITS = Limits(max_connections=default_cap(), handshake_deadline=5.0, request_deadline=10.0,
                response_deadline=60.0, io_timeout=20.0, workers=8, max_body=MAX_REPORT)
MIN_RATE = 1 << 20  # bytes/s: a file's answer may last response_deadline + size / MIN_RATE


class _Server(GuardedServer):
    """A guarded listener (:mod:`elasticslice.serving`): a stranger's idle or trickling
    connection never holds a thread, and is one count in a log line a minute; over TLS
    with ``tls`` (handshakes off the accepting thread, within their deadline)."""

    def __init__(self, publisher: TarballPublisher, host: str, port: int,
                 limits: Limits = LIMITS, tls: ssl.SSLContext | None = None) -> None:
        self.publisher = publisher
        super().__init__((host, port), _Handler, limits=limits, tls=tls,
                         name="tarball publisher" if tls is None else "wheelhouse publisher")


class TarballPublisher:
    """Serves files at unguessable URLs the tarball rule accepts; :meth:`start` first.
    ``public_url``: the base of the URLs it gives (what the CM fetches from; default
    :attr:`base_url`, its own address)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 public_url: str | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.tls = tls  # HTTPS with this server context (the nodes' wheelhouse); None: HTTP
        if public_url is not None:
            parts = urllib.parse.urlsplit(public_url)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.query \
                    or parts.fragment:
                raise PublishError(f"public_url {public_url!r}: expected http(s)://HOST[:PORT]"
                                   f"[/PATH], without a query")
        self.public_url = public_url.rstrip("/") if public_url else None
        self._files: dict[str, Path] = {}  # "/<token>/<name>" -> file
        self._trees: dict[str, Path] = {}  # "/<token>/<name>/" -> directory
        self._resolvers: dict[str, Resolver] = {}  # "/<token>/<name>/" -> resolve(path)
        self._inboxes: dict[str, Inbox] = {}  # "/<token>/<name>" -> on_post(data, peer)
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:  # never the tokens
        return f"TarballPublisher({self.base_url if self._server else 'not started'})"

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise PublishError("the tarball publisher is not started")
        return server_url(self._server, "https" if self.tls is not None else "http")

    def start(self) -> TarballPublisher:
        try:
            self._server = _Server(self, self.host, self.port, tls=self.tls)
        except OSError as err:
            raise PublishError(f"cannot serve tarballs on {self.host}:{self.port}: "
                               f"{err.strerror or err}") from err
        self._thread = serve_in_thread(self._server, "pilot-tarballs")
        return self

    def stop(self) -> None:
        """Stop serving; nothing stays published."""
        self.withdraw_all()
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        stop_serving(server, thread)

    @property
    def port_bound(self) -> int:
        """The port it listens on (started)."""
        if self._server is None:
            raise PublishError("the tarball publisher is not started")
        return int(self._server.server_address[1])

    @property
    def url_base(self) -> str:
        """The base of the URLs given out: ``public_url``, else :attr:`base_url`."""
        return self.public_url or self.base_url

    def _segment(self, url: str) -> str:
        """The path of ``url`` under the base URLs (what a request asks for)."""
        for base in (self.public_url, self.base_url if self._server else None):
            if base and url.startswith(base + "/"):
                return url[len(base):]
        return urllib.parse.urlsplit(url).path if "://" in url else url

    @staticmethod
    def _token(token: str | None) -> str:
        if token is None:
            return new_token()
        if not TOKEN.fullmatch(token):
            raise PublishError("a publishing token is 16-64 letters, digits, '-' or '_'")
        return token

    def publish(self, path: Path, name: str, *, token: str | None = None) -> str:
        """Serve ``path`` as ``<name>`` (ending in ``.tar.gz``...) at a new URL (under
        ``token``, default a new one); the URL. The file is read at each request: replace it
        atomically to change what is served."""
        segment = f"/{self._token(token)}/{name}"
        url = self.url_base + segment
        problem = tarball_problem(url)
        if problem:
            raise PublishError(f"cannot publish {name!r}: {problem}")
        with self._lock:
            self._files[segment] = Path(path)
        return url

    def publish_tree(self, directory: Path, name: str, *, token: str | None = None) -> str:
        """Serve ``directory`` read-only (its files and folders, nothing outside it, no
        hidden names) under an unguessable prefix (``token``, default a new one); the URL of
        the tree (ending ``/``)."""
        root = Path(directory).resolve()
        if not root.is_dir():
            raise PublishError(f"cannot publish {directory}: not a directory")
        segment = self._tree_segment(name, token)
        with self._lock:
            self._trees[segment] = root
        return self.url_base + segment

    def publish_resolver(self, name: str, resolve: Resolver, *, token: str | None = None
                         ) -> str:
        """Serve what ``resolve`` finds for each path asked for under a new prefix (see
        :data:`Resolver`); the URL of its root (ending ``/``). ``resolve`` runs on the
        request's thread: it must answer quickly (start slow work elsewhere and answer
        ``Unavailable(503, ..., retry_after)`` meanwhile)."""
        segment = self._tree_segment(name, token)
        with self._lock:
            self._resolvers[segment] = resolve
        return self.url_base + segment

    def accept_reports(self, name: str, on_post: Inbox, *, token: str | None = None) -> str:
        """Take POSTs of small JSON objects (at most :data:`MAX_REPORT` bytes) at a new URL:
        ``on_post(data, peer_address)`` on the request's thread (quick); the URL. What nodes
        say there is a claim, not a fact: act on it only with what the CM says."""
        segment = f"/{self._token(token)}/{name}"
        with self._lock:
            self._inboxes[segment] = on_post
        return self.url_base + segment

    def inbox(self, request_path: str) -> Inbox | None:
        with self._lock:
            return self._inboxes.get(request_path)

    def _tree_segment(self, name: str, token: str | None) -> str:
        if not name or "/" in name or name in (".", "..") or tarball_problem(
                f"http://h/{name}.tar") is not None:
            raise PublishError(f"cannot publish a tree as {name!r}: letters, digits, . _ - only")
        return f"/{self._token(token)}/{name}/"

    def withdraw(self, url: str) -> None:
        """Stop serving ``url`` (a file, or a tree)."""
        segment = self._segment(url)
        folder = segment if segment.endswith("/") else segment + "/"
        with self._lock:
            self._files.pop(segment, None)
            self._inboxes.pop(segment, None)
            self._trees.pop(folder, None)
            self._resolvers.pop(folder, None)

    def withdraw_all(self) -> None:
        """Stop serving everything."""
        with self._lock:
            self._files.clear()
            self._trees.clear()
            self._resolvers.clear()
            self._inboxes.clear()

    def published(self) -> int:
        """How many files, trees, resolvers and inboxes are served."""
        with self._lock:
            return (len(self._files) + len(self._trees) + len(self._resolvers)
                    + len(self._inboxes))

    def lookup(self, request_path: str) -> Path | Unavailable | None:
        """The file (or a tree's folder) a request path names, what a resolver answers for
        it, or None if none."""
        if "?" in request_path or "#" in request_path:
            return None
        with self._lock:
            found = self._files.get(request_path)
            if found is not None:
                return found
            trees = list(self._trees.items())
            resolvers = list(self._resolvers.items())
        for prefix, resolve in resolvers:
            parts = _parts(request_path, prefix)
            if parts is not None:
                return resolve("/".join(parts)) if parts != [".."] else None
        for prefix, root in trees:
            parts = _parts(request_path, prefix)
            if parts is None:
                continue
            if parts == [".."]:
                return None
            target = root.joinpath(*parts).resolve() if parts else root
            if target != root and not target.is_relative_to(root):
                return None  # a link out of the tree
            return target if target.exists() else None
        return None


def _parts(request_path: str, prefix: str) -> list[str] | None:
    """The path segments of ``request_path`` under the tree ``prefix`` (``[]``: its root;
    ``[".."]``: under it but refused, a hidden or parent segment), None: not under it."""
    if request_path == prefix.rstrip("/"):
        return []
    if not request_path.startswith(prefix):
        return None
    rest = urllib.parse.unquote(request_path[len(prefix):])
    parts = [p for p in rest.split("/") if p]
    if any(p.startswith(".") for p in parts):
        return [".."]
    return parts
