"""The manager daemon's work: :class:`ManagerDaemon`, the one process of the control node
that holds the user's CloudLab credentials, the cluster CA's key and the manager's state
(started as ``python -m elasticslice.pilots.daemon``: :mod:`elasticslice.pilots.daemon`).

It makes the CM calls, answers CloudLab's callbacks, enrols the nodes and publishes the
slice's tarball, and decodes nothing a node's agent or a task sends through Dask: the Dask
scheduler and Troy's session live in the workload's processes
(:class:`~elasticslice.pilots.workload.WorkloadCluster`), which tell it the demand and the
pilots over the local channel (:mod:`elasticslice.channel`; its end here is
:class:`~elasticslice.pilots.remote.RemoteWorkload`) and hear back which nodes are held,
which failed, and what to drain before a revocation's deadline.

It writes the scheduler's own certificate and key, and a Dask client's (``scheduler-tls.json``
says where; the workload's process reloads them when they are renewed), starts the manager
once the workload says where its scheduler serves, and stops when the workload says the run
ends (giving the slice back or keeping it), on SIGTERM (keeping it), or after
``orphan_timeout`` seconds with no workload attached (keeping it: a run resumed later starts
a new daemon).
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import math
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.config import EndpointConfig
from elasticslice.managers.cycle import PILOT_INTERVALS
from elasticslice.managers.policy import PolicyConfig
from elasticslice.managers.statedir import StateDirLock, make_state_dir
from elasticslice.pilots.ca import ClusterCA
from elasticslice.pilots.daemonkit import Orphaned, cannot_start
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
ADDRESS_WAIT = 60.0     # seconds the manager waits for its listen address to be there


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


def check_bounds(minthreshold: int, maxthreshold: int) -> None:
    """:class:`ElasticSliceError` unless ``0 <= minthreshold <= maxthreshold``."""
    if not 0 <= minthreshold <= maxthreshold:
        raise ElasticSliceError(f"need 0 <= minthreshold ({minthreshold}) <= "
                                f"maxthreshold ({maxthreshold})")


def apply_bounds(owner: Any, minthreshold: int, maxthreshold: int) -> None:
    """Hold from ``minthreshold`` to ``maxthreshold`` nodes from now on: ``owner``'s
    ``policy`` (what a manager started later takes) and its running ``manager``'s, which
    decides again at once."""
    check_bounds(minthreshold, maxthreshold)
    owner.policy = dataclasses.replace(owner.policy, minthreshold=minthreshold,
                                       maxthreshold=maxthreshold)
    manager = owner.manager
    if manager is not None:
        manager.policy = dataclasses.replace(manager.policy, minthreshold=minthreshold,
                                             maxthreshold=maxthreshold)
        manager.wake("add_nodes", "delete_nodes")


class ManagerDaemon:
    """See the module docstring. ``server``: a ``ProtoGeniServer``; the other arguments as
    :class:`~elasticslice.pilots.ElasticCluster`'s (``scheduler_port`` is the workload's
    and is ignored here); ``client_cert``: issue a Dask client's certificate too (a Dask
    user's ``Client(cluster)``)."""

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
                 orphan_timeout: float = ORPHAN_TIMEOUT, client_cert: bool = False) -> None:
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
        self.client_cert = client_cert   # issue a Dask client's certificate too
        self.failed: str | None = None     # why the manager could not start
        self._unavailable_since: float | None = None   # its address was not there
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
        self._alone = Orphaned(orphan_timeout, "workload")
        self._renewed = 0.0

    # ------------------------------------------------------------------ starting
    def start(self) -> ManagerDaemon:
        """The state, the CA, the scheduler's certificate, the nodes' services and the
        channel; the manager starts when the workload says where its scheduler is."""
        make_state_dir(self.state_dir)
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
        tls = self.ca.dask_tls("scheduler")
        files = {"ca_file": tls.ca_file, "cert_file": tls.cert_file, "key_file": tls.key_file,
                 "deny_file": str(self.state_dir / DENY_FILE)}
        if self.client_cert:   # a Dask user's client (CloudLabCluster) has its own
            client = self.ca.dask_tls("client")
            files.update(client_cert_file=client.cert_file, client_key_file=client.key_file)
        write_json(self.state_dir / TLS_FILE, files)
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
        try:
            apply_bounds(self, minthreshold, maxthreshold)
        except ElasticSliceError as err:
            log.warning("bounds ignored: %s", err)
            return
        log.info("bounds now %d to %d node(s)", minthreshold, maxthreshold)

    def _changed(self) -> None:
        manager = self.manager
        if manager is not None:
            manager.wake("get_system_state")

    def _start_manager(self, address: str) -> None:
        """The helper (what a node is: its tarball tells its agent where to join) and the
        manager, resumed from the state."""
        from elasticslice.pilots.manager import PilotSliceManager
        from elasticslice.pilots.services import pilot_helper
        services = self.services
        assert services is not None and self.ca is not None and self.remote is not None
        if self.helper is not None:   # the scheduler moved: the nodes to come join there
            log.warning("the workload's scheduler is now %s: new nodes join it there", address)
            self.helper.close(remove=False)
        helper = pilot_helper(services, self.ca, address, self.state_dir, self.server,
                              node_python=self.node_python, image_urn=self.disk_image,
                              nodetype=self.hardware_type, image_python=self.image_python)
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
        try:
            manager.start()
        except BaseException:   # what started stops: a later try starts it whole
            manager.close()
            raise
        self.manager = manager
        manager.resume_releases()   # a daemon killed while a node drained
        if self.metrics_port is not None:
            self._serve_metrics()
        log.info("manager started: the nodes' agents join %s", address)

    def _serve_metrics(self) -> None:
        from elasticslice.metrics import serve_metrics_or_warn
        self.metrics = serve_metrics_or_warn(lambda: self.manager, units=self._metric_units,
                                             address=self.metrics_listen,
                                             port=self.metrics_port)
        if self.metrics is not None:   # where the workload's process finds it
            write_json(self.state_dir / "metrics.json", {"url": self.metrics.url})

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
    def _held(self) -> list[tuple[str, str | None, str | None]]:
        """The nodes held (and being added), with their control address and site."""
        from elasticslice.config import site_names
        manager = self.manager
        sites = site_names(getattr(getattr(self.server, "config", None), "cm_urls", ()))
        if manager is not None:
            return held_nodes(manager.state, sites)
        # before the manager runs (a daemon started again): what the state says, so that
        # the agents rejoining a resumed run are adopted at once
        from elasticslice.managers.records import StateError
        from elasticslice.managers.state import ManagerState
        try:
            state = ManagerState.read_only(self.state_dir / "state")
        except StateError:
            return []
        try:
            return held_nodes(state, sites)
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
                try:
                    self._start_manager(address)
                except Exception as err:  # noqa: BLE001 - said to the workload, in one line
                    if self._may_come(err):
                        continue
                    self._cannot_start(err)
                    return False
            if self._alone.expired(self.remote.attached):
                self.close(give_back=False)
                return False

    def _may_come(self, err: Exception) -> bool:
        """Whether the manager may start if tried again soon: the address it listens on is
        not this machine's yet (a box restarting, an interface coming up), for at most
        :data:`ADDRESS_WAIT` seconds. Tried again in two seconds."""
        cause: BaseException | None = err
        while cause is not None and not (isinstance(cause, OSError)
                                         and cause.errno == errno.EADDRNOTAVAIL):
            cause = cause.__cause__ or cause.__context__
        now = time.monotonic()
        if cause is None or now - (self._unavailable_since or now) > ADDRESS_WAIT:
            return False
        if self._unavailable_since is None:
            self._unavailable_since = now
            log.warning("the manager cannot start yet (%s): trying again for %g s", err,
                        ADDRESS_WAIT)
        if self.helper is not None:   # built before the error: built again next time
            self.helper.close(remove=False)
            self.helper = None
        self._stopped.wait(2.0)
        self._wake.set()
        return True

    def _cannot_start(self, err: Exception) -> None:
        """The manager cannot start (its state, its endpoint's port...): the workload is
        told in one line (it stops: another daemon would fail the same way), the nodes
        are kept."""
        assert self.remote is not None
        self.failed = cannot_start(self.remote.server, err)
        self.close(give_back=False)

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


def held_nodes(state: Any, sites: dict[str, str] | None = None
               ) -> list[tuple[str, str | None, str | None]]:
    """The nodes ``state`` holds (and those being added), with their control address and
    site (``sites``: CM url -> site, :func:`~elasticslice.config.site_names`)."""
    sites = sites or {}
    held = {r.client_id: (r.ipv4, sites.get(r.cm)) for r in state.nodes() if r.gone_at is None}
    for intent in state.open_intents():
        if intent.kind == "add":
            for client_id in intent.client_ids:
                held.setdefault(client_id, (None, sites.get(intent.cm)))
    return [(cid, address, site) for cid, (address, site) in sorted(held.items())]
