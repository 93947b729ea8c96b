"""The helper that makes every node a Troy pilot: its startup command is the pilot agent.

Each node gets an install tarball of its own, rooted at ``/`` (CloudLab's AddNodes installs
tarballs at ``/``), published over HTTP by a :class:`~elasticslice.pilots.publish.
TarballPublisher` at a URL the tarball rule accepts, and fetched by the CM. It holds, under
:attr:`PilotElasticSliceHelper.INSTALL_PATH` (``/local/pilot``), the cluster CA certificate,
the node's certificate and key (issued by :class:`~elasticslice.pilots.ca.ClusterCA` for its
client_id) and ``start.sh``, which asks ``geni-get client_id`` for the node's name and
starts::

    <node_python> -m troy.frameworks.dask node tls://HOST:PORT CORES CLIENT_ID

with the node's cores (``nproc``; the box's nodes say theirs in ``ELASTICSLICE_CORES``) and
Dask's TLS variables pointing at those files. ``node_python`` is the command that runs
Python with the agent installed on the node's image (default ``python3``; the emulator's
config names its pilot image and ``python3`` in ``[pilots]``). No secret is on a command
line or in a log: the command is ``sh /local/pilot/start.sh``; the key travels only inside
the tarball (0600 files; issue 20 replaces this with an enrolment).
"""
from __future__ import annotations

import io
import logging
import shlex
import tarfile
import time
from pathlib import Path
from typing import Any

from elasticslice.config import PilotSettings, load_pilot_settings
from elasticslice.errors import ElasticSliceError
from elasticslice.managers.helpers import SimpleElasticSliceHelper
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.publish import TarballPublisher
from elasticslice.rpc import pki
from elasticslice.rspec import NodeSpec
from troy.frameworks.dask.tls import DaskTLS

log = logging.getLogger(__name__)

DEFAULT_NODE_PYTHON = "python3"


def agent_script(scheduler: str, node_python: str, worker_host: str | None) -> str:
    """``start.sh``: the node agent with TLS files next to the script, named by geni-get."""
    env = DaskTLS('"$here"/ca.pem', '"$here"/node.pem', '"$here"/node.key').environ()
    exports = "\n".join(f"export {key}={value}" for key, value in sorted(env.items()))
    host = (f'"${{ELASTICSLICE_NODE_IP:-{worker_host}}}"' if worker_host
            else '${ELASTICSLICE_NODE_IP:+"$ELASTICSLICE_NODE_IP"}')
    return (f"#!/bin/sh\n"
            f"# this node's pilot agent: a Dask worker joining {scheduler} over TLS\n"
            f'here=$(cd "$(dirname "$0")" && pwd)\n'
            f"{exports}\n"
            f'name=$(geni-get client_id) || {{ echo "geni-get client_id failed" >&2; exit 1; }}\n'
            f'cores="${{ELASTICSLICE_CORES:-$(nproc)}}"\n'
            f"exec {node_python} -m troy.frameworks.dask node {shlex.quote(scheduler)} "
            f'"$cores" "$name" {host}\n')


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
    ``node_python``: the command running Python with the agent on the node's image
    (default: ``[pilots] node_python`` of the server's config, else ``python3``);
    ``image_urn``: the image nodes boot (default: ``[pilots] disk_image``); ``worker_host``:
    the address each agent listens on when the node does not say (``ELASTICSLICE_NODE_IP``).
    Other options as :class:`SimpleElasticSliceHelper`."""

    INSTALL_PATH = "/local/pilot"

    def __init__(self, ca: ClusterCA, scheduler: str, tarball_dir: Path, *,
                 publisher: TarballPublisher | None = None, node_python: str | None = None,
                 image_urn: str | None = None, worker_host: str | None = "127.0.0.1",
                 server: Any = None, config: Any = None, num_pcs: int = 1,
                 **options: Any) -> None:
        settings = _settings(server)
        super().__init__(server, config, num_pcs=num_pcs,
                         image_urn=image_urn or settings.disk_image, **options)
        if not scheduler.startswith("tls://"):
            raise ValueError(f"the pilots' scheduler must be tls://, not {scheduler!r}")
        self.node_python = node_command(node_python or settings.node_python
                                        or DEFAULT_NODE_PYTHON)
        self.ca = ca
        self.scheduler = scheduler
        self.tarball_dir = Path(tarball_dir)
        self.publisher = publisher
        self.worker_host = worker_host
        self.startup_command = f"sh {self.INSTALL_PATH}/start.sh"
        self._urls: dict[str, str] = {}

    def tarball(self, client_id: str) -> Path:
        """The node's install tarball (made once): CA, node certificate and key, script,
        under ``local/pilot/`` (installed at ``/``)."""
        path = self.tarball_dir / f"{client_id}.tar.gz"
        if path.exists():
            return path
        cert, key = self.ca.issue(client_id, role="worker")
        script = agent_script(self.scheduler, self.node_python, self.worker_host)
        top = self.INSTALL_PATH.strip("/")
        members = [("ca.pem", self.ca.cert_pem, 0o600), ("node.pem", cert.read_bytes(), 0o600),
                   ("node.key", key.read_bytes(), 0o600), ("start.sh", script.encode(), 0o700)]
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
        """The node left: its tarball (with its key) and its URL go."""
        url = self._urls.pop(client_id, None)
        if url is not None and self.publisher is not None:
            self.publisher.withdraw(url)
        try:
            (self.tarball_dir / f"{client_id}.tar.gz").unlink(missing_ok=True)
        except OSError as err:
            log.warning("cannot remove the tarball of %s: %s", client_id, err.strerror or err)

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        if node.get("client_id"):
            self.forget_node(str(node["client_id"]))


def _settings(server: Any) -> PilotSettings:
    """``[pilots]`` of the server's config file (empty when there is none)."""
    path = getattr(getattr(server, "config", None), "path", None)
    return load_pilot_settings(path) if path is not None else PilotSettings()
