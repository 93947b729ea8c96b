"""The helper that makes every node a Troy pilot: its startup command is the pilot agent.

Each node gets an install tarball of its own, rooted at ``/`` (CloudLab's AddNodes installs
tarballs at ``/``), published over HTTP by a :class:`~elasticslice.pilots.publish.
TarballPublisher` at a URL the tarball rule accepts, and fetched by the CM. It holds, under
:attr:`PilotElasticSliceHelper.INSTALL_PATH` (``/local/pilot``), only the cluster CA's
certificate, a single-use enrolment token bound to the node's client_id (valid until its
boot deadline) and ``start.sh``; no key, no certificate of the node. ``start.sh`` asks
``geni-get client_id`` for the node's name, enrols (``python -m troy.frameworks.dask.enrol``:
the node makes its own key and gets a short-lived certificate from the control node's
:class:`~elasticslice.pilots.enrol.EnrolmentService`, pinning the cluster CA), then starts::

    "$py" -m troy.frameworks.dask node tls://HOST:PORT CORES CLIENT_ID [ADDRESS]

with the node's cores (``nproc``; the box's nodes say theirs in ``ELASTICSLICE_CORES``, a
box-only hint), Dask's TLS variables pointing at the files the node made, and
``TROY_NODE_RENEW_URL`` (the agent renews its certificate). ADDRESS is the node's own
address in the sliver's manifest (``geni-get manifest``) when it is configured on the node;
without it the agent uses the address it reaches the scheduler from. ``py`` runs Python with
the agent: built on the node by the lines of :func:`~elasticslice.pilots.bootstrap.env_script`
(the image's ``python3``, the wheelhouse the control node publishes) unless ``node_python``
names an image's own (``[pilots] node_python``; the box's ``ELASTICSLICE-PILOT`` image has it). No secret is on a command line or in a log: the command is
``sh /local/pilot/start.sh``, the token travels in a 0600 file and is spent on first use.
"""
from __future__ import annotations

import io
import logging
import shlex
import tarfile
import time
from pathlib import Path
from typing import Any

from elasticslice.config import PilotSettings, default_listen, load_pilot_settings
from elasticslice.errors import ElasticSliceError
from elasticslice.managers.helpers import SimpleElasticSliceHelper
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.publish import TarballPublisher
from elasticslice.rpc import pki
from elasticslice.rspec import NodeSpec
from troy.frameworks.dask.enrol import RENEW_URL_ENV
from troy.frameworks.dask.tls import DaskTLS

log = logging.getLogger(__name__)

DEFAULT_NODE_PYTHON = "python3"
DEFAULT_ENROL_WITHIN = 1800.0  # seconds from a tarball's making to its node's boot deadline


def python_lines(node_python: str) -> str:
    """The sh lines that set ``py`` to the command running the agent's Python:
    ``node_python`` itself when it is one word, else the tarball's ``python`` wrapper
    (:func:`python_wrapper`), so that ``"$py" -m ...`` works either way."""
    if len(shlex.split(node_python)) == 1:
        return f"py={node_python}\n"
    return 'py="$here/python"\n'


def python_wrapper(node_python: str) -> bytes | None:
    """The ``python`` script a ``node_python`` of several words runs through (None: one)."""
    if len(shlex.split(node_python)) == 1:
        return None
    return f'#!/bin/sh\nexec {node_python} "$@"\n'.encode()


