"""``ElasticCluster``: a CloudLab slice whose nodes are Troy pilots, in one object.

    cluster = ElasticCluster(server, Path("~/.es-pilots"), maxthreshold=8)
    cluster.start()                    # CA, Dask scheduler (TLS), Troy session, manager
    troy.execute_workload(cluster.session, workload, cluster.overlay(), bind_mode="late")
    print(cluster.snapshot(), cluster.stats())
    cluster.close()                    # gives the nodes back (keep=True: leaves them)

The scheduler listens on ``tls://<listen>`` only; every node joins it with a certificate
of the cluster's own CA (``<state_dir>/pki``), which it gets by enrolling (its own key, a
single-use token from its tarball: :mod:`elasticslice.pilots.enrol`); the manager's state
lives in ``<state_dir>/state``. A manager that crashed is replaced with :meth:`replace_manager`: the
new one resumes from the same state, and the pilots and the Troy session carry on.

The whole process may die too (SIGKILL): a new ``ElasticCluster`` on the same state dir
(:attr:`ElasticCluster.resumed`) reuses the CA, serves the scheduler on the port that
``<state_dir>/cluster.json`` records (the node agents rejoin it by themselves), reopens the
Troy store and re-dispatches what was in flight (``session.recover()``; the rebuilt
workloads are in ``cluster.session.workloads``), and the manager resumes from its state and
adopts the agents of the nodes it holds. See :mod:`elasticslice.pilots.restart`.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.config import EndpointConfig
from elasticslice.managers.cycle import PILOT_INTERVALS
from elasticslice.managers.parts import PolicyField
from elasticslice.managers.policy import PolicyConfig
from elasticslice.managers.statedir import StateDirLock, make_state_dir
from elasticslice.metrics import MetricsServer, serve_metrics_or_warn, session_units
from elasticslice.pilots.ca import ClusterCA, renew_scheduler
from elasticslice.pilots.failures import NodeFailures
from elasticslice.pilots.helper import PilotElasticSliceHelper, pilots_listen
from elasticslice.pilots.manager import PilotSliceManager
from elasticslice.pilots.restart import ClusterFile, RunCounters, recover_session
from elasticslice.pilots.managerdaemon import apply_bounds, cluster_policy
from elasticslice.pilots.services import (DENY_FILE, ENROL_FILE, TOKENS_FILE, ControlServices,
                                          pilot_helper)
from elasticslice.pilots.snapshot import ClusterSnapshot
from troy.frameworks.dask import DenyList
from troy.states import FINAL_STATES

log = logging.getLogger(__name__)

#: how often each cycle method runs (seconds): the cycle's table (managers/cycle.py)
DEFAULT_INTERVALS = PILOT_INTERVALS
STATS_SAVE_INTERVAL = 2.0  # seconds between two saves of the run's unit counters


class ElasticCluster:
    """The facade: see the module docstring and docs/pilots.md. ``server``: a
    ``ProtoGeniServer``; ``state_dir``: the cluster's files (0700); ``listen``: where the
    scheduler and the nodes' services (:class:`ControlServices`) listen, which the nodes must
    reach (None: ``[pilots] listen`` of the config, else the address routed to the CM);
    ``margin``: seconds kept before a revocation's deadline; ``idle_timeout``: seconds a
    pilot stays idle before its node goes (None: never); ``intervals``: over
    :data:`DEFAULT_INTERVALS`; ``policy``: a :class:`PolicyConfig` (thresholds and
    idle_timeout from the arguments); ``session``: a Troy session (default: its own);
    ``manager_options``/``framework_options``: to the manager and the framework;
    ``node_python``, ``disk_image``, ``image_python``: what nodes run and boot (default:
    ``[pilots]``; without ``node_python`` a node builds the agent's environment from the
    wheelhouse published here, docs/node-software.md); ``public_url``: the base URL the CM
    fetches the slice's tarball from (None: the publisher's); ``cert_lifetime``: of the
    nodes' certificates; ``scheduler_port``, ``enrol_port``, ``publish_port``: fixed ports
    (None: this state dir's last, else any); ``metrics_port``/``metrics_listen``: the
    manager's Prometheus metrics (None: none; :attr:`metrics_url`). Nodes that failed to
    start are in :attr:`failures`."""

    #: the cluster's bounds: its policy's (the one place; :meth:`set_bounds` changes them)
    minthreshold = PolicyField()
    maxthreshold = PolicyField()

    def __init__(self, server: Any, state_dir: Path, *, minthreshold: int = 1,
                 maxthreshold: int = 10, hardware_type: str | None = None,
                 listen: str | None = None, margin: float = 5.0,
                 idle_timeout: float | None = 60.0, intervals: Mapping[str, float] | None = None,
                 endpoint_port: int = 0, node_python: str | None = None,
                 disk_image: str | None = None, public_url: str | None = None,
                 cert_lifetime: float = 3600.0, image_python: str | None = None,
                 policy: PolicyConfig | None = None, node_cores: int | None = None,
                 session: Any = None, keep: bool = False,
                 manager_options: Mapping[str, Any] | None = None,
                 framework_options: Mapping[str, Any] | None = None,
                 metrics_port: int | None = None, metrics_listen: str = "127.0.0.1",
                 scheduler_port: int | None = None, enrol_port: int | None = None,
                 publish_port: int | None = None) -> None:
        self.server = server
        self.state_dir = Path(state_dir).expanduser().resolve()
        self.hardware_type = hardware_type
        # None: [pilots] listen of the server's config, else the address routed to the CM
        self.listen = listen if listen is not None else pilots_listen(server)
        self.margin = margin
        self.intervals = {**DEFAULT_INTERVALS, **(intervals or {})}
        self.endpoint_port = endpoint_port
        self.node_python = node_python  # None: [pilots] of the config, else python3
        self.disk_image = disk_image    # None: [pilots] of the config, else the CM's default
        self.public_url = public_url    # None: the publisher's own base URL
        self.cert_lifetime = cert_lifetime
        self.image_python = image_python  # None: known from the image (bootstrap.image_python)
        self.scheduler_port, self.enrol_port = scheduler_port, enrol_port
        self.publish_port = publish_port
        #: the tarball publisher and the enrolment service (started with the cluster)
        self.services: ControlServices | None = None
        #: the nodes that failed to start, with their cause (the CM's word and the node's)
        self.failures = NodeFailures()
        #: the serials of certificates of nodes that left: refused by the scheduler and
        #: the enrolment service until they expire
        self.denied = DenyList(self.state_dir / self.DENY_FILE)
        # None: idle pilots are never given back (the policy's None means "no idle rule")
        self.policy = cluster_policy(policy, minthreshold, maxthreshold, idle_timeout)
        self.node_cores = node_cores
        self.keep = keep
        self.manager_options = dict(manager_options or {})
        self.framework_options = dict(framework_options or {})
        self.session: Any = session
        self._own_session = session is None
        self.framework: Any = None
        self.manager: PilotSliceManager | None = None
        self.ca: ClusterCA | None = None
        self.helper: PilotElasticSliceHelper | None = None
        #: the state dir held a run already (``cluster.json``): this start resumed it
        self.resumed = False
        #: how many times the cluster came back on this state dir
        self.restarts = 0
        #: Troy's unit counters over the run's processes (stats.json)
        self.counters = RunCounters(self.state_dir, lambda: self.session,
                                    every=STATS_SAVE_INTERVAL)
        self._lock: StateDirLock | None = None
        self.metrics_port, self.metrics_listen = metrics_port, metrics_listen
        self.metrics: MetricsServer | None = None

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        """Make (or reopen) the CA, start the Dask scheduler over TLS and the Troy session,
        then the manager with its callback endpoint. On failure what started is stopped."""
        make_state_dir(self.state_dir)
        try:
            self._start()
        except BaseException:  # what started stops; nodes and units stay for a retry
            self.close(keep=True, resume=True)
            raise
        log.info("elastic cluster up: scheduler %s, state %s", self.framework.scheduler_address,
                 self.state_dir)

    def _start(self) -> None:
        import troy
        self._lock = StateDirLock(self.state_dir / "state").acquire()  # one process each
        previous = ClusterFile.load(self.state_dir)
        self.resumed = previous is not None
        self.restarts = previous.restarts + 1 if previous is not None else 0
        self.counters.open()
        self.ca = ClusterCA.open(self.state_dir / "pki")
        if self.session is None:
            self.session = troy.Session(self.state_dir / "troy.db")
        # prefetch 0: a pilot takes only what it can start now, so the queue waits in Troy
        # for the nodes being added (a backlog on the first pilot would keep them idle) and a
        # doomed pilot holds nothing that has not started
        options = {"adopt_workers": True, "listen": self.listen, "prefetch": 0,
                   **self.framework_options}
        if self.scheduler_port is not None:
            options.setdefault("port", self.scheduler_port)
        if previous is not None:  # the agents rejoin the address they were given
            options.setdefault("port", previous.port)
        try:
            self.framework = self._add_framework(options, previous)
        except Exception as err:
            if previous is None:
                raise
            raise ElasticSliceError(
                f"{self.state_dir}: cannot serve the Dask scheduler on port {options['port']} "
                f"again (the nodes' agents rejoin {previous.scheduler}): {err}") from err
        renew_scheduler(self.framework, self.ca)  # its certificate renewed while it runs
        ClusterFile(self.framework.scheduler_address, os.getpid(), self.restarts).save(
            self.state_dir)
        if self.resumed and self._own_session:
            self._recover()
        self.counters.start()
        # the CM fetches the slice's tarball from it, at the URL the last process served
        services = self.services = ControlServices(
            self.state_dir, self.ca, self.listen, manager=lambda: self.manager,
            helper=lambda: self.helper, failures=self.failures, deny=self.denied,
            cert_lifetime=self.cert_lifetime,
            enrol_port=self.enrol_port, publish_port=self.publish_port,
            public_url=self.public_url).start()
        self.helper = pilot_helper(services, self.ca, self.framework.scheduler_address,
                                   self.state_dir, self.server, node_python=self.node_python,
                                   image_urn=self.disk_image, nodetype=self.hardware_type,
                                   image_python=self.image_python)
        self.manager = self.new_manager()
        self.manager.start()
        # agents that rejoined before the manager existed were refused: they are ours if
        # the manager holds their nodes
        self.framework.adopt_joined()
        if self.metrics_port is not None:
            self._serve_metrics()

    def _serve_metrics(self) -> None:
        """The metrics endpoint; one that cannot listen is a warning, the cluster runs on."""
        self.metrics = serve_metrics_or_warn(lambda: self.manager, units=self._metric_units,
                                             address=self.metrics_listen,
                                             port=self.metrics_port)

    @property
    def metrics_url(self) -> str | None:
        """Where the metrics are served (None: not served)."""
        return self.metrics.url if self.metrics is not None else None

    def _metric_units(self) -> dict[str, int]:
        session = self.session
        if session is None:
            raise ElasticSliceError("the cluster is closed")
        totals = self.counters.totals()
        return {**session_units(session), "requeued": totals["units_requeued"],
                "lost": totals["units_lost"]}

    @property
    def publisher(self) -> Any:
        """The tarball publisher (None: not started)."""
        return self.services.publisher if self.services is not None else None

    @property
    def enrolment(self) -> Any:
        """The enrolment service that issues the nodes' certificates (None: not started)."""
        return self.services.enrolment if self.services is not None else None

    @property
    def wheelroot(self) -> Any:
        """The nodes' software, a wheelhouse per node's Python and machine (None: none)."""
        return self.services.wheelroot if self.services is not None else None

    ENROL_FILE, TOKENS_FILE, DENY_FILE = ENROL_FILE, TOKENS_FILE, DENY_FILE

    def new_manager(self) -> PilotSliceManager:
        """A manager on the cluster's state, helper, framework and session (not started)."""
        if self.framework is None or self.helper is None:
            raise ElasticSliceError("start the cluster first")
        options: dict[str, Any] = dict(
            minthreshold=self.minthreshold, maxthreshold=self.maxthreshold,
            manage_intervals=self.intervals, retry_interval=1.0, nodetype=self.hardware_type,
            enable_delete=True, email=False, helper=self.helper,
            state_dir=self.state_dir / "state", policy=self.policy,
            endpoint=EndpointConfig(address=self.listen, port=self.endpoint_port))
        options.update(self.manager_options)
        return PilotSliceManager(self.server, framework=self.framework, session=self.session,
                                 margin=self.margin, node_cores=self.node_cores,
                                 failures=self.failures, **options)

    def _add_framework(self, options: dict[str, Any], previous: ClusterFile | None) -> Any:
        """The ``dask`` framework; on the port of a cluster that was closed (no agent waits
        there) if it is free, else on any."""
        add = functools.partial(self.session.add_framework, "dask", "cloudlab",
                                tls=dataclasses.replace(self.ca.dask_tls("scheduler"),
                                                        deny_file=str(self.denied.path)),
                                adopt_filter=self._adopt_filter)
        if previous is None or not previous.closed or "port" in self.framework_options:
            return add(**options)
        try:
            return add(**options)
        except Exception as err:  # noqa: BLE001 - any port will do
            log.info("port %s is taken (%s): the scheduler listens on another", options["port"],
                     err)
            return add(**{**options, "port": 0})

    def _recover(self) -> None:
        recover_session(self.session, self.counters, self.state_dir, self.restarts)

    def save_stats(self) -> None:
        """Persist this process' unit counters (also done every few seconds)."""
        self.counters.save()

    def set_bounds(self, minthreshold: int, maxthreshold: int) -> None:
        """Hold from ``minthreshold`` to ``maxthreshold`` nodes from now on: the cluster's
        policy and its running manager's (a manager replaced later keeps them)."""
        apply_bounds(self, minthreshold, maxthreshold)

    def replace_manager(self) -> PilotSliceManager:
        """Start a new manager from the same state (after the old one crashed or was
        stopped); the pilots and the session are untouched."""
        self.manager = self.new_manager()
        self.manager.start()
        self.framework.adopt_joined()
        return self.manager

    def _adopt_filter(self, name: str | None, address: str, resources: Any = None) -> bool:
        manager = self.manager
        return manager is not None and manager.accepts(name, address, resources)

    def overlay(self) -> Any:
        """An overlay following the cluster's framework: its pilots as they come and go."""
        from troy import Overlay
        return Overlay.following(self.framework)

    # ------------------------------------------------------------------ looking
    def pilots(self) -> list[Any]:
        return [p for p in self.framework.list_pilots() if p.state not in FINAL_STATES]

    def snapshot(self) -> ClusterSnapshot:
        """Now, from memory and the local state store (no network call)."""
        return ClusterSnapshot.of(self.manager, self.session, self.pilots())

    def stats(self) -> dict[str, Any]:
        """revocations, early_releases, forced_releases, nodes_peak, node_seconds,
        units_requeued, duplicates, units_lost, restarts: over the whole run on this state
        dir, across restarts (units running when a process died count as requeued)."""
        out: dict[str, Any] = self.manager.stats() if self.manager is not None else {}
        out.update(self.counters.totals())
        out["restarts"] = self.restarts
        return out

    # ------------------------------------------------------------------ stopping
    def close(self, keep: bool | None = None, *, resume: bool = False) -> None:
        """Stop the manager, the framework (and our session); give the slice back unless
        ``keep`` (default: the constructor's). ``resume``: the run stops before its end, to
        be resumed: what was in flight stays unfinished in our session's store (not
        CANCELED). Idempotent; safe after a failed ``start``."""
        keep = self.keep if keep is None else keep
        self.counters.stop()
        metrics, self.metrics = self.metrics, None
        if metrics is not None:
            metrics.stop()
        if self.session is not None:
            try:
                self.save_stats()
            except Exception:  # closing anyway
                log.exception("cannot save the run's counters")
        manager, self.manager = self.manager, None
        try:
            if manager is not None:
                manager.stop()
            # Troy first (its pilots then leave quietly), the nodes after
            framework, self.framework = self.framework, None
            if self._own_session and self.session is not None:
                session, self.session = self.session, None
                session.close(keep_unfinished=resume)
            elif framework is not None:
                framework.close()
            if manager is not None and not keep:
                manager.actuator.give_back_slivers()
                ClusterFile.mark_closed(self.state_dir)
        finally:
            if manager is not None:
                manager.state.close()
            if self.helper is not None:  # the tokens go; the tarball too with the slice
                self.helper.close(remove=manager is not None and not keep)
            services, self.services = self.services, None
            if services is not None:  # with the slice gone, no node is left to enrol
                services.close(remove=manager is not None and not keep)
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()
