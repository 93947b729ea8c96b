"""The helper that makes every node a Troy pilot: its startup command is the pilot agent.

Each node gets an install tarball of its own (``file://`` URL, unpacked by CloudLab at
:attr:`PilotElasticSliceHelper.INSTALL_PATH`) holding the cluster CA certificate, the node's
certificate and key (issued by :class:`~elasticslice.pilots.ca.ClusterCA` for its client_id)
and ``start.sh``, which starts::

    <absolute venv python> -m troy.frameworks.dask node tls://HOST:PORT CORES CLIENT_ID

with the node's cores (``ELASTICSLICE_CORES``, else ``nproc``) and Dask's TLS variables
pointing at those files. No secret is on a command line or in a log: the command is
``sh /local/pilot/start.sh``; the key travels only inside the tarball (0600 files).
"""
from __future__ import annotations

import io
import logging
import os
import shlex
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from elasticslice.managers.helpers import SimpleElasticSliceHelper
from elasticslice.pilots.ca import ClusterCA
from elasticslice.rpc import pki
from elasticslice.rspec import NodeSpec
from troy.frameworks.dask.tls import DaskTLS

log = logging.getLogger(__name__)


def agent_script(scheduler: str, name: str, python: str, worker_host: str | None) -> str:
    """``start.sh``: the node agent with TLS files next to the script."""
    env = DaskTLS('"$here"/ca.pem', '"$here"/node.pem', '"$here"/node.key').environ()
    exports = "\n".join(f"export {key}={value}" for key, value in sorted(env.items()))
    host = (f'"${{ELASTICSLICE_NODE_IP:-{worker_host}}}"' if worker_host
            else '${ELASTICSLICE_NODE_IP:+"$ELASTICSLICE_NODE_IP"}')
    return (f"#!/bin/sh\n"
            f"# the pilot agent of {name}: a Dask worker joining {scheduler} over TLS\n"
            f'here=$(cd "$(dirname "$0")" && pwd)\n'
            f"{exports}\n"
            f'cores="${{ELASTICSLICE_CORES:-$(nproc)}}"\n'
            f"exec {shlex.quote(python)} -m troy.frameworks.dask node {shlex.quote(scheduler)} "
            f'"$cores" {shlex.quote(name)} {host}\n')


class PilotElasticSliceHelper(SimpleElasticSliceHelper):
    """A :class:`SimpleElasticSliceHelper` whose nodes run the Troy node agent.

    ``ca``: the cluster CA; ``scheduler``: the Dask scheduler's ``tls://`` address;
    ``tarball_dir``: where the per-node tarballs are kept (0700, removed with the node);
    ``python``: the interpreter nodes run (absolute; a node's PATH has no virtualenv);
    ``worker_host``: the address each agent listens on when the node does not say
    (``ELASTICSLICE_NODE_IP``). Other options as :class:`SimpleElasticSliceHelper`."""

    INSTALL_PATH = "/local/pilot"

    def __init__(self, ca: ClusterCA, scheduler: str, tarball_dir: Path, *,
                 python: str = sys.executable, worker_host: str | None = "127.0.0.1",
                 server: Any = None, config: Any = None, num_pcs: int = 1,
                 **options: Any) -> None:
        super().__init__(server, config, num_pcs=num_pcs, **options)
        if not scheduler.startswith("tls://"):
            raise ValueError(f"the pilots' scheduler must be tls://, not {scheduler!r}")
        if not os.path.isabs(python):
            raise ValueError(f"python must be an absolute path, not {python!r}")
        self.ca = ca
        self.scheduler = scheduler
        self.tarball_dir = Path(tarball_dir)
        self.python = python
        self.worker_host = worker_host
        self.startup_command = f"sh {self.INSTALL_PATH}/start.sh"

    def tarball(self, client_id: str) -> Path:
        """The node's install tarball (made once): CA, node certificate and key, script."""
        path = self.tarball_dir / f"{client_id}.tar.gz"
        if path.exists():
            return path
        cert, key = self.ca.issue(client_id)
        script = agent_script(self.scheduler, client_id, self.python, self.worker_host)
        members = [("ca.pem", self.ca.cert_pem, 0o600), ("node.pem", cert.read_bytes(), 0o600),
                   ("node.key", key.read_bytes(), 0o600), ("start.sh", script.encode(), 0o700)]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for arcname, data, mode in members:
                info = tarfile.TarInfo(arcname)
                info.size, info.mode, info.mtime = len(data), mode, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        self.tarball_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        pki.write_private_file(path, buf.getvalue())
        return path

    def node_spec(self, client_id: str) -> NodeSpec:
        spec = super().node_spec(client_id)
        spec.installs = [*spec.installs, (self.tarball(client_id).as_uri(), self.INSTALL_PATH)]
        return spec

    def forget_node(self, client_id: str) -> None:
        """The node left: its tarball (with its key) goes."""
        try:
            (self.tarball_dir / f"{client_id}.tar.gz").unlink(missing_ok=True)
        except OSError as err:
            log.warning("cannot remove the tarball of %s: %s", client_id, err.strerror or err)

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        if node.get("client_id"):
            self.forget_node(str(node["client_id"]))