def agent_script(scheduler: str, node_python: str, enrol_url: str,
                 env_lines: str | None = None) -> str:
    """``start.sh``: enrol (the node makes its key), then the node agent with TLS files next
    to the script, named by geni-get, advertising its manifest address when it has one.
    ``env_lines``: sh lines that set ``py`` (``bootstrap.env_script()``); default
    ``node_python``."""
    env = DaskTLS('"$here"/ca.pem', '"$here"/node.pem', '"$here"/node.key').environ()
    env[RENEW_URL_ENV] = shlex.quote(enrol_url)
    exports = "\n".join(f"export {key}={value}" for key, value in sorted(env.items()))
    python = env_lines if env_lines is not None else python_lines(node_python)
    url = shlex.quote(enrol_url)
    return (f"#!/bin/sh\n"
            f"# this node's pilot agent: enrols at {enrol_url}, then a Dask worker joining "
            f"{scheduler} over TLS\n"
            f'here=$(cd "$(dirname "$0")" && pwd)\n'
            f'name=$(geni-get client_id) || {{ echo "geni-get client_id failed" >&2; exit 1; }}\n'
            f"# --- the agent's Python: these lines set py ---\n"
            f"{python.rstrip()}\n"
            f"# --- the address to advertise (meanwhile): the manifest's, if configured here ---\n"
            f'(geni-get manifest 2>/dev/null | "$py" -m troy.frameworks.dask.enrol --advertise '
            f'"$name" > "$here/address" || :) &\n'
            f"advertise=$!\n"
            f"# --- enrolment: this node makes its key; the token is spent ---\n"
            f'if [ -f "$here/token" ]; then\n'
            f'    "$py" -m troy.frameworks.dask.enrol {url} "$here/token" "$here/ca.pem" '
            f'"$name" "$here" || exit 1\n'
            f'elif [ ! -s "$here/node.pem" ] || [ ! -s "$here/node.key" ]; then\n'
            f'    echo "$name: no enrolment token and no certificate in $here" >&2; exit 1\n'
            f"fi\n"
            f"{exports}\n"
            f'wait "$advertise"; host=$(cat "$here/address" 2>/dev/null) || host=\n'
            f'cores="${{ELASTICSLICE_CORES:-$(nproc)}}"  # ELASTICSLICE_CORES: the box only\n'
            f'exec "$py" -m troy.frameworks.dask node {shlex.quote(scheduler)} '
            f'"$cores" "$name" ${{host:+"$host"}}\n')


def node_command(value: str) -> str:
    """``node_python`` checked and quoted for a shell (one command, with arguments)."""
    try:
        words = shlex.split(value)
    except ValueError as err:
        raise ValueError(f"node_python {value!r}: {err}") from None
    if not words or any(c in value for c in "\n\r\0"):
        raise ValueError(f"node_python must be a command (e.g. python3), not {value!r}")
    return shlex.join(words)


