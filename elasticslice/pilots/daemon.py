"""The manager daemon: the one process of the control node that holds the user's CloudLab
credentials, the cluster CA's key and the manager's state.

    python -m elasticslice.pilots.daemon --config FILE --state-dir DIR [--settings JSON]

``elasticslice run`` starts it (or attaches to the one already serving ``DIR``); it makes
the CM calls, answers CloudLab's callbacks, enrols the nodes and publishes the slice's
tarball, and decodes nothing a node's agent or a task sends through Dask: the Dask
scheduler and Troy's session live in the workload's process
(:class:`~elasticslice.pilots.workload.WorkloadCluster`), which tells it the demand and
the pilots over the local channel (:mod:`elasticslice.channel`; its end here is
:class:`~elasticslice.pilots.remote.RemoteWorkload`) and hears back which nodes are held,
which failed, and what to drain before a revocation's deadline.

It writes the scheduler's own certificate and key (``scheduler-tls.json`` says where; the
workload's process reloads them when they are renewed), starts the manager once the
workload says where its scheduler serves, and stops when the workload says the run ends
(giving the slice back or keeping it), on SIGTERM (keeping it), or after
``--orphan-timeout`` seconds with no workload attached (keeping it: a run resumed later
starts a new daemon). Its log is ``DIR/daemon.log``. Until it is ready it speaks on
stderr: one ``Error: ...`` line and exit 1 (2: a bad setting) when it cannot start.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.config import EndpointConfig
from elasticslice.managers.cycle import PILOT_INTERVALS
from elasticslice.managers.policy import PolicyConfig
from elasticslice.managers.statedir import StateDirLock
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.failures import NodeFailures
from elasticslice.pilots.remote import RemoteWorkload
from elasticslice.pilots.restart import read_json, write_json
from elasticslice.pilots.services import DENY_FILE, ControlServices

log = logging.getLogger(__name__)

TLS_FILE = "scheduler-tls.json"   # where the scheduler's certificate, key and CA are
LOG_FILE = "daemon.log"
DAEMON_FILE = "daemon.json"       # the serving daemon's pid and arguments
ORPHAN_TIMEOUT = 600.0  # seconds without a workload before the daemon stops (nodes kept)
SYNC_EVERY = 0.5        # seconds between two tellings of the nodes held and failed
RENEW_EVERY = 60.0      # seconds between two checks of the scheduler's certificate


def default_policy(maxthreshold: int) -> PolicyConfig:
    """The cluster's policy when none is given (its thresholds and idle_timeout are set
    from the cluster's arguments): quick cooldowns, up to 4 nodes given back a decision,
    and a CM kept a quarter free when we add (docs/manager-policy.md: "Should the defaults
    change?", from bench/bench_elasticity.py)."""
    return PolicyConfig(add_cooldown=1.0, delete_cooldown=5.0,
                        max_add_per_cycle=max(1, maxthreshold), max_delete_per_cycle=4,
                        percent_available_minimum=0.25)


def cluster_policy(policy: PolicyConfig | None, minthreshold: int, maxthreshold: int,
                   idle_timeout: float | None) -> PolicyConfig:
    """``policy`` (None: :func:`default_policy`) with the cluster's bounds and idle rule
    (None: idle pilots are never given back)."""
    return dataclasses.replace(
        policy or default_policy(maxthreshold),
        idle_timeout=math.inf if idle_timeout is None else idle_timeout,
        minthreshold=minthreshold, maxthreshold=maxthreshold)


class ManagerDaemon:
    """See the module docstring. ``server``: a ``ProtoGeniServer``; the other arguments as
    :class:`~elasticslice.pilots.ElasticCluster`'s (``scheduler_port`` is the workload's
    and is ignored here)."""

    def __init__(self, server: Any, state_dir: Path, *, minthreshold: int = 1,
                 maxthreshold: int = 10, hardware_type: str | None = None,
                 listen: str = "127.0.0.1", margin: float = 5.0,
                 idle_timeout: float | None = 60.0,
                 intervals: Mapping[str, float] | None = None, endpoint_port: int = 0,
                 node_python: str | None = None, disk_image: str | None = None,
                 public_url: str | None = None, cert_lifetime: float = 3600.0,
                 image_python: str | None = None, policy: PolicyConfig | None = None,
                 node_cores: int | None = None,
                 manager_options: Mapping[str, Any] | None = None,
                 metrics_port: int | None = None, metrics_listen: str = "127.0.0.1",
                 scheduler_port: int | None = None, enrol_port: int | None = None,
                 publish_port: int | None = None,
                 orphan_timeout: float = ORPHAN_TIMEOUT) -> None:
        self.server = server
        self.state_dir = Path(state_dir).expanduser().resolve()
        self.hardware_type, self.listen, self.margin = hardware_type, listen, margin
        self.intervals = {**PILOT_INTERVALS, **(intervals or {})}
        self.endpoint_port, self.node_python, self.disk_image = \
            endpoint_port, node_python, disk_image
        self.public_url, self.cert_lifetime, self.image_python = \
            public_url, cert_lifetime, image_python
        self.policy = cluster_policy(policy, minthreshold, maxthreshold, idle_timeout)
        self.node_cores = node_cores
        self.manager_options = dict(manager_options or {})
        self.metrics_port, self.metrics_listen = metrics_port, metrics_listen
        self.enrol_port, self.publish_port = enrol_port, publish_port
        self.orphan_timeout = orphan_timeout
        self.failures = NodeFailures()
        self.ca: ClusterCA | None = None
        self.services: ControlServices | None = None
        self.remote: RemoteWorkload | None = None
        self.helper: Any = None
        self.manager: Any = None
        self.metrics: Any = None
        self.scheduler_address: str | None = None
        self._lock: StateDirLock | None = None
        self._wake = threading.Event()
        self._closing: bool | None = None   # the workload asked to close: give back?
        self._stopped = threading.Event()
        self._alone_since: float | None = time.monotonic()
        self._renewed = 0.0

    # ------------------------------------------------------------------ starting
    def start(self) -> ManagerDaemon:
        """The state, the CA, the scheduler's certificate, the nodes' services and the
        channel; the manager starts when the workload says where its scheduler is."""
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise ElasticSliceError(f"{self.state_dir}: cannot use it as the cluster's "
                                    f"state directory: {err.strerror or err}") from err
        try:
            self._lock = StateDirLock(self.state_dir / "state").acquire()
            self.ca = ClusterCA.open(self.state_dir / "pki")
            (self.state_dir / "metrics.json").unlink(missing_ok=True)   # a dead daemon's
            self._write_tls()
            self.services = ControlServices(
                self.state_dir, self.ca, self.listen, manager=lambda: self.manager,
                helper=lambda: self.helper, failures=self.failures,
                cert_lifetime=self.cert_lifetime, enrol_port=self.enrol_port,
                publish_port=self.publish_port, public_url=self.public_url).start()
            self.remote = RemoteWorkload(self.state_dir, held=self._held,
                                         on_change=self._changed,
                                         on_scheduler=self._on_scheduler,
                                         on_close=self._on_close,
                                         on_bounds=self.set_bounds).start()
        except BaseException:
            self.close(give_back=False)
            raise
        threading.Thread(target=self._sync_loop, name="daemon-sync", daemon=True).start()
        return self

    def _write_tls(self) -> None:
        """The scheduler's certificate (issued again when due) and where it is."""
        assert self.ca is not None
        tls, client = self.ca.dask_tls("scheduler"), self.ca.dask_tls("client")
        write_json(self.state_dir / TLS_FILE, {
            "ca_file": tls.ca_file, "cert_file": tls.cert_file, "key_file": tls.key_file,
            "deny_file": str(self.state_dir / DENY_FILE),
            "client_cert_file": client.cert_file, "client_key_file": client.key_file})
        self._renewed = time.monotonic()

    def _on_scheduler(self, address: str) -> None:
        if address != self.scheduler_address:
            self.scheduler_address = address
            self._wake.set()

    def _on_close(self, give_back: bool) -> None:
        self._closing = bool(give_back)
        self._wake.set()

    def set_bounds(self, minthreshold: int, maxthreshold: int) -> None:
        """Hold from ``minthreshold`` to ``maxthreshold`` nodes from now on (the workload's
        ``adapt(minimum=, maximum=)``): the policy's and the running manager's."""
        if not 0 <= minthreshold <= maxthreshold:
            log.warning("bounds %d..%d ignored: need 0 <= minimum <= maximum", minthreshold,
                        maxthreshold)
            return
        self.policy = dataclasses.replace(self.policy, minthreshold=minthreshold,
                                          maxthreshold=maxthreshold)
        manager = self.manager
        if manager is not None:
            manager.policy = dataclasses.replace(manager.policy, minthreshold=minthreshold,
                                                 maxthreshold=maxthreshold)
            manager.wake("add_nodes", "delete_nodes")
        log.info("bounds now %d to %d node(s)", minthreshold, maxthreshold)

    def _changed(self) -> None:
        manager = self.manager
        if manager is not None:
            manager.wake("get_system_state")

    def _start_manager(self, address: str) -> None:
        """The helper (what a node is: its tarball tells its agent where to join) and the
        manager, resumed from the state."""
        from elasticslice.pilots.helper import PilotElasticSliceHelper
        from elasticslice.pilots.manager import PilotSliceManager
        services = self.services
        assert services is not None and self.ca is not None and self.remote is not None
        if self.helper is not None:   # the scheduler moved: the nodes to come join there
            log.warning("the workload's scheduler is now %s: new nodes join it there", address)
            self.helper.close(remove=False)
        helper = PilotElasticSliceHelper(
            self.ca, address, self.state_dir / "tarballs",
            publisher=services.publisher, enrolment=services.enrolment, token=services.token,
            report_url=services.report_url, enrol_url=services.enrol_url, server=self.server,
            node_python=self.node_python, image_urn=self.disk_image,
            nodetype=self.hardware_type)
        helper.forget_all()   # no token a killed process put in the tarball stays in it
        if not helper.has_environment:
            urls = list(getattr(getattr(self.server, "config", None), "cm_urls", None) or [])
            helper.env_lines = services.node_software(
                image_urn=helper.image_urn, image_python=self.image_python, cm_urls=urls)
        helper.tarball_url()   # served before any sliver change: the CM fetches it again
        self.helper = helper
        if self.manager is not None:
            return
        options: dict[str, Any] = dict(
            minthreshold=self.policy.minthreshold, maxthreshold=self.policy.maxthreshold,
            manage_intervals=self.intervals, retry_interval=1.0, nodetype=self.hardware_type,
            enable_delete=True, email=False, helper=helper,
            state_dir=self.state_dir / "state", policy=self.policy,
            endpoint=EndpointConfig(address=self.listen, port=self.endpoint_port))
        options.update(self.manager_options)
        manager = PilotSliceManager(self.server, framework=self.remote, session=self.remote,
                                    margin=self.margin, node_cores=self.node_cores,
                                    failures=self.failures, **options)
        remote = self.remote
        manager.watch.blind = lambda: not remote.attached
        manager.add_demand_source(lambda: remote.extra_nodes, unit="nodes",
                                  name="the workload's")
        manager.start()
        self.manager = manager
        if self.metrics_port is not None:
            self._serve_metrics()
        log.info("manager started: the nodes' agents join %s", address)

    def _serve_metrics(self) -> None:
        from elasticslice.metrics import MetricsError, serve_metrics
        try:
            self.metrics = serve_metrics(lambda: self.manager, units=self._metric_units,
                                         address=self.metrics_listen, port=self.metrics_port)
        except MetricsError as err:
            log.warning("%s: no metrics endpoint", err)
            return
        write_json(self.state_dir / "metrics.json", {"url": self.metrics.url})
        log.info("metrics at %s", self.metrics.url)

    def _metric_units(self) -> dict[str, int]:
        assert self.remote is not None
        demand = self.remote.demand()
        ledger = read_json(self.state_dir / "stats.json") or {}
        totals = {key: sum(int((ledger.get(part) or {}).get(key, 0) or 0)
                           for part in ("previous", "current"))
                  for key in ("units_requeued", "units_lost")}
        return {"queued": demand.units_queued, "running": demand.units_running,
                "requeued": totals["units_requeued"], "lost": totals["units_lost"]}

    # ------------------------------------------------------------------ running
    def _held(self) -> list[tuple[str, str | None]]:
        """The nodes held (and being added), with their control address."""
        manager = self.manager
        if manager is not None:
            return held_nodes(manager.state)
        # before the manager runs (a daemon started again): what the state says, so that
        # the agents rejoining a resumed run are adopted at once
        from elasticslice.managers.records import StateError
        from elasticslice.managers.state import ManagerState
        try:
            state = ManagerState.read_only(self.state_dir / "state")
        except StateError:
            return []
        try:
            return held_nodes(state)
        finally:
            state.close()

    def _sync_loop(self) -> None:
        while not self._stopped.wait(SYNC_EVERY):
            remote = self.remote
            if remote is None:
                continue
            try:
                remote.tell_nodes()
                remote.tell_failures([{**f.to_json(), "seen_at": f.seen_at}
                                      for f in self.failures.all()])
                if time.monotonic() - self._renewed >= RENEW_EVERY:
                    self._write_tls()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("telling the workload side")

    def serve(self) -> bool:
        """Run until the workload says the run ends, SIGTERM (:meth:`stop`), or no
        workload for ``orphan_timeout`` seconds; then close. Returns whether the slice was
        given back."""
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
            address = self.scheduler_address
            if address is not None and (self.helper is None
                                        or self.helper.scheduler != address):
                self._start_manager(address)
            if self.remote.attached:
                self._alone_since = None
            elif self._alone_since is None:
                self._alone_since = time.monotonic()
                log.warning("no workload attached: the nodes are kept %g s for one to come "
                            "back", self.orphan_timeout)
            elif time.monotonic() - self._alone_since > self.orphan_timeout:
                log.warning("no workload attached for %g s: stopping, the nodes kept (the "
                            "same run resumes on them)", self.orphan_timeout)
                self.close(give_back=False)
                return False

    def stop(self) -> None:
        """Stop serving (keeping the nodes), from a signal handler or another thread."""
        self._stopped.set()
        self._wake.set()

    def close(self, *, give_back: bool) -> None:
        """Stop the manager (giving the slice back if ``give_back``), the services and the
        channel (the workload hears ``bye`` last, once it is all done). Idempotent."""
        self._stopped.set()
        manager, self.manager = self.manager, None
        try:
            if self.metrics is not None:
                self.metrics.stop()
                self.metrics = None
            if manager is not None:
                manager.stop()
                if give_back:
                    manager.actuator.give_back_slivers()
        finally:
            if manager is not None:
                manager.state.close()
            helper, self.helper = self.helper, None
            if helper is not None:
                helper.close(remove=manager is not None and give_back)
            services, self.services = self.services, None
            if services is not None:
                services.close(remove=manager is not None and give_back)
            remote, self.remote = self.remote, None
            if remote is not None:
                remote.stop()
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()


def held_nodes(state: Any) -> list[tuple[str, str | None]]:
    """The nodes ``state`` holds (and those being added), with their control address."""
    held = {r.client_id: r.ipv4 for r in state.nodes() if r.gone_at is None}
    for intent in state.open_intents():
        if intent.kind == "add":
            for client_id in intent.client_ids:
                held.setdefault(client_id, None)
    return sorted(held.items())


# ---------------------------------------------------------------------- the command ----
def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m elasticslice.pilots.daemon",
        description="The manager daemon of an elastic cluster: the only process holding the "
                    "CloudLab credentials and the cluster CA's key (started by `elasticslice "
                    "run`).")
    parser.add_argument("--config", default=None, help="the elasticslice config file")
    parser.add_argument("--state-dir", required=True, type=Path, help="the run's directory")
    parser.add_argument("--settings", default="{}",
                        help="the run's settings, as `elasticslice run` was given them (JSON)")
    parser.add_argument("--arguments", default=None,
                        help="instead of --settings: the ManagerDaemon's keyword arguments "
                             "(JSON; 'policy' an object of PolicyConfig's fields), as "
                             "CloudLabCluster passes them")
    parser.add_argument("--max-nodes", type=int, default=None)
    parser.add_argument("--min-nodes", type=int, default=None)
    parser.add_argument("--adopt", action="store_true")
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    parser.add_argument("--orphan-timeout", type=float, default=ORPHAN_TIMEOUT)
    parser.add_argument("--debug", action="store_true")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> ManagerDaemon:
    """The daemon of a run: its config's server, its settings resolved as `run` does, and
    the slice checked (``preflight``); :class:`ElasticSliceError` or ``BadUsage``."""
    from elasticslice.commands.run import resolve_settings
    from elasticslice.config import load_config
    from elasticslice.managers.ownership import preflight
    from elasticslice.rpc.client import ProtoGeniServer
    try:
        settings = json.loads(args.settings)
        given = json.loads(args.arguments) if args.arguments is not None else None
    except ValueError as err:
        raise ElasticSliceError(f"--settings/--arguments: not JSON: {err}") from None
    client = load_config(args.config)
    if given is None:
        chosen = resolve_settings(client, settings, args.max_nodes)
        arguments = chosen.cluster_arguments()
        if args.min_nodes is not None:
            arguments["minthreshold"] = min(args.min_nodes, arguments["maxthreshold"])
    else:
        arguments = _arguments_of(given)
    arguments.setdefault("manager_options", {})["adopt"] = args.adopt
    state_dir = args.state_dir.expanduser().resolve()
    server = ProtoGeniServer(client)
    try:
        preflight(server, state_dir / "state", adopt=args.adopt,
                  connect_timeout=args.connect_timeout)
        return ManagerDaemon(server, state_dir, orphan_timeout=args.orphan_timeout,
                             **arguments)
    except TypeError as err:   # an argument it does not take
        server.close()
        raise ElasticSliceError(f"--arguments: {err}") from None
    except BaseException:
        server.close()
        raise


