"""The nodes of a :class:`~elasticslice.parsl.provider.CloudLabProvider`: what each is
(:class:`ParslNodeHelper`), the start script it runs and the slice's install tarball."""
from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticslice.managers.helpers import SimpleElasticSliceHelper
from elasticslice.parsl.blocks import BlockBook
from elasticslice.parsl.keys import is_loopback
from elasticslice.pilots.failures import NodeFailures
from elasticslice.pilots.helper import script_head
from elasticslice.pilots.slicetar import NAME as SLICE_TARBALL
from elasticslice.pilots.slicetar import NODES, Member, SliceTarball

INSTALL_PATH = "/local/parsl"
#: on the node: its CurveZMQ pair and the interchange's public key (the pool's --cert_dir)
NODE_KEYS = f"{INSTALL_PATH}/curve"
_CERT_DIR = re.compile(r"--cert_dir[= ](\S+)")
_ADDRESSES = re.compile(r"(?:^|\s)(?:-a|--addresses)[= ](\S+)")


class CommandRefused(ValueError):
    """A worker command no node may run: one line saying why."""


def node_command(command: str, address: str) -> tuple[str, Path | None]:
    """The worker command as a node runs it, and the executor's key folder (None: the pool
    is not encrypted). An encrypted pool's ``--cert_dir`` (the executor's folder, on this
    machine) becomes the node's own key folder (:data:`NODE_KEYS`); an unencrypted pool is
    refused unless every address it reaches the interchange at (``address`` when it names
    none) is loopback."""
    found = _CERT_DIR.search(command)
    if found is None or found.group(1) == "None":
        _clear_on_loopback(command, address)
        return command, None
    cert_dir = Path(found.group(1))
    if not (cert_dir / "server.key").is_file():
        raise CommandRefused(f"the executor's key folder {cert_dir} has no server.key: is "
                             f"this the executor's command?")
    return command[:found.start()] + f"--cert_dir {NODE_KEYS}" + command[found.end():], cert_dir


def _clear_on_loopback(command: str, address: str) -> None:
    where = _ADDRESSES.search(command)
    exposed = [a for a in (where.group(1).split(",") if where else [address])
               if not is_loopback(a)]
    if exposed:
        raise CommandRefused(
            f"HighThroughputExecutor(encrypted=False) would serve Parsl's interchange in "
            f"the clear on {exposed[0]}, where anyone who reaches it can take the tasks "
            f"and send it pickles: keep Parsl's default encrypted=True (unencrypted is "
            f"for loopback only)")


def check_node_command(command: str, address: str) -> str:
    """``command`` if a node may run it as :func:`node_command` made it (the manager daemon
    checks what the provider's process sends): an encrypted pool with the node's own key
    folder, or an unencrypted one on loopback only; :class:`CommandRefused` otherwise."""
    found = _CERT_DIR.search(command)
    if found is None or found.group(1) == "None":
        _clear_on_loopback(command, address)
    elif found.group(1) != NODE_KEYS or len(_CERT_DIR.findall(command)) != 1:
        raise CommandRefused(f"a node's worker pool reads its keys from {NODE_KEYS} only")
    return command


