"""Prometheus metrics of a manager: what it holds, what CloudLab asked back, how its work goes.

:class:`ManagerMetrics` is a custom ``prometheus_client`` collector: it keeps no counter of
its own, it reads the manager when scraped (its SQLite state, its cycle, the CM call
timings of its server, the Troy session's units). So there is nothing to keep in step, and
the counts the state store keeps (revocations, early and forced releases) survive a
restart. Each manager gets its own ``CollectorRegistry`` (several may live in one process);
:class:`MetricsServer` serves it on ``GET /metrics`` (127.0.0.1 by default), guarded
(:data:`LIMITS`: 64 connections, 5 s for a request, 30 s for an answer).

The names (``elasticslice_`` first; counters end in ``_total``):

* ``nodes_held``, ``nodes_wanted`` (absent while the demand is unknown), ``nodes_booting``
  (held, not ready yet);
* ``notices_total`` (CloudLab's revocations of nodes we hold), ``early_releases_total``,
  ``forced_releases_total``;
* ``units_queued``, ``units_running``, ``units_requeued_total``, ``units_lost_total`` (with
  a Troy session);
* ``cm_nodes_held{cm}``, ``cm_nodes_booting{cm}``, ``cm_notices_total{cm}``,
  ``cm_early_releases_total{cm}``, ``cm_forced_releases_total{cm}``: the same per CM (its
  short name: a box's cluster, else the CM's host), every CM of the manager's;
* ``cycle_last_success_age_seconds{method}`` (absent until the method first succeeds),
  ``cycle_failures_total{method}``;
* ``cm_call_duration_seconds{method}``: a histogram of every ProtoGENI call (the CMs' and
  the SA's, retries included) by XML-RPC method.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (CollectorRegistry, CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from elasticslice.errors import ElasticSliceError
from elasticslice.serving import BufferedRequestHandler, GuardedServer, Limits

log = logging.getLogger(__name__)

PREFIX = "elasticslice_"
PATH = "/metrics"
BOOTING = ("notready", "changing")  # NodeState values of a node held but not ready yet


class MetricsError(ElasticSliceError):
    """The metrics endpoint cannot be served (a bad address or port, a port taken)."""


def session_units(session: Any) -> dict[str, int]:
    """queued, running (now) and requeued, lost (this session's counts) of a Troy session."""
    demand, stats = session.demand(), session.unit_stats()
    return {"queued": demand.units_queued, "running": demand.units_running,
            "requeued": stats.requeued, "lost": stats.lost}


class ManagerMetrics(Collector):
    """What ``manager`` (a manager, or a callable returning the current one or None: a
    cluster replaces its manager) looks like, read at each scrape. ``units``: a callable
    returning ``queued``, ``running``, ``requeued`` and ``lost`` (None: no unit metrics)."""

    def __init__(self, manager: Any, *,
                 units: Callable[[], Mapping[str, int]] | None = None) -> None:
        self._manager = manager if callable(manager) else (lambda: manager)
        self._units = units

    def registry(self) -> CollectorRegistry:
        """A registry of its own holding this collector (never the global default)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def collect(self) -> Iterator[Metric]:
        manager = self._manager()
        if manager is not None:
            for part in (self._nodes, self._notices, self._sites, self._cycle, self._calls):
                try:
                    yield from part(manager)
                except Exception as err:  # a closing manager: the rest still answers
                    log.debug("metrics: %s: %s", part.__name__, err)
        if self._units is not None:
            try:
                yield from self._unit_metrics(self._units())
            except Exception as err:
                log.debug("metrics: units: %s", err)

    @staticmethod
    def _nodes(manager: Any) -> Iterator[Metric]:
        nodes = manager.state.nodes()
        yield GaugeMetricFamily(PREFIX + "nodes_held", "Nodes the slice holds.",
                                value=len(nodes))
        wanted = manager.demand
        if wanted is not None:
            yield GaugeMetricFamily(PREFIX + "nodes_wanted",
                                    "Nodes the demand asks for (within the thresholds).",
                                    value=wanted)
        yield GaugeMetricFamily(PREFIX + "nodes_booting", "Nodes held that are not ready yet.",
                                value=sum(1 for n in nodes if n.state in BOOTING))

    @staticmethod
    def _notices(manager: Any) -> Iterator[Metric]:
        counts = manager.notices.counts()
        for name, key, text in (
                ("notices", "revocations", "CloudLab's revocations (NotifyDeletePending) of "
                                           "nodes held."),
                ("early_releases", "early", "Revoked nodes given back before the deadline."),
                ("forced_releases", "forced", "Revoked nodes CloudLab took at the deadline.")):
            yield CounterMetricFamily(PREFIX + name, text, value=counts[key])

    @staticmethod
    def _sites(manager: Any) -> Iterator[Metric]:
        """The same per CM, labelled by its short name (``utah``, ``www.wisc.cloudlab.us``):
        every CM of the manager's, a CM holding nothing at 0."""
        from elasticslice.managers.sites import cm_name
        urls = list(dict.fromkeys([*manager.cmlist, *(n.cm for n in manager.state.nodes())]))
        families = {key: (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
            PREFIX + "cm_" + key, text, labels=["cm"]) for key, kind, text in (
            ("nodes_held", "gauge", "Nodes the slice holds at each CM."),
            ("nodes_booting", "gauge", "Nodes held at each CM that are not ready yet."),
            ("notices", "counter", "CloudLab's revocations of nodes held, by CM."),
            ("early_releases", "counter", "Revoked nodes given back early, by CM."),
            ("forced_releases", "counter", "Revoked nodes CloudLab took at the deadline, "
                                           "by CM."))}
        nodes, revoked = manager.state.nodes(), manager.state.revocations.counts_by_cm()
        urls += [url for url in revoked if url not in urls]
        for url in urls:
            name, here = cm_name(url), revoked.get(url, {})
            families["nodes_held"].add_metric([name], sum(n.cm == url for n in nodes))
            families["nodes_booting"].add_metric(
                [name], sum(n.cm == url and n.state in BOOTING for n in nodes))
            families["notices"].add_metric([name], here.get("revocations", 0))
            families["early_releases"].add_metric([name], here.get("early", 0))
            families["forced_releases"].add_metric([name], here.get("forced", 0))
        yield from families.values()

    @staticmethod
    def _cycle(manager: Any) -> Iterator[Metric]:
        now = manager.clock()
        stored = manager.state.cycle_log.records()
        age = GaugeMetricFamily(PREFIX + "cycle_last_success_age_seconds",
                                "Seconds since each cycle method last succeeded.",
                                labels=["method"])
        failures = CounterMetricFamily(PREFIX + "cycle_failures",
                                       "Failed runs of each cycle method.", labels=["method"])
        for name, info in manager.cycle.methods.items():
            record = stored.get(name)
            last_ok = info.last_ok if info.last_ok is not None else (
                record.last_ok if record is not None else None)
            if last_ok is not None:
                age.add_metric([name], max(0.0, now - last_ok))
            failures.add_metric([name], info.failures_total)
        yield age
        yield failures

    @staticmethod
    def _calls(manager: Any) -> Iterator[Metric]:
        timings = getattr(manager.server, "call_timings", None)
        family = HistogramMetricFamily(PREFIX + "cm_call_duration_seconds",
                                       "ProtoGENI calls (CMs and SA) by method, retries "
                                       "included.", labels=["method"])
        for method, times in sorted((timings.snapshot() if timings else {}).items()):
            family.add_metric([method], times.cumulative(), sum_value=times.total)
        yield family

    @staticmethod
    def _unit_metrics(units: Mapping[str, int]) -> Iterator[Metric]:
        yield GaugeMetricFamily(PREFIX + "units_queued", "Troy units waiting for a pilot.",
                                value=units["queued"])
        yield GaugeMetricFamily(PREFIX + "units_running", "Troy units running.",
                                value=units["running"])
        yield CounterMetricFamily(PREFIX + "units_requeued",
                                  "Units moved off a pilot to run elsewhere.",
                                  value=units["requeued"])
        yield CounterMetricFamily(PREFIX + "units_lost", "Units lost (never run to an end).",
                                  value=units["lost"])


class _Handler(BufferedRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        if self.path.split("?", 1)[0] != PATH:
            self.send_error(404, f"only {PATH} here")
            return
        body = generate_latest(self.server.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)



#: a scraper sends one GET every few seconds: few connections, no body, two workers
LIMITS = Limits(max_connections=64, handshake_deadline=5.0, request_deadline=5.0,
                response_deadline=30.0, io_timeout=10.0, workers=2, max_body=0)


class _Server(GuardedServer):
    """A guarded listener (:mod:`elasticslice.serving`): a stranger's idle or trickling
    connection never holds a thread, and is one count in a log line a minute."""

    registry: CollectorRegistry

    def __init__(self, address: tuple[str, int], limits: Limits = LIMITS) -> None:
        super().__init__(address, _Handler, limits=limits, name="metrics endpoint")


class MetricsServer:
    """``GET /metrics`` of ``registry`` on ``address``:``port`` (0: any free port), from a
    thread of its own. :meth:`start` raises :class:`MetricsError` (one line) when it cannot
    listen; :meth:`stop` closes the socket."""

    def __init__(self, registry: CollectorRegistry, *, address: str = "127.0.0.1",
                 port: int = 0, limits: Limits = LIMITS) -> None:
        self.registry = registry
        self.address = address
        self.port = port
        self.limits = limits
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 0 <= self.port <= 65535:
            raise MetricsError(f"metrics port {self.port!r}: must be 0 to 65535")
        try:
            server = _Server((self.address, self.port), self.limits)
        except (OSError, OverflowError, UnicodeError) as err:
            why = getattr(err, "strerror", None) or err
            raise MetricsError(f"metrics endpoint {self.address}:{self.port}: cannot listen: "
                               f"{why}") from err
        server.registry = self.registry
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever,
                                        kwargs={"poll_interval": 0.2}, name="metrics",
                                        daemon=True)
        self._thread.start()
        return self

    @property
    def bound_port(self) -> int:
        if self._server is None:
            raise MetricsError("the metrics endpoint is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.bound_port}{PATH}"

    def stop(self) -> None:
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


def serve_metrics(manager: Any, *, units: Callable[[], Mapping[str, int]] | None = None,
                  address: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Serve ``manager``'s metrics (see :class:`ManagerMetrics`); started."""
    registry = ManagerMetrics(manager, units=units).registry()
    return MetricsServer(registry, address=address, port=port).start()


def serve_metrics_or_warn(manager: Any, *, units: Callable[[], Mapping[str, int]] | None,
                          address: str, port: int) -> MetricsServer | None:
    """:func:`serve_metrics`; one that cannot listen is a warning (None), the caller runs
    on without metrics."""
    try:
        server = serve_metrics(manager, units=units, address=address, port=port)
    except MetricsError as err:
        log.warning("%s: no metrics endpoint", err)
        return None
    log.info("metrics at %s", server.url)
    return server