def _arguments_of(given: Any) -> dict[str, Any]:
    """``--arguments`` as ManagerDaemon's keyword arguments (its policy a PolicyConfig)."""
    if not isinstance(given, dict):
        raise ElasticSliceError("--arguments: expected a JSON object")
    arguments = dict(given)
    policy = arguments.get("policy")
    if policy is not None:
        if not isinstance(policy, dict):
            raise ElasticSliceError("--arguments: policy: expected an object")
        try:
            arguments["policy"] = PolicyConfig(**policy)
        except (TypeError, ValueError) as err:
            raise ElasticSliceError(f"--arguments: policy: {err}") from None
    return arguments


def _log_to(path: Path, debug: bool) -> None:
    """From now on: the log in ``path``, stdout and stderr too (nobody reads the pipe)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Start, say ``ready`` on stdout, then serve with the log in ``DIR/daemon.log``."""
    from elasticslice.commands.run import BadUsage
    args = _arguments(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        daemon = build(args).start()
    except BadUsage as err:
        print(f"Error: {err}", file=sys.stderr, flush=True)
        return 2
    except (ElasticSliceError, OSError) as err:
        print(f"Error: {err}", file=sys.stderr, flush=True)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the workload tells it when to stop
    write_json(daemon.state_dir / DAEMON_FILE,
               {"pid": os.getpid(), "argv": sys.argv[1:] if argv is None else list(argv)})
    print("ready", flush=True)
    _log_to(daemon.state_dir / LOG_FILE, args.debug)
    log.info("manager daemon %d serving %s", os.getpid(), daemon.state_dir)
    try:
        daemon.serve()
    finally:
        daemon.server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