class PilotElasticSliceHelper(SimpleElasticSliceHelper):
    """A :class:`SimpleElasticSliceHelper` whose nodes run the Troy node agent.

    ``ca``: the cluster CA; ``scheduler``: the Dask scheduler's ``tls://`` address;
    ``tarball_dir``: where the per-node tarballs are kept (0700, removed with the node);
    ``publisher``: a started :class:`TarballPublisher` that serves them to the CM;
    ``enrolment``: the started :class:`~elasticslice.pilots.enrol.EnrolmentService` that
    issues each node's token and certificate; ``enrol_url``: its URL as nodes reach it
    (default its own); ``enrol_within``: seconds from a node's tarball to its boot deadline
    (its token's validity); ``node_python``: the command running Python with the agent on
    the node's image (default: ``[pilots] node_python`` of the server's config, else
    ``python3``); ``image_urn``: the image nodes boot (default: ``[pilots] disk_image``).
    Other options as :class:`SimpleElasticSliceHelper`."""

    INSTALL_PATH = "/local/pilot"

    def __init__(self, ca: ClusterCA, scheduler: str, tarball_dir: Path, *,
                 publisher: TarballPublisher | None = None, enrolment: Any = None,
                 enrol_url: str | None = None, enrol_within: float = DEFAULT_ENROL_WITHIN,
                 node_python: str | None = None, image_urn: str | None = None,
                 server: Any = None, config: Any = None, num_pcs: int = 1,
                 **options: Any) -> None:
        settings = _settings(server)
        super().__init__(server, config, num_pcs=num_pcs,
                         image_urn=image_urn or settings.disk_image, **options)
        if not scheduler.startswith("tls://"):
            raise ValueError(f"the pilots' scheduler must be tls://, not {scheduler!r}")
        #: the image has the agent's environment (``node_python`` given): nothing to build;
        #: else the node builds it with the image's ``python3`` (``env_lines``, the cluster's)
        self.has_environment = bool(node_python or settings.node_python)
        self.node_python = node_command(node_python or settings.node_python
                                        or DEFAULT_NODE_PYTHON)
        self.ca = ca
        self.scheduler = scheduler
        self.tarball_dir = Path(tarball_dir)
        self.publisher = publisher
        self.enrolment = enrolment
        self.enrol_url = enrol_url
        self.enrol_within = enrol_within
        #: sh lines that set ``py`` (bootstrap.env_script(); None: from node_python)
        self.env_lines: str | None = None
        self.startup_command = f"sh {self.INSTALL_PATH}/start.sh"
        self._urls: dict[str, str] = {}
        self._made: set[str] = set()  # nodes given a tarball (and a token)

    def tarball(self, client_id: str) -> Path:
        """The node's install tarball (made anew, with a new token that voids the last):
        the CA certificate, its enrolment token and the script, under ``local/pilot/``
        (installed at ``/``); no key."""
        path = self.tarball_dir / f"{client_id}.tar.gz"
        if self.enrolment is None:
            raise ElasticSliceError("the pilot helper has no enrolment service: nodes enrol "
                                    "to get their certificate")
        url = self.enrol_url or self.enrolment.url
        token = self.enrolment.token_for(client_id, deadline=time.time() + self.enrol_within)
        self._made.add(client_id)
        script = agent_script(self.scheduler, self.node_python, url, self.env_lines)
        top = self.INSTALL_PATH.strip("/")
        members = [("ca.pem", self.ca.cert_pem, 0o644), ("token", token.encode(), 0o600),
                   ("start.sh", script.encode(), 0o700)]
        wrapper = python_wrapper(self.node_python) if self.env_lines is None else None
        if wrapper is not None:
            members.append(("python", wrapper, 0o700))
        buf = io.BytesIO()
        now = int(time.time())
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            parts = top.split("/")
            for depth in range(1, len(parts) + 1):  # the folders, 0700 at the end
                info = tarfile.TarInfo("/".join(parts[:depth]))
                info.type, info.mtime = tarfile.DIRTYPE, now
                info.mode = 0o700 if depth == len(parts) else 0o755
                tar.addfile(info)
            for arcname, data, mode in members:
                info = tarfile.TarInfo(f"{top}/{arcname}")
                info.size, info.mode, info.mtime = len(data), mode, now
                tar.addfile(info, io.BytesIO(data))
        self.tarball_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        pki.write_private_file(path, buf.getvalue())
        return path

    def tarball_url(self, client_id: str) -> str:
        """Where the CM fetches the node's tarball (published once)."""
        if client_id not in self._urls:
            if self.publisher is None:
                raise ElasticSliceError("the pilot helper has no tarball publisher: nodes "
                                        "fetch their tarball by URL")
            self._urls[client_id] = self.publisher.publish(self.tarball(client_id),
                                                           f"{client_id}.tar.gz")
        return self._urls[client_id]

    def node_spec(self, client_id: str) -> NodeSpec:
        spec = super().node_spec(client_id)
        spec.installs = [*spec.installs, (self.tarball_url(client_id), "/")]
        return spec

    def forget_node(self, client_id: str) -> None:
        """The node left: its token, its tarball and its URL go."""
        if self.enrolment is not None:
            self.enrolment.forget(client_id)
        self._made.discard(client_id)
        url = self._urls.pop(client_id, None)
        if url is not None and self.publisher is not None:
            self.publisher.withdraw(url)
        try:
            (self.tarball_dir / f"{client_id}.tar.gz").unlink(missing_ok=True)
        except OSError as err:
            log.warning("cannot remove the tarball of %s: %s", client_id, err.strerror or err)

    def forget_all(self) -> None:
        """Every node's token, tarball and URL go (the cluster closes)."""
        for client_id in {*self._urls, *self._made}:
            self.forget_node(client_id)
        try:
            for path in self.tarball_dir.glob("*.tar.gz"):
                path.unlink(missing_ok=True)
        except OSError as err:
            log.warning("cannot remove the nodes' tarballs in %s: %s", self.tarball_dir,
                        err.strerror or err)

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        if node.get("client_id"):
            self.forget_node(str(node["client_id"]))


def _settings(server: Any) -> PilotSettings:
    """``[pilots]`` of the server's config file (empty when there is none)."""
    path = getattr(getattr(server, "config", None), "path", None)
    return load_pilot_settings(path) if path is not None else PilotSettings()


def pilots_listen(server: Any) -> str:
    """Where the nodes reach this machine, for a cluster without ``listen`` of its own: the
    ``[pilots] listen`` of the server's config (the box writes its control address there),
    else :func:`~elasticslice.config.default_listen` of its CM URLs."""
    cm_urls = getattr(getattr(server, "config", None), "cm_urls", ())
    return _settings(server).listen or default_listen(cm_urls)
