"""``CloudLabCluster``: a Dask cluster on an elastic CloudLab slice, in Dask's own idiom.

    from dask.distributed import Client
    from elasticslice.dask import CloudLabCluster

    with CloudLabCluster(maximum=4) as cluster, Client(cluster) as client:
        cluster.adapt(minimum=1, maximum=4)
        print(sum(client.gather(client.map(pow, range(64), [2] * 64))))

It owns the workload's half of an elastic cluster
(:class:`~elasticslice.pilots.workload.WorkloadCluster`: Troy and the Dask scheduler, mutual
TLS, its dashboard on 127.0.0.1) and starts its manager daemon, the one process that opens
the CloudLab credentials and the cluster CA's key and that never decodes what a Dask worker
sends (the user's client does, by Dask's design). Every node
the manager holds boots, enrols and joins as one Dask worker with the node's cores as
threads. Dask's own work drives the slice through the manager's policy, never around it:
:meth:`CloudLabCluster.scale` is a fixed demand of n nodes, :meth:`CloudLabCluster.adapt`
feeds the scheduler's adaptive target (``Scheduler.adaptive_target()``, the workers Dask
thinks it needs) as demand next to Troy's, so the policy's cooldowns, hysteresis and
disruption budget decide (no flapping). On NotifyDeletePending the node's worker is retired
by Dask before the notice's deadline (its data moves, its tasks are rescheduled) and the node
goes back early; a node taken without notice is Dask's own recovery (its tasks run again).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from pathlib import Path
from typing import Any

from distributed.core import Status, rpc
from distributed.deploy.cluster import Cluster
from distributed.security import Security

from elasticslice.validate import is_count

log = logging.getLogger(__name__)

#: the Dask dashboard's default address: loopback, any free port (``dashboard_link`` says)
DEFAULT_DASHBOARD = "127.0.0.1:0"
#: where the cluster keeps its files without ``state_dir``
DEFAULT_STATE_DIR = "~/.elasticslice/dask"
#: the adaptive target's default: Dask's own ``distributed.adaptive.target-duration`` is
#: 5 s; nodes take seconds to a minute to boot, so ask for them for work of a few seconds
DEFAULT_TARGET_DURATION = "5s"


#: ElasticCluster options that CloudLabCluster names its own way
_OURS = {"minthreshold": "minimum", "maxthreshold": "maximum", "node_cores": "cores",
         "hardware_type": "hardware_type"}


def _count(name: str, value: Any, least: int) -> int:
    if not is_count(value, least):
        raise ValueError(f"CloudLabCluster: {name}: expected an integer >= {least}, "
                         f"got {value!r}")
    return value


def _memory(value: Any) -> int | None:
    if value is None:
        return None
    from dask.utils import parse_bytes
    try:
        parsed = parse_bytes(value) if isinstance(value, str) else value
    except (ValueError, TypeError):
        parsed = None
    if isinstance(parsed, bool) or not isinstance(parsed, int) or parsed <= 0:
        raise ValueError(f"CloudLabCluster: memory: expected bytes or a size such as "
                         f"'64 GiB', got {value!r}")
    return parsed


def open_server(config: str | os.PathLike[str] | None) -> Any:
    """The ``ProtoGeniServer`` of the client config at ``config`` (None: the usual one,
    ``$ELASTICSLICE_CONFIG`` or ``~/.protogeni/elasticslice.conf``), as ``elasticslice run``
    opens it. A bad config is one :class:`ElasticSliceError` line naming the key and file."""
    from elasticslice.config import load_config
    from elasticslice.rpc.client import ProtoGeniServer
    if config is None:  # as the CLI's --config, whose default is the variable's
        config = os.environ.get("ELASTICSLICE_CONFIG") or None
    return ProtoGeniServer(load_config(config))


class CloudLabCluster(Cluster):
    """A Dask ``Cluster`` whose workers are the nodes of an elastic CloudLab slice.

    What a node is: ``hardware_type`` (the CM's node type; None: any), ``image`` (the disk
    image URN; None: ``[pilots] disk_image`` of the config, else the CM's default),
    ``cores`` (cores a node offers, to plan nodes from cores; None: what the first node
    has), ``memory`` (bytes or ``"64 GiB"``): only recorded (:attr:`memory`): a CloudLab
    request RSpec has no place for memory, a hardware type fixes it.

    Bounds: ``minimum``/``maximum`` nodes (the manager's ``minthreshold``/``maxthreshold``;
    a sliver keeps at least one node). ``config``: the client config file (as
    ``elasticslice -c``); ``state_dir``: the cluster's files (CA, manager state; one process
    at a time); ``listen``: where the scheduler, the enrolment service, the tarball
    publisher and the callback endpoint listen (None: the config's ``[pilots] listen``,
    else loopback when the CM is on this machine, else the address routed to the CM, as
    ``elasticslice run``); ``public_url``: the
    base URL the CM fetches the nodes' tarballs from. ``security``: True (the cluster's own
    CA: :attr:`security` is a ``distributed.Security`` with a ``control`` client certificate,
    so ``Client(cluster)`` works); a ``Security`` of yours is handed to clients as is.
    ``dashboard_address``: the Dask dashboard (default 127.0.0.1, any port; None: none).
    Other keyword arguments go to the manager daemon as
    :class:`~elasticslice.pilots.ElasticCluster` takes them (``margin``, ``idle_timeout``,
    ``intervals``, ``policy``, ``node_python``, ``disk_image``...; values JSON can carry: the
    daemon is another process), ``framework_options`` to Troy's Dask framework.
    """

    def __init__(self, *, config: str | os.PathLike[str] | None = None,
                 state_dir: str | os.PathLike[str] | None = None,
                 hardware_type: str | None = None, image: str | None = None,
                 cores: int | None = None, memory: int | str | None = None,
                 minimum: int = 1, maximum: int = 4, listen: str | None = None,
                 public_url: str | None = None, security: bool | Security = True,
                 dashboard_address: str | None = DEFAULT_DASHBOARD,
                 asynchronous: bool = False, name: str | None = None,
                 quiet: bool = True, **cluster_options: Any) -> None:
        self.minimum = _count("minimum", minimum, 1)
        self.maximum = _count("maximum", maximum, 1)
        if self.minimum > self.maximum:
            raise ValueError(f"CloudLabCluster: minimum {minimum} is more than maximum "
                             f"{maximum}")
        self.cores = None if cores is None else _count("cores", cores, 1)
        self.memory = _memory(memory)
        if image is not None and cluster_options.get("disk_image") not in (None, image):
            raise ValueError("CloudLabCluster: give image or disk_image, not both")
        if security is not True and not isinstance(security, Security):
            raise ValueError(f"CloudLabCluster: security: the scheduler speaks TLS only, with "
                             f"the cluster's own CA: True, or a distributed.Security; got "
                             f"{security!r}")
        for key, ours in _OURS.items():
            if key in cluster_options:
                raise ValueError(f"CloudLabCluster: {key}: give it as {ours} instead")
        self.config = config
        self.state_dir = Path(state_dir if state_dir is not None else DEFAULT_STATE_DIR
                              ).expanduser()
        self.hardware_type = hardware_type
        self.image = image
        self.listen = listen
        self.public_url = public_url
        self.dashboard_address = dashboard_address
        self._user_security = None if security is True else security
        self._cluster_options = dict(cluster_options)
        self.elastic: Any = None       # the WorkloadCluster, once started
        self.security: Security | None = self._user_security
        self._address = ""
        self._source: Any = None       # the manager's demand source: scale's or adapt's
        self._target: dict[str, Any] = {}
        self._recent = _Recent()
        self._last_busy: dict[str, float | None] = {}
        super().__init__(asynchronous=asynchronous, name=name, quiet=quiet)
        if not self.called_from_running_loop:
            self._loop_runner.start()
            self.sync(self._start)

    # ------------------------------------------------------------------ start, close
    def __await__(self) -> Any:
        async def _() -> CloudLabCluster:
            if self.status == Status.created:
                await self._start()
            return self
        return _().__await__()

    def _workload(self) -> Any:
        """The workload's half of the cluster (Troy, the scheduler) and how to start its
        manager daemon, which alone opens the CloudLab credentials and the CA key."""
        import types

        from elasticslice.config import load_config
        from elasticslice.pilots.helper import pilots_listen
        from elasticslice.pilots.daemon import DaemonCommand
        from elasticslice.pilots.workload import WorkloadCluster
        config = self.config
        if config is None:  # as the CLI's --config, whose default is the variable's
            config = os.environ.get("ELASTICSLICE_CONFIG") or None
        client = load_config(config, open_files=False)   # its settings only
        options = dict(self._cluster_options)
        framework = dict(options.pop("framework_options", None) or {})
        if self.dashboard_address is not None:
            framework.setdefault("dashboard_address", self.dashboard_address)
        keep = bool(options.pop("keep", False))
        scheduler_port = options.pop("scheduler_port", None)
        listen = self.listen or pilots_listen(types.SimpleNamespace(config=client))
        options.update(minthreshold=self.minimum, maxthreshold=self.maximum,
                       hardware_type=self.hardware_type, node_cores=self.cores,
                       listen=listen, client_cert=self._user_security is None)
        if self.image is not None:
            options["disk_image"] = self.image
        if self.public_url is not None:
            options["public_url"] = self.public_url
        command = DaemonCommand(str(client.path), arguments=options)
        # a dashboard needs the scheduler in this process
        return WorkloadCluster(command, self.state_dir, listen=listen,
                               scheduler_port=scheduler_port, keep=keep,
                               scheduler_process=self.dashboard_address is None,
                               framework_options=framework)

    def _start_elastic(self) -> None:
        """Blocking (a thread of the loop's): the daemon (it checks the config and the
        slice), then the workload's half."""
        elastic = self._workload()
        elastic.set_demand(activity=self._activity)
        try:
            elastic.start()
        except BaseException:
            self.elastic = None
            raise
        self.elastic = elastic

    async def _start(self) -> None:
        if self.status != Status.created:
            return
        self.status = Status.starting
        for name in ("elasticslice", "troy"):
            logging.getLogger(name).addHandler(self._recent)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._start_elastic)
        except BaseException:
            self.status = Status.failed
            raise
        if self.security is None:
            self.security = self.elastic.client_tls().security()
        self._address = self.elastic.framework.scheduler_address
        self.scheduler_comm = rpc(self.scheduler_address,
                                  connection_args=self.security.get_connection_args("client"))
        self._log(f"CloudLab cluster up: scheduler {self.scheduler_address}, "
                  f"state {self.state_dir}")
        await super()._start()

    def _close_elastic(self) -> None:
        elastic, self.elastic = self.elastic, None
        if elastic is not None:
            elastic.close()

    async def _close(self) -> None:
        if self.status == Status.closed:
            return
        self._set_source(None)
        await super()._close()
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._close_elastic)
        finally:
            for name in ("elasticslice", "troy"):
                logging.getLogger(name).removeHandler(self._recent)

    @property
    def scheduler_address(self) -> str:
        """The scheduler's ``tls://`` address ("" before start)."""
        return self._address

    # ------------------------------------------------------------------ scaling
    @property
    def manager(self) -> Any:
        """The manager daemon's state as this process reads it (a
        :class:`~elasticslice.pilots.snapshot.StateView`: ``state``, ``stats()``; None
        before start). The manager itself runs in the daemon, with the credentials."""
        return self.elastic.view() if self.elastic is not None else None

    def _set_source(self, read: Any, unit: str = "nodes", name: str = "") -> None:
        """Dask's demand in nodes, read every half second and sent to the daemon, whose
        policy decides (a source that raises counts as none that time)."""
        self._source = read
        if self.elastic is not None:
            self.elastic.set_demand(self._demand if read is not None else None,
                                    self._activity)

    def _demand(self) -> float | None:
        read = self._source
        if read is None:
            return None
        try:
            return float(read())
        except Exception:  # noqa: BLE001 - none this time; the next report tries again
            log.exception("Dask's demand (%s)", self._target.get("mode"))
            return None

    def scale(self, n: int | None = None, *, memory: Any = None, cores: Any = None) -> None:
        """Hold ``n`` nodes (a fixed demand of ``n`` nodes; at most ``maximum``, at least
        ``minimum``), instead of adapting. Troy's demand, if any, adds to it."""
        if memory is not None or cores is not None:
            raise ValueError("CloudLabCluster.scale: give a number of nodes (n)")
        count = min(_count("scale n", n, 0), self.maximum)
        self._target = {"mode": "scale", "nodes": count}
        self._set_source(lambda: count, "nodes", f"scale({count})")

    def adapt(self, *, minimum: int | None = None, maximum: int | None = None,
              interval: Any = None, target_duration: Any = DEFAULT_TARGET_DURATION,
              **kwargs: Any) -> None:
        """Follow Dask's own estimate: the scheduler's ``adaptive_target(target_duration)``
        (workers, here nodes) is the demand, next to Troy's, and the manager's policy
        (cooldowns, hysteresis, disruption budget) turns it into nodes; ``minimum`` and
        ``maximum`` bound it (and change the cluster's bounds). ``interval`` is accepted
        for Dask's signature only: the manager reads the target at its ``get_system_state``
        interval (the ``intervals`` option). Dask's ``Adaptive`` is not used: the policy
        decides."""
        if kwargs:
            raise ValueError(f"CloudLabCluster.adapt: unknown argument(s) "
                             f"{', '.join(sorted(kwargs))} (minimum, maximum, interval, "
                             f"target_duration)")
        from dask.utils import parse_timedelta
        low = self.minimum if minimum is None else _count("adapt minimum", minimum, 1)
        high = self.maximum if maximum is None else _count("adapt maximum", maximum, 1)
        if low > high:
            raise ValueError(f"CloudLabCluster.adapt: minimum {low} is more than maximum "
                             f"{high}")
        duration = parse_timedelta(target_duration)
        every = None if interval is None else parse_timedelta(interval)
        self.minimum, self.maximum = low, high
        if self.elastic is not None:   # its policy and its manager's: one change
            self.elastic.set_bounds(low, high)
        if every is not None:  # the manager's pace is set when it starts
            log.info("adapt: interval %s s ignored: the manager reads the target every "
                     "get_system_state interval (the cluster's intervals)", every)
        self._target = {"mode": "adapt", "minimum": low, "maximum": high,
                        "target_duration": duration}
        self._set_source(self.adaptive_target, "nodes", "dask adaptive target")

    def adaptive_target(self) -> int:
        """The workers (nodes) Dask's scheduler wants now for its work to take
        ``target_duration`` (``Scheduler.adaptive_target``), at most ``maximum``."""
        elastic = self.elastic
        if elastic is None or elastic.framework is None:
            return 0
        duration = self._target.get("target_duration")
        wanted = elastic.framework.on_scheduler(
            lambda s: s.adaptive_target(target_duration=duration))
        return min(int(wanted), self.maximum)

    def _activity(self) -> dict[str, float | None]:
        """Node (worker name) -> None while Dask tasks run there, else when the last of
        them was seen running (workers never seen busy are left to Troy's view)."""
        elastic = self.elastic
        if elastic is None or elastic.framework is None:
            return {}
        busy = elastic.framework.on_scheduler(
            lambda s: {str(ws.name): bool(ws.processing) for ws in s.workers.values()})
        now = time.time()
        for name, running in busy.items():
            if running:
                self._last_busy[name] = None
            elif name in self._last_busy and self._last_busy[name] is None:
                self._last_busy[name] = now
        return {name: self._last_busy[name] for name in busy if name in self._last_busy}

    # ------------------------------------------------------------------ looking
    @property
    def dashboard_link(self) -> str:
        """The Dask dashboard's status page ("" without a dashboard). Its host is the
        dashboard's own (loopback by default), not the scheduler's ``listen``."""
        port = self.scheduler_info.get("services", {}).get("dashboard")
        if not port or self.dashboard_address is None:
            return ""
        from distributed.utils import format_dashboard_link
        host = self.dashboard_address.rsplit(":", 1)[0] or "127.0.0.1"
        return format_dashboard_link(host, port)

    def worker_sites(self) -> dict[str, str | None]:
        """Each live worker's address -> its site (its node's cluster, as ``utah``; None:
        not told yet): with several CMs (``cm_urls``), the workers of every site join this
        one scheduler."""
        from troy.states import FINAL_STATES
        framework = self.elastic.framework if self.elastic is not None else None
        return {str(p.native_id): p.description.site
                for p in (framework.list_pilots() if framework is not None else [])
                if p.native_id and p.state not in FINAL_STATES}

    def nodes(self) -> int:
        """Nodes the manager daemon holds now."""
        return self.elastic.nodes() if self.elastic is not None else 0

    async def _get_logs(self, cluster: bool = True, scheduler: bool = True,
                        workers: bool = True) -> Any:
        logs = await super()._get_logs(cluster=cluster, scheduler=scheduler,
                                       workers=workers)
        if cluster:
            from distributed.utils import Log
            logs["Manager"] = Log("\n".join(self._recent.lines))
        return logs

    def __repr__(self) -> str:
        return (f"CloudLabCluster({self.scheduler_address or 'not started'}, "
                f"nodes={self.nodes()}, minimum={self.minimum}, maximum={self.maximum})")


class _Recent(logging.Handler):
    """The last lines the cluster's manager and pilots logged (for ``get_logs``)."""

    def __init__(self, size: int = 2000) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=size)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # noqa: BLE001 - logging must not fail the caller
            self.handleError(record)


__all__ = ["CloudLabCluster", "open_server"]