class ParslNodeHelper(SimpleElasticSliceHelper):
    """Nodes named ``parsl-<n>``, each bound to a block when it is asked for. The slice's
    nodes share one install tarball (at ``/``, published by ``publisher`` under ``token``:
    :mod:`elasticslice.pilots.slicetar`) holding ``start.sh`` (build the environment,
    ``env_lines``, then run the node's block's worker command), the cluster CA's
    certificate (``ca``) and, per held node, its command (``nodes/<client_id>/command``)
    and, until it enrolled, its single-use enrolment token (``nodes/<client_id>/token``,
    0600, from ``enrolment``). A command whose worker pool is encrypted (``--cert_dir``
    :data:`NODE_KEYS`) makes the node enrol at ``enrol_url`` and have its own CurveZMQ key
    authorised (:mod:`elasticslice.parsl.keys`) before it runs; no key is in the tarball.
    ``failures``: where nodes that failed to start are named; ``report_url``: where their
    start scripts say why; ``on_gone(client_id)``: called when a node left."""

    def __init__(self, book: BlockBook, publisher: Any, tarball_dir: Path, env_lines: str,
                 *, cores: int | None = None, server: Any = None, token: str | None = None,
                 report_url: str | None = None, failures: NodeFailures | None = None,
                 ca: Any = None, enrolment: Any = None, enrol_url: str | None = None,
                 enrol_within: float = 1800.0,
                 on_gone: Callable[[str], object] | None = None, **options: Any) -> None:
        super().__init__(server, None, node_prefix="parsl",
                         startup_command=f"sh {INSTALL_PATH}/start.sh", **options)
        self.book = book
        self.publisher = publisher
        self.token = token
        self.report_url = report_url
        self.env_lines = env_lines
        self.cores = cores
        self.ca, self.enrolment, self.enrol_url = ca, enrolment, enrol_url
        self.enrol_within = enrol_within
        self.on_gone = on_gone
        self.failures = failures if failures is not None else NodeFailures()
        self.slice_tarball = SliceTarball(Path(tarball_dir) / SLICE_TARBALL, INSTALL_PATH,
                                          {})
        self._url: str | None = None

    def start_script(self) -> str:
        cores = f"export PARSL_CORES={int(self.cores)}\n" if self.cores else ""
        head = script_head("this node runs Parsl's worker pool for its block", INSTALL_PATH,
                           self.report_url)
        url = shlex.quote(self.enrol_url or "")
        keys = '"$here/curve"'
        return (f"{head}"
                f'cmd=$(asroot cat "$here/{NODES}/$name/command" 2>/dev/null) && '
                f'printf "%s" "$cmd" > "$here/command" || '
                f'cmd=$(cat "$here/command" 2>/dev/null) || '
                f'fail "no Parsl block for $name in the tarball"\n'
                f"# --- an encrypted pool: this node's own CurveZMQ key, authorised after it "
                f"enrols\n"
                f'case "$cmd" in *"--cert_dir {NODE_KEYS}"*) keys=yes ;; *) keys= ;; esac\n'
                f'if [ -n "$keys" ] && [ -s {keys}/client.key_secret ] && '
                f'[ -s {keys}/server.key_secret ]; then\n'
                f"    keys=  # a reboot: its key is still allowed while the node is held\n"
                f"fi\n"
                f'if [ -n "$keys" ]; then\n'
                f'    asroot cat "$here/{NODES}/$name/token" > "$here/token" 2>/dev/null || '
                f'rm -f "$here/token"\n'
                f"fi\n"
                f'asroot rm -rf "$here/{NODES}" || fail "cannot remove $here/{NODES}"\n'
                f"{self.env_lines.rstrip()}\n"
                f'if [ -n "$keys" ]; then\n'
                f'    [ -s "$here/token" ] || fail "no enrolment token for $name in the '
                f'tarball and no key in $here/curve"\n'
                f'    "$py" -m troy.frameworks.dask.enrol {url} "$here/token" "$here/ca.pem" '
                f'"$name" "$here" || exit 1\n'
                f'    "$py" -m elasticslice.parsl.keys node {url} "$here/ca.pem" '
                f'"$here/node.pem" "$here/node.key" "$name" {keys} || exit 1\n'
                f"fi\n"
                f'mkdir -p "$here/bin"\n'
                f"cat > \"$here/bin/process_worker_pool.py\" <<PARSL_POOL\n"
                f"#!/bin/sh\n"
                f'exec "$py" -m parsl.executors.high_throughput.process_worker_pool "\\$@"\n'
                f"PARSL_POOL\n"
                f'chmod 755 "$here/bin/process_worker_pool.py"\n'
                f'export PATH="$here/bin:$(dirname "$py"):$PATH"\n'
                f"{cores}"
                f'cd "$here"\n'
                f'[ -s "$err" ] && cat "$err" >&3\n'
                f"trap - EXIT\n"
                f"exec 2>&3 3>&-\n"
                f'exec /bin/sh -c "$cmd"\n')

    def tarball_url(self) -> str:
        """The slice's tarball URL (published once; the file made now if it is not there)."""
        if self._url is None:
            common = {"start.sh": Member(self.start_script().encode(), 0o755)}
            if self.ca is not None:
                common["ca.pem"] = Member(self.ca.cert_pem, 0o644)
            self.slice_tarball.set_common(common)
            self._url = self.publisher.publish(self.slice_tarball.path, SLICE_TARBALL,
                                               token=self.token)
        return self._url

    def node_spec(self, client_id: str) -> Any:
        spec = super().node_spec(client_id)
        block = self.book.bind(client_id)
        if block is None:  # the sliver's first node with no block yet: it runs nothing
            spec.executes = []
            return spec
        url = self.tarball_url()
        files = {"command": Member(block.command.encode())}
        if self.enrolment is not None and f"--cert_dir {NODE_KEYS}" in block.command:
            token = self.enrolment.token_for(client_id,
                                             deadline=time.time() + self.enrol_within)
            files["token"] = Member(token.encode(), 0o600)
        self.slice_tarball.set_node(client_id, files)
        spec.installs = [*spec.installs, (url, "/")]
        return spec

    def enrolled(self, client_id: str) -> None:
        """The node spent its token: the tarball keeps only its command."""
        block = self.book.of(client_id)
        if block is not None:
            self.slice_tarball.set_node(client_id, {"command": Member(block.command.encode())})

    def handle_added_node(self, node: dict[str, Any], status: str) -> None:
        if status == "failed":
            self.failures.failed(str(node.get("client_id")), str(node.get("node_id") or ""),
                                 "failed (the CM says; see the manager's log)")

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        """The node left: its token, its files and its CurveZMQ key go."""
        cid = str(node.get("client_id") or "")
        self.failures.forget(cid)
        if self.enrolment is not None:
            self.enrolment.forget(cid)
        if self.on_gone is not None:
            self.on_gone(cid)
        self.slice_tarball.drop_node(cid)

    def close(self, *, remove: bool) -> None:
        url, self._url = self._url, None
        if url is not None:
            self.publisher.withdraw(url)
        if remove:
            self.slice_tarball.path.unlink(missing_ok=True)


def node_software(services: Any, *, server: Any, node_python: str | None,
                  disk_image: str | None, image_python: str | None) -> str:
    """sh lines building the nodes' environment: the agent's wheelhouse with Parsl, which
    ``services`` (:class:`~elasticslice.pilots.services.ControlServices`) publishes, each
    node the wheelhouse of its own Python and machine, verified against the cluster CA; or
    naming the image's Python that has Parsl (``node_python``)."""
    from elasticslice.pilots.bootstrap import env_script
    if node_python is not None:
        return env_script(None, python=node_python)
    urls = list(getattr(getattr(server, "config", None), "cm_urls", None) or [])
    return services.node_software(image_urn=disk_image, image_python=image_python,
                                  cm_urls=urls, extra=("parsl",),
                                  target=f"{INSTALL_PATH}/env")
