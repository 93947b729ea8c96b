"""The wheelhouses a control node serves its nodes, under one URL: a wheelhouse *root*.

A node asks the root for the wheelhouse that fits it, by name: its Python, machine and glibc
(:func:`~elasticslice.pilots.wheeltags.node_tag`, ``ROOT/cp310-manylinux_2_35_aarch64/
wheels.txt``). :class:`WheelhouseRoot` answers, on the publisher's request thread and at
once, with:

- the files of a wheelhouse it has built whose every wheel fits that node (same Python;
  platform tags the node runs: a wheelhouse for glibc 2.35 serves a node with 2.39, the
  control node's own repacked one serves every node of its Python and machine whose glibc
  its wheels allow), the same one for as long as the root lives (a node fetching its wheels
  never sees them change under it);
- 503 with ``Retry-After`` while it builds one for that node in the background (one build
  at a time, in the order asked; the control node's own Python and machine are repacked,
  with no network, and tried first for a node of them; anything else is ``pip download``
  for the node's exact Python and platform, :mod:`elasticslice.pilots.wheeldownload`);
- 404 with one line saying why when it has none: a name it does not build (Python 3.8 to
  3.14, x86_64 and aarch64, manylinux only), a Python older than the agent's, or the
  reason its build failed (remembered, and tried again after :attr:`retry_failed_after`
  seconds, 10 minutes by default).

Published with :meth:`~elasticslice.pilots.publish.TarballPublisher.publish_resolver`
(:meth:`WheelhouseRoot.publish`), it is one URL for every node, which stays the same as it
grows (and across restarts of the control node, given the same ``token``). With
:func:`~elasticslice.pilots.bootstrap.env_script` it is all a node needs::

    root = WheelhouseRoot()                      # extra=("parsl",) for Parsl's nodes
    root.build_ahead()                           # this control node's own Python, repacked
    root.build_ahead("3.10", "manylinux_2_35_x86_64")   # the image's, when known
    url = root.publish(publisher, token=token)   # "http://HOST:PORT/<token>/wheelhouse/"
    lines = env_script(url)                      # start.sh: the node asks for its own

A cluster serves it over HTTPS instead, with a control certificate of the cluster CA that
the nodes verify (:meth:`WheelhouseRoot.publish_tls`, ``env_script(url, ca=ca.cert_pem)``):
``wheels.txt`` pins every wheel's sha256, so what a node installs is the control node's.

or, all of it for the image the nodes boot, :func:`serve_for_image` (``ca=``: over HTTPS).

The builds run in one daemon thread, started when the first is asked for (nothing happens
in the constructor); :meth:`close` stops it after the build it is in.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots import wheeltags
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.publish import PublishError, TarballPublisher, Unavailable
from elasticslice.pilots.restart import read_json, write_json
from elasticslice.pilots.wheelhouse import (Wheelhouse, WheelhouseError, this_platform,
                                            this_python)

log = logging.getLogger(__name__)

RETRY_AFTER = 2.0  # seconds a node waits before asking again (an ask is cheap)
MIN_REASON = "the node agent needs Python %d.%d or later" % wheeltags.MIN_PYTHON
Node = tuple[tuple[int, int], str, "tuple[int, int] | None"]


@dataclass(frozen=True)
class _Failure:
    reason: str
    at: float


class WheelhouseRoot:
    """The wheelhouses this control node serves (see the module's doc). ``extra``: installed
    distributions the nodes need besides the agent's (``("parsl",)``); ``cache``: where
    wheelhouses are kept (default the virtualenv's, :func:`~elasticslice.pilots.wheelhouse.
    cache_root`); ``clock``: monotonic seconds, for when a failed build is tried again (tests
    pass their own)."""

    def __init__(self, *, extra: tuple[str, ...] = (), cache: Path | str | None = None,
                 retry_failed_after: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.extra = tuple(extra)
        self.cache = Path(cache) if cache is not None else None
        self.retry_failed_after = retry_failed_after
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._ready: dict[str, Wheelhouse] = {}  # tag -> built
        self._failed: dict[str, _Failure] = {}
        self._queue: list[str] = []
        self._building: str | None = None
        self._chosen: dict[str, Wheelhouse] = {}  # a node's tag -> what it is served
        self._fits: dict[tuple[str, str], str | None] = {}  # (house, node tag) -> problem
        self._thread: threading.Thread | None = None
        self._closed = False
        self._publishers: list[TarballPublisher] = []  # its own (publish_tls)

    def __repr__(self) -> str:
        with self._lock:
            return (f"WheelhouseRoot(ready={sorted(self._ready)}, building={self._building}, "
                    f"queued={self._queue}, failed={sorted(self._failed)})")

    # ------------------------------------------------------------------------ the API --
    def publish(self, publisher: TarballPublisher, *, token: str | None = None) -> str:
        """Serve the root on ``publisher`` (under ``token``: the same URL as the last run's);
        its URL, ending ``/``: what :func:`~elasticslice.pilots.bootstrap.env_script` takes."""
        return publisher.publish_resolver("wheelhouse", self.resolve, token=token)

    def publish_tls(self, ca: ClusterCA, host: str, *, port: int = 0,
                    token: str | None = None) -> str:
        """Serve the root over HTTPS on ``host``:``port`` (0: any free port), on a publisher
        of its own (stopped by :meth:`close`) whose certificate is the cluster CA's member
        ``wheelhouse`` (renewed while it runs: :meth:`~elasticslice.pilots.ca.ClusterCA.
        server_context`); its ``https://`` URL. Nodes verify it against the CA
        (:func:`~elasticslice.pilots.bootstrap.env_script`'s ``ca``): what they install is
        the control node's, whoever is on the path."""
        context = ca.server_context("wheelhouse", hosts=(host,))
        publisher = TarballPublisher(host, port, tls=context).start()
        with self._lock:
            self._publishers.append(publisher)
        return self.publish(publisher, token=token)

    @property
    def port(self) -> int | None:
        """The port of its own HTTPS publisher (:meth:`publish_tls`; None: it has none)."""
        with self._lock:
            return self._publishers[-1].port_bound if self._publishers else None

    def build_ahead(self, python: str | None = None, platform: str | None = None) -> str:
        """Build the wheelhouse for Python ``python`` (default this one's) on ``platform``
        (default this machine's) in the background, unless built or on its way; its name
        (``cp310-manylinux_2_35_x86_64``). A Python or platform the root does not build (or
        the agent does not run on) is a :class:`WheelhouseError`."""
        tag = self._tag(python or this_python(), platform or this_platform())
        with self._lock:
            if tag not in self._ready:
                self._failed.pop(tag, None)
                self._enqueue(tag)
        return tag

    def wheelhouse(self, python: str | None = None, platform: str | None = None,
                   timeout: float | None = None) -> Wheelhouse:
        """The wheelhouse for ``python`` on ``platform`` (defaults as :meth:`build_ahead`),
        built first if needed, waiting up to ``timeout`` seconds (None: as long as it takes);
        :class:`WheelhouseError` with the reason its build failed, or on the timeout."""
        tag = self.build_ahead(python, platform)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._wake:
            while tag not in self._ready:
                failed = self._failed.get(tag)
                if failed is not None:
                    raise WheelhouseError(failed.reason)
                left = None if deadline is None else deadline - time.monotonic()
                if self._closed or (left is not None and left <= 0):
                    raise WheelhouseError(f"the wheelhouse {tag} is not built yet")
                self._wake.wait(timeout=left if left is None else min(left, 1.0))
            return self._ready[tag]

    def close(self) -> None:
        """No more builds: the thread ends after the build it is in (queued ones are
        dropped). What is built stays served, but by its own publishers (:meth:`publish_tls`),
        which stop."""
        with self._wake:
            self._closed = True
            self._queue.clear()
            self._wake.notify_all()
            publishers, self._publishers = self._publishers, []
        for publisher in publishers:
            publisher.stop()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=1.0)

    # ---------------------------------------------------------------- the resolver --
    def resolve(self, path: str) -> Path | Unavailable | None:
        """What the publisher serves for ``path`` (``<node tag>/<file>``): a file or folder
        of the wheelhouse that fits the node, 503 while one is built, 404 with the reason."""
        tag, _, rest = path.partition("/")
        if not tag:
            return None
        try:
            node = wheeltags.parse_node_tag(tag)
        except ValueError as err:
            return Unavailable(404, str(err))
        if node[0] < wheeltags.MIN_PYTHON:
            return Unavailable(404, MIN_REASON)
        with self._lock:
            house = self._chosen.get(tag) or self._choose(tag, node)
            if house is None:
                return self._unavailable(tag, node)
        target = house.directory / rest if rest else house.directory
        return target if target.exists() else None

    def _choose(self, tag: str, node: Node) -> Wheelhouse | None:
        """The built wheelhouse to serve a node (lock held): its own, else the first whose
        wheels all fit it."""
        ordered = sorted(self._ready.items(), key=lambda item: item[0] != tag)
        for name, house in ordered:
            if house.python == "%d.%d" % node[0] and self._problem(name, house, tag,
                                                                    node) is None:
                self._chosen[tag] = house
                return house
        return None

    def _problem(self, name: str, house: Wheelhouse, tag: str, node: Node) -> str | None:
        key = (name, tag)
        if key not in self._fits:
            self._fits[key] = next(
                (f"{wheel.name}: {problem}" for wheel in house.wheels
                 if (problem := wheeltags.wheel_problem(wheel.name, *node)) is not None),
                None)
        return self._fits[key]

    def _unavailable(self, tag: str, node: Node) -> Unavailable:
        """503 while a wheelhouse for the node is built (starting one), else 404 (lock
        held)."""
        about = f"Python {node[0][0]}.{node[0][1]} on {node[1]}"
        reason = None
        for want in self._candidates(tag, node):
            if want in self._ready:  # built, and it does not fit the node
                reason = (f"the control node's wheelhouse does not fit it: "
                          f"{self._problem(want, self._ready[want], tag, node)}")
                continue
            failed = self._failed.get(want)
            if failed is not None and self._clock() - failed.at < self.retry_failed_after:
                reason = failed.reason
                continue
            self._failed.pop(want, None)
            if self._closed:
                reason = "the control node builds no more wheelhouses (it is stopping)"
                continue
            ahead = self._enqueue(want)
            doing = ("is building it now" if ahead == 0 else
                     f"builds it after {ahead} other{'s' if ahead > 1 else ''}")
            return Unavailable(503, f"the control node {doing}", retry_after=RETRY_AFTER)
        return Unavailable(404, reason or f"no wheelhouse for {about}")

    def _candidates(self, tag: str, node: Node) -> list[str]:
        """What to build for a node, in order: this control node's own (repacked, no
        network) when it is of its Python and machine, then the node's exact one."""
        own = wheeltags.node_tag(node[0], this_platform())
        if own != tag and this_python() == "%d.%d" % node[0] and \
                this_platform().endswith("_" + node[1]):
            return [own, tag]
        return [tag]

    # ------------------------------------------------------------------- the builder --
    def _tag(self, python: str, platform: str) -> str:
        try:
            major, minor = (int(x) for x in python.split(".")[:2])
            tag = wheeltags.node_tag((major, minor), platform)
            wheeltags.parse_node_tag(tag)
            if (major, minor) < wheeltags.MIN_PYTHON:
                raise ValueError(MIN_REASON)
        except ValueError as err:
            raise WheelhouseError(f"no wheelhouse for Python {python} on {platform}: "
                                  f"{err}") from None
        return tag

    def _enqueue(self, tag: str) -> int:
        """Queue a build of ``tag`` unless it is queued or running (lock held); how many
        builds come before it."""
        if tag != self._building and tag not in self._queue:
            self._queue.append(tag)
            self._wake.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wheelhouse-root",
                                                daemon=True)
                self._thread.start()
        if tag == self._building:
            return 0
        return self._queue.index(tag) + (self._building is not None)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                tag = self._building = self._queue.pop(0)
            house, failure = self._build(tag)
            with self._wake:
                self._building = None
                if house is not None:
                    self._ready[tag] = house
                else:
                    self._failed[tag] = _Failure(str(failure), self._clock())
                self._wake.notify_all()

    def _build(self, tag: str) -> tuple[Wheelhouse | None, str | None]:
        (major, minor), arch, glibc = wheeltags.parse_node_tag(tag)
        platform = wheeltags.platform_tag(arch, glibc)
        started = time.monotonic()
        try:
            house = Wheelhouse.for_python(f"{major}.{minor}", platform=platform,
                                          root=self.cache, extra=self.extra)
        except WheelhouseError as err:
            log.warning("no wheelhouse for Python %d.%d on %s: %s", major, minor, platform,
                        err)
            return None, " ".join(str(err).split())
        except Exception as err:  # noqa: BLE001 - the node is told; the root goes on
            log.exception("building the wheelhouse %s failed", tag)
            return None, f"{type(err).__name__}: {err}"
        log.info("wheelhouse %s ready for the nodes (%s, %.1f s)", tag,
                 "built" if house.built else "from the cache", time.monotonic() - started)
        return house, None


def serve_for_image(publisher: TarballPublisher, *, image_urn: str | None, cm_local: bool,
                    image_python: str | None = None, extra: tuple[str, ...] = (),
                    token: str | None = None, ca: ClusterCA | None = None,
                    keep: Path | None = None) -> tuple[WheelhouseRoot, str]:
    """A root published (under ``token``) with its builds started: this control node's own
    wheelhouse, and the one nodes of ``image_urn`` most likely ask for (its Python:
    ``image_python``, else :func:`~elasticslice.pilots.bootstrap.image_python`; its
    platform: :func:`~elasticslice.pilots.bootstrap.image_platform`) when known and built
    here. With ``ca`` (the cluster's), over HTTPS on ``publisher``'s host
    (:meth:`WheelhouseRoot.publish_tls`), on the port ``keep`` (a JSON file) says the last
    process used when it is free (a node whose tarball was made before a restart asks
    there), else any; without, on ``publisher`` itself (plain HTTP). The root and its URL,
    for :func:`~elasticslice.pilots.bootstrap.env_script` (with ``ca``'s certificate);
    :meth:`WheelhouseRoot.close` it with the publisher."""
    from elasticslice.pilots.bootstrap import image_platform
    from elasticslice.pilots.bootstrap import image_python as python_of
    root = WheelhouseRoot(extra=extra)
    root.build_ahead()
    version = image_python or python_of(image_urn, cm_local)
    if version is not None:
        try:
            root.build_ahead(version, image_platform(image_urn, cm_local))
        except WheelhouseError as err:  # the nodes are told, one line each
            log.warning("nodes of %s: %s", image_urn or "the default image", err)
    if ca is None:
        return root, root.publish(publisher, token=token)
    return root, _publish_tls(root, ca, publisher.host, keep, token)


def _publish_tls(root: WheelhouseRoot, ca: ClusterCA, host: str, keep: Path | None,
                 token: str | None) -> str:
    """The root over HTTPS on the port ``keep`` names if it is free, else any (kept)."""
    try:
        port = int((read_json(keep) or {}).get("port", 0)) if keep is not None else 0
    except (ElasticSliceError, ValueError, TypeError, AttributeError):
        port = 0
    try:
        url = root.publish_tls(ca, host, port=port, token=token)
    except PublishError as err:
        if not port:
            raise
        log.info("the wheelhouse's port %d is taken (%s): it is served on another", port, err)
        url = root.publish_tls(ca, host, token=token)
    if keep is not None:
        try:
            write_json(keep, {"port": root.port})
        except OSError as err:
            log.warning("%s: cannot keep the wheelhouse's port: %s", keep, err.strerror or err)
    return url
