"""The manager daemon of a :class:`~elasticslice.parsl.provider.CloudLabProvider`.

    python -m elasticslice.parsl.daemon --config FILE --state-dir DIR --arguments JSON

The one process of a Parsl user's control node that holds the CloudLab credentials and the
cluster CA's key: it makes the CM calls (the :class:`~.manager.ParslSliceManager`), answers
CloudLab's callbacks, enrols the nodes, authorises their CurveZMQ keys in the executor's key
folder and publishes the slice's tarball. It never loads Parsl's executor nor speaks to the
interchange: Parsl's DataFlowKernel, which unpickles what nodes send, is the provider's
process, which starts this one, tells it the blocks over the local channel
(:class:`~.remote.RemoteBlocks`) and holds a block's managers when a notice comes.

It starts its manager once the provider told its blocks (a daemon started again hears which
node was whose first, so no node of a live block goes back as no block's), and stops when
the provider closes (giving the slice back unless ``keep``), on SIGTERM (keeping it), or
after ``--orphan-timeout`` seconds with no provider attached (keeping it: a provider on the
same state directory resumes). Its log is ``DIR/daemon.log``. Until it is ready it speaks on
stderr: one ``Error: ...`` line and exit 1 when it cannot start.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.config import EndpointConfig
from elasticslice.managers.cycle import PARSL_INTERVALS
from elasticslice.managers.policy import NodeState
from elasticslice.managers.statedir import StateDirLock, make_state_dir
from elasticslice.parsl.blocks import BlockBook
from elasticslice.parsl.keys import AuthorisedKeys
from elasticslice.parsl.remote import RemoteBlocks
from elasticslice.pilots.daemonkit import Orphaned, cannot_start, serve
from elasticslice.pilots.failures import NodeFailures

LOG_FILE = "daemon.log"
ORPHAN_TIMEOUT = 600.0  # seconds without a provider before the daemon stops (nodes kept)
SYNC_EVERY = 0.5        # seconds between two tellings of the blocks' nodes

log = logging.getLogger(__name__)

#: the daemon's keyword arguments the provider passes (``--arguments``)
ARGUMENTS = ("max_nodes", "hardware_type", "disk_image", "image_python", "node_python",
             "cores_per_node", "margin", "listen", "public_url", "endpoint_port",
             "intervals", "publish_port")


@dataclasses.dataclass
class ParslDaemonCommand:
    """How a provider starts its daemon (:func:`~elasticslice.pilots.daemon.spawn_daemon`):
    the client config file, the daemon's arguments, the environment's additions."""

    config: str
    arguments: Mapping[str, Any]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    connect_timeout: float = 60.0
    orphan_timeout: float | None = None

    def argv(self, state_dir: Path) -> list[str]:
        args = [sys.executable, "-m", "elasticslice.parsl.daemon", "--config", self.config,
                "--state-dir", str(state_dir), "--arguments", json.dumps(dict(self.arguments))]
        if self.orphan_timeout is not None:
            args += ["--orphan-timeout", str(self.orphan_timeout)]
        return args


def node_state(state: Any, cmlist: list[str], client_id: str) -> NodeState | None:
    """A block's node as Parsl's states need it: its state at the CM, None when it is gone
    (taken, or given back: a node given back after it failed to start stays FAILED),
    NOTREADY while it is being added."""
    for cm in cmlist:
        rec = state.node(cm, client_id)
        if rec is None:
            continue
        found = NodeState.from_cm(rec.state)
        return found if rec.gone_at is None or found is NodeState.FAILED else None
    return NodeState.NOTREADY


class ParslDaemon:
    """See the module docstring. ``server``: a ``ProtoGeniServer``; the other arguments as
    :class:`~elasticslice.parsl.provider.CloudLabProvider`'s (``listen``: the address the
    nodes reach this machine at)."""

    def __init__(self, server: Any, state_dir: Path, *, max_nodes: int,
                 hardware_type: str | None = None, disk_image: str | None = None,
                 image_python: str | None = None, node_python: str | None = None,
                 cores_per_node: int | None = None, margin: float = 5.0,
                 listen: str = "127.0.0.1", public_url: str | None = None,
                 endpoint_port: int = 0, intervals: Mapping[str, float] | None = None,
                 publish_port: int | None = None,
                 orphan_timeout: float = ORPHAN_TIMEOUT) -> None:
        self.server, self.state_dir = server, Path(state_dir).expanduser().resolve()
        self.max_nodes, self.hardware_type, self.disk_image = max_nodes, hardware_type, \
            disk_image
        self.image_python, self.node_python, self.cores_per_node = image_python, \
            node_python, cores_per_node
        self.margin, self.listen, self.public_url = margin, listen, public_url
        self.endpoint_port, self.publish_port = endpoint_port, publish_port
        self.intervals = {**PARSL_INTERVALS, **(intervals or {})}
        self.orphan_timeout = orphan_timeout
        self.book = BlockBook()
        self.failures = NodeFailures()
        self.keys: AuthorisedKeys | None = None
        self.failed: str | None = None
        self.services: Any = None
        self.helper: Any = None
        self.manager: Any = None
        self.remote: RemoteBlocks | None = None
        self._lock: StateDirLock | None = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._closing: bool | None = None
        self._alone = Orphaned(orphan_timeout, "provider")

    # ------------------------------------------------------------------ starting
    def start(self) -> ParslDaemon:
        """The state, the CA, the nodes' services, the helper and the channel; the manager
        starts when the provider told its blocks."""
        from elasticslice.parsl.node import ParslNodeHelper, node_software
        from elasticslice.pilots.ca import ClusterCA
        from elasticslice.pilots.services import ControlServices
        make_state_dir(self.state_dir, "the provider's")
        try:
            self._lock = StateDirLock(self.state_dir / "state").acquire()
            ca = ClusterCA.open(self.state_dir / "pki")
            # the pilots' services and rules: the slice's tarball at a URL kept across
            # restarts, a token only from its node's manifest address, a node's
            # certificates denied once it left (elasticslice.pilots.services)
            services = self.services = ControlServices(
                self.state_dir, ca, self.listen, manager=lambda: self.manager,
                helper=lambda: self.helper, failures=self.failures, on_key=self._on_key,
                publish_port=self.publish_port, public_url=self.public_url).start()
            env_lines = node_software(services, server=self.server,
                                      node_python=self.node_python,
                                      disk_image=self.disk_image,
                                      image_python=self.image_python)
            self.helper = ParslNodeHelper(
                self.book, services.publisher, self.state_dir / "tarballs", env_lines,
                cores=self.cores_per_node, server=self.server, image_urn=self.disk_image,
                nodetype=self.hardware_type, token=services.token, failures=self.failures,
                report_url=services.report_url, ca=ca, enrolment=services.enrolment,
                on_gone=self._on_gone, enrol_url=services.enrol_url)
            self.helper.tarball_url()  # served before any sliver change: fetched again
            self.remote = RemoteBlocks(
                self.state_dir, self.book, address=self.listen, margin=self.margin,
                states_of=self._states_of, on_blocks=self._on_blocks,
                on_close=self._on_close, on_keys=self._on_keys).start()
        except BaseException:
            self.close(give_back=False)
            raise
        threading.Thread(target=self._sync_loop, name="daemon-sync", daemon=True).start()
        return self

    def _start_manager(self) -> None:
        from elasticslice.parsl.manager import ParslSliceManager
        assert self.remote is not None
        manager = ParslSliceManager(
            self.server, book=self.book, wait_empty=self.remote.wait_empty,
            margin=self.margin, minthreshold=0, maxthreshold=self.max_nodes,
            manage_intervals=self.intervals, retry_interval=1.0, nodetype=self.hardware_type,
            enable_delete=True, email=False, helper=self.helper,
            state_dir=self.state_dir / "state",
            endpoint=EndpointConfig(address=self.listen, port=self.endpoint_port))
        try:
            manager.start()
        except BaseException:
            manager.close()
            raise
        self.manager = manager
        log.info("manager started: %d block(s) of Parsl's", len(self.book.blocks))
        manager.resume_releases()   # a daemon killed while a block drained

    # ------------------------------------------------------------------ the provider
    def _on_blocks(self) -> None:
        manager = self.manager
        if manager is None:
            self._wake.set()
        else:
            manager.wake("ensure_sliver", "add_nodes", "delete_nodes")

    def _on_close(self, give_back: bool) -> None:
        self._closing = bool(give_back)
        self._wake.set()

    def _on_keys(self, folder: Path) -> None:
        if self.keys is None or self.keys.cert_dir != folder:
            self.keys = AuthorisedKeys(folder)

    def _on_key(self, client_id: str, public_key: str) -> dict[str, str]:
        """A node enrolled and sends its public key: allowed at the interchange while its
        block wants it (a ValueError: refused, its line goes to the node)."""
        from elasticslice.pilots.enrol import NotYet
        if self.manager is None:   # the provider has not told its blocks (yet, or again)
            raise NotYet("the provider's manager is starting: try again")
        keys = self.keys
        if keys is None:
            raise ValueError("the executor is not encrypted: no key to authorise")
        if not self.book.wanted(client_id):
            raise ValueError(f"{client_id} is in no live Parsl block")
        return keys.authorise(client_id, public_key)

    def _on_gone(self, client_id: str) -> None:
        if self.keys is not None:
            self.keys.withdraw(client_id)

    def _states_of(self, client_ids: list[str]) -> list[str | None]:
        manager = self.manager
        if manager is None:
            return [NodeState.NOTREADY.value] * len(client_ids)
        states = [node_state(manager.state, manager.cmlist, cid) for cid in client_ids]
        return [None if s is None else s.value for s in states]

    # ------------------------------------------------------------------ running
    def _sync_loop(self) -> None:
        while not self._stopped.wait(SYNC_EVERY):
            remote = self.remote
            if remote is None or self.manager is None:
                continue
            try:
                remote.tell()
                remote.tell_failures([{**f.to_json(), "seen_at": f.seen_at}
                                      for f in self.failures.all()])
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("telling the provider")

    def serve(self) -> bool:
        """Run until the provider closes, SIGTERM (:meth:`stop`), or no provider for
        ``orphan_timeout`` seconds; then close. Returns whether the slice was given back."""
        assert self.remote is not None
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stopped.is_set():
                self.close(give_back=False)
                return False
            if self._closing is not None:
                give_back = self._closing
                self.close(give_back=give_back)
                return give_back
            if self.manager is None and self.remote.heard.is_set():
                try:
                    self._start_manager()
                except Exception as err:  # noqa: BLE001 - said to the provider, in one line
                    self._cannot_start(err)
                    return False
            if self._alone.expired(self.remote.attached):
                self.close(give_back=False)
                return False

    def _cannot_start(self, err: Exception) -> None:
        assert self.remote is not None
        self.failed = cannot_start(self.remote.server, err)
        self.close(give_back=False)

    def stop(self) -> None:
        """Stop serving (keeping the nodes), from a signal handler or another thread."""
        self._stopped.set()
        self._wake.set()

    def close(self, *, give_back: bool) -> None:
        """Stop the manager (giving the slice back if ``give_back``: the nodes' keys are
        withdrawn then), the services and the channel (the provider hears ``bye`` last).
        Idempotent."""
        self._stopped.set()
        if self.remote is not None:   # a drain waiting for the provider ends now
            self.remote.cancel_waits()
        manager, self.manager = self.manager, None
        try:
            if manager is not None:
                manager.stop()
                if give_back:
                    manager.actuator.give_back_slivers()
        finally:
            if manager is not None:
                manager.state.close()
            gone = manager is not None and give_back
            helper, self.helper = self.helper, None
            if helper is not None:
                helper.close(remove=gone)
            if self.keys is not None and gone:  # no node of ours is left
                for client_id in self.keys.allowed():
                    self.keys.withdraw(client_id)
            services, self.services = self.services, None
            if services is not None:
                services.close(remove=gone)
            remote, self.remote = self.remote, None
            if remote is not None:
                remote.stop()
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()


# ---------------------------------------------------------------------- the command ----
def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m elasticslice.parsl.daemon",
        description="The manager daemon of a CloudLabProvider: the only process holding the "
                    "CloudLab credentials and the cluster CA's key (the provider starts it).")
    parser.add_argument("--config", required=True, help="the elasticslice config file")
    parser.add_argument("--state-dir", required=True, type=Path,
                        help="the provider's directory")
    parser.add_argument("--arguments", default="{}",
                        help="the daemon's keyword arguments (JSON): " + ", ".join(ARGUMENTS))
    parser.add_argument("--orphan-timeout", type=float, default=ORPHAN_TIMEOUT,
                        help="seconds the nodes are kept with no provider attached")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> ParslDaemon:
    from elasticslice.config import load_config
    from elasticslice.rpc.client import ProtoGeniServer
    try:
        given = json.loads(args.arguments)
    except ValueError as err:
        raise ElasticSliceError(f"--arguments: not JSON: {err}") from None
    if not isinstance(given, dict) or set(given) - set(ARGUMENTS):
        raise ElasticSliceError(f"--arguments: expected an object of {', '.join(ARGUMENTS)}")
    server = ProtoGeniServer(load_config(args.config))
    try:
        return ParslDaemon(server, args.state_dir, orphan_timeout=args.orphan_timeout,
                           **given)
    except TypeError as err:
        server.close()
        raise ElasticSliceError(f"--arguments: {err}") from None


def main(argv: list[str] | None = None) -> int:
    """Start, say ``ready`` on stdout, then serve with the log in ``DIR/daemon.log``."""
    args = _arguments(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        daemon = build(args).start()
    except (ElasticSliceError, OSError) as err:
        print(f"Error: {err}", file=sys.stderr, flush=True)
        return 1
    return serve(daemon, daemon.state_dir / LOG_FILE, name="Parsl's manager daemon")


if __name__ == "__main__":
    sys.exit(main())
