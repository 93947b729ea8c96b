"""The workload's half of an elastic cluster split by trust: :class:`WorkloadCluster`.

``elasticslice run`` runs its workflow here: Troy's session and the Dask scheduler the
nodes' agents join (over TLS, with the scheduler's own certificate), in the user's process.
What holds the CloudLab credentials and the cluster CA's key is another process, the
manager daemon (:mod:`elasticslice.pilots.daemon`), which this one starts, or attaches to
when one already serves the state directory, and stops on :meth:`WorkloadCluster.close`.
The two speak over the local channel (:mod:`elasticslice.channel`,
:class:`~elasticslice.pilots.link.WorkloadLink` at this end): demand and pilots out, the
nodes held and failed, drains and CloudLab's values in. Nothing of a node's is decoded in
the daemon, and nothing of the CloudLab account is opened here: the config file is read
for its settings only, never its certificate or passphrase.

A daemon that dies (even of SIGKILL) is started again by the link and resumes from its
state; this process dying leaves the daemon keeping the nodes for ``orphan_timeout``
seconds, and the same command resumes on them. Its figures (nodes, revocations) are read
from the daemon's state, read-only.
"""
from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elasticslice.channel import ChannelError, daemon_answers
from elasticslice.errors import ElasticSliceError
from elasticslice.pilots.daemonkit import lock_pid, open_view
from elasticslice.pilots.daemon import (DAEMON_FILE, LOG_FILE, TLS_FILE, DaemonCommand,
                                        spawn_daemon)
from elasticslice.pilots.failures import NodeFailures
from elasticslice.pilots.managerdaemon import check_bounds
from elasticslice.pilots.link import WorkloadLink
from elasticslice.pilots.restart import ClusterFile, RunCounters, read_json, recover_session
from elasticslice.pilots.snapshot import ClusterSnapshot, StateView
from troy.frameworks.dask import DaskTLS
from troy.states import FINAL_STATES

log = logging.getLogger(__name__)

STATS_SAVE_INTERVAL = 2.0   # seconds between two saves of the run's unit counters
CLOSE_TIMEOUT = 300.0       # seconds the daemon has to give the slice back
RELOAD_EVERY = 5.0          # seconds between two looks at the scheduler's certificate


class WorkloadCluster:
    """The workload's half (see the module docstring): what ``elasticslice run`` needs of
    an elastic cluster. ``command``: how to start the daemon; ``listen``/``scheduler_port``:
    where the scheduler serves the nodes' agents; ``framework_options``: to Troy's ``dask``
    framework; ``keep``: :meth:`close` leaves the nodes held by default."""

    def __init__(self, command: DaemonCommand, state_dir: Path, *, listen: str,
                 scheduler_port: int | None = None, keep: bool = False,
                 metrics: bool = False, scheduler_process: bool = True,
                 framework_options: Mapping[str, Any] | None = None) -> None:
        self.command = command
        self.state_dir = Path(state_dir).expanduser().resolve()
        self.listen, self.scheduler_port, self.keep = listen, scheduler_port, keep
        self.metrics = metrics   # the daemon serves metrics: start waits for their URL
        #: the Dask scheduler in a process of its own (False: in this one, as a dashboard
        #: needs it)
        self.scheduler_process = scheduler_process
        self.framework_options = dict(framework_options or {})
        self.failures = NodeFailures()
        self.session: Any = None
        self.framework: Any = None
        self.link: WorkloadLink | None = None
        self.daemon: subprocess.Popen | None = None   # the daemon this process started
        self.resumed = False
        self.restarts = 0
        self.counters = RunCounters(self.state_dir, lambda: self.session,
                                    every=STATS_SAVE_INTERVAL)
        self._view: StateView | None = None
        self._bounds: tuple[int, int] | None = None
        self._extra_nodes: Any = None
        self._activity: Any = None
        self._stop = threading.Event()
        self._adopt = threading.Event()
        self._daemon_lock = threading.Lock()

    @classmethod
    def from_config(cls, config: str | os.PathLike[str], state_dir: Path, *,
                    max_nodes: int | None = None, keep: bool = False,
                    **settings: Any) -> WorkloadCluster:
        """As ``elasticslice -c CONFIG run --state-dir STATE_DIR`` makes it: ``settings``
        are the run's options by their Python names (``listen``, ``margin``,
        ``idle_timeout``, ``node_cores``...: :data:`elasticslice.runsettings.SETTINGS`), over
        the config file's ``[pilots]``/``[manager]``/``[endpoint]``. The config is read for
        its settings only (the daemon opens the credentials); a bad setting is a
        :class:`~elasticslice.runsettings.SettingsError`."""
        from elasticslice.config import load_config
        from elasticslice.runsettings import resolve_settings
        given = {name: None if value is None else str(value)
                 for name, value in settings.items()}
        client = load_config(config, open_files=False)
        chosen = resolve_settings(client, given, max_nodes)
        command = DaemonCommand(str(client.path), given, max_nodes=max_nodes)
        return cls(command, state_dir, listen=chosen.listen,
                   scheduler_port=chosen.scheduler_port, keep=keep,
                   metrics=chosen.metrics_port is not None)

    # ------------------------------------------------------------------ the daemon
    def _revive(self) -> None:
        """A daemon for the link to attach to: the one serving the state dir, else a new
        one (``ChannelError`` with its line when it cannot start)."""
        with self._daemon_lock:
            if self._stop.is_set() or daemon_answers(self.state_dir):
                return
            if self.daemon is not None and self.daemon.poll() is None:
                return   # ours, still starting
            try:
                self.daemon = spawn_daemon(self.command, self.state_dir)
            except ElasticSliceError as err:
                log.warning("the manager daemon cannot start again: %s", err)
                raise ChannelError(str(err)) from err
            log.warning("the manager daemon was gone: a new one (pid %d) serves %s",
                        self.daemon.pid, self.state_dir)

    # ------------------------------------------------------------------ running
    def attach(self) -> None:
        """Attach to the daemon of the state dir, started first if none serves it (it
        checks the config and the slice, then makes the state dir): its one line as
        :class:`ElasticSliceError` if it cannot; nothing is made then."""
        if self.link is not None:
            return
        if daemon_answers(self.state_dir) and not self._same_command():
            self._replace_daemon()
        if not daemon_answers(self.state_dir):
            self.daemon = spawn_daemon(self.command, self.state_dir)
        link = WorkloadLink(self.state_dir, on_node=self._on_node,
                            on_failures=self.failures.merge, revive=self._revive,
                            on_attach=self._on_attach)
        link.extra_nodes, link.activity = self._extra_nodes, self._activity
        try:
            link.start()
        except ChannelError as err:
            line = str(err).removeprefix("refused: ")
            raise ElasticSliceError(f"{self.state_dir}: {line}") from err
        self.link = link

    def _same_command(self) -> bool:
        """Whether the daemon serving the state dir was started as this cluster would start
        it (its settings): it writes its arguments in ``daemon.json``."""
        data = read_json(self.state_dir / DAEMON_FILE) or {}
        ours = self.command.argv(self.state_dir)
        return data.get("argv") == ours[ours.index("--state-dir"):]

    def _replace_daemon(self) -> None:
        """The daemon serving the state dir has other settings (a run resumed with other
        options): it stops, keeping the nodes, and a new one takes them with ours."""
        link = WorkloadLink(self.state_dir)
        try:   # refused while another workload is attached to it
            link.start()
        except ChannelError as err:
            raise ElasticSliceError(f"{self.state_dir}: {str(err).removeprefix('refused: ')}") \
                from err
        log.warning("the manager daemon of %s has other settings: it stops (the nodes are "
                    "kept) and a new one starts with these", self.state_dir)
        try:
            link.close_daemon(False, CLOSE_TIMEOUT)
        finally:
            link.close()
        deadline = time.monotonic() + 30
        while daemon_answers(self.state_dir) and time.monotonic() < deadline:
            time.sleep(0.1)

    def start(self) -> None:
        """:meth:`attach`, then Troy's session and the scheduler, whose address the daemon
        hears (its manager starts then); on failure what started is stopped."""
        try:
            self.attach()
            self._start()
        except BaseException:
            self.close(keep=True, resume=True)
            raise
        log.info("elastic cluster up: scheduler %s, state %s, manager daemon %s",
                 self.framework.scheduler_address, self.state_dir, self.daemon_pid)

    def _start(self) -> None:
        import troy
        assert self.link is not None
        previous = ClusterFile.load(self.state_dir)
        self.resumed = previous is not None
        self.restarts = previous.restarts + 1 if previous is not None else 0
        self.counters.open()
        tls = self._tls()
        self.session = troy.Session(self.state_dir / "troy.db")
        # the scheduler in a process of its own: it decodes what nodes send, and dies alone
        # (the framework brings it back on its address, the agents rejoin)
        options = {"adopt_workers": True, "listen": self.listen, "prefetch": 0,
                   "scheduler_process": self.scheduler_process,
                   **self.framework_options}
        if self.scheduler_port is not None:
            options.setdefault("port", self.scheduler_port)
        if previous is not None and not previous.closed:   # the agents rejoin it there
            options.setdefault("port", previous.port)
        try:
            self.framework = self.session.add_framework(
                "dask", "cloudlab", tls=tls, adopt_filter=self.link.accepts, **options)
        except Exception as err:
            if previous is None or previous.closed:
                raise
            raise ElasticSliceError(
                f"{self.state_dir}: cannot serve the Dask scheduler on port {options['port']} "
                f"again (the nodes' agents rejoin {previous.scheduler}): {err}") from err
        ClusterFile(self.framework.scheduler_address, os.getpid(), self.restarts).save(
            self.state_dir)
        if self.resumed:
            self._recover()
        self.counters.start()
        self.link.serve(self.framework, self.session)
        self.framework.adopt_joined()
        threading.Thread(target=self._reload_loop, args=(tls,), name="scheduler-cert",
                         daemon=True).start()
        threading.Thread(target=self._adopt_loop, name="cluster-adopt", daemon=True).start()
        deadline = time.monotonic() + 30   # its manager runs: its state and metrics are
        while (self.view() is None or self.metrics and self.metrics_url is None) \
                and time.monotonic() < deadline and not self.link.fatal:
            time.sleep(0.1)
        self.check()

    def _tls(self, member: str = "scheduler") -> DaskTLS:
        """The TLS files of the scheduler (``member``) or of a Dask client (``"client"``:
        ``Client(cluster)``), as the daemon wrote them."""
        data = read_json(self.state_dir / TLS_FILE) or {}
        prefix = "client_" if member == "client" else ""
        try:
            return DaskTLS(data["ca_file"], data[f"{prefix}cert_file"],
                           data[f"{prefix}key_file"],
                           data["deny_file"] if member == "scheduler" else None)
        except KeyError:
            raise ElasticSliceError(f"{self.state_dir / TLS_FILE}: not what the manager "
                                    f"daemon writes; stop it and move the file away") from None

    def client_tls(self) -> DaskTLS:
        """A Dask client's TLS files (OU ``control``: it may do what the user's client
        does), issued by the daemon."""
        return self._tls("client")

    def set_bounds(self, minthreshold: int, maxthreshold: int) -> None:
        """Hold from ``minthreshold`` to ``maxthreshold`` nodes from now on (the daemon's
        policy; said again to a daemon started later)."""
        check_bounds(minthreshold, maxthreshold)
        self._bounds = (minthreshold, maxthreshold)
        if self.link is not None:
            self.link.send_bounds(minthreshold, maxthreshold)

    def set_demand(self, extra_nodes: Any = None, activity: Any = None) -> None:
        """Demand besides Troy's units, in nodes (``extra_nodes()``, None: none), and the
        nodes' work Troy does not see (``activity()``, as ``PilotWatch.activity``)."""
        self._extra_nodes, self._activity = extra_nodes, activity
        if self.link is not None:
            self.link.extra_nodes = extra_nodes
            self.link.activity = activity
            self.link.poke()

    def nodes(self) -> int:
        """The nodes the daemon holds now (its state, read-only)."""
        view = self.view()
        return len(view.state.nodes()) if view is not None else 0

    def kept_nodes(self) -> int:
        """After :meth:`close`: the nodes the daemon left held, read once from its state (a
        node whose AddNodes landed while the run stopped is among them)."""
        view = open_view(self.state_dir)
        if view is None:
            return 0
        try:
            return len(view.state.nodes())
        finally:
            view.state.close()

    def _reload_loop(self, tls: DaskTLS) -> None:
        """The scheduler's certificate, loaded again when the daemon renewed it."""
        seen = _mtime(tls.cert_file)
        while not self._stop.wait(RELOAD_EVERY):
            now = _mtime(tls.cert_file)
            framework = self.framework
            if now == seen or framework is None:
                continue
            try:
                for context in framework.tls_contexts():
                    context.load_cert_chain(tls.cert_file, tls.key_file)
                seen = now
                log.info("the scheduler's certificate was renewed")
            except (OSError, ValueError) as err:   # half-written: the next look
                log.debug("the scheduler's certificate: %s", err)

    def _recover(self) -> None:
        recover_session(self.session, self.counters, self.state_dir, self.restarts)

    def _on_attach(self, link: WorkloadLink) -> None:
        """A daemon (again): it hears the bounds given since it started."""
        if self._bounds is not None:
            link.send_bounds(*self._bounds)

    def _on_node(self, event: str, client_id: str) -> None:
        if event == "joined":   # its agent may be waiting: offered again, off the channel
            self._adopt.set()

    def _adopt_loop(self) -> None:
        """Agents that joined before their node was known here are offered for adoption
        again (a Dask round trip: never on the channel's reader)."""
        while not self._stop.is_set():
            self._adopt.wait(1.0)
            if not self._adopt.is_set():
                continue
            self._adopt.clear()
            framework = self.framework
            if framework is None:
                continue
            try:
                framework.adopt_joined()
            except Exception as err:  # noqa: BLE001 - its scheduler coming back: next time
                log.debug("offering the joined agents again: %s", err)
                self._adopt.set()
                self._stop.wait(1.0)

    @property
    def daemon_pid(self) -> int | None:
        """The daemon's pid, as the state directory's lock says (None: not known)."""
        return lock_pid(self.state_dir)

    def overlay(self) -> Any:
        from troy import Overlay
        return Overlay.following(self.framework)

    @property
    def metrics_url(self) -> str | None:
        """The daemon's metrics endpoint (None: none asked for, or not up yet)."""
        data = read_json(self.state_dir / "metrics.json") or {}
        url = data.get("url")
        return url if isinstance(url, str) else None

    # ------------------------------------------------------------------ looking
    def view(self) -> StateView | None:
        """The daemon's state, read-only (None: none yet)."""
        if self._view is None:
            self._view = open_view(self.state_dir)
        return self._view

    def pilots(self) -> list[Any]:
        return [p for p in self.framework.list_pilots() if p.state not in FINAL_STATES]

    def check(self) -> None:
        """:class:`ElasticSliceError` with the daemon's line if it stopped for good."""
        link = self.link
        if link is not None and link.fatal:
            raise ElasticSliceError(f"{self.state_dir}: {link.fatal} (see "
                                    f"{self.state_dir / LOG_FILE})")

    def snapshot(self) -> ClusterSnapshot:
        self.check()
        return ClusterSnapshot.of(self.view(), self.session, self.pilots())

    def stats(self) -> dict[str, Any]:
        view = self.view()
        out: dict[str, Any] = view.stats() if view is not None else {}
        out.update(self.counters.totals())
        out["restarts"] = self.restarts
        return out

    def save_stats(self) -> None:
        self.counters.save()

    # ------------------------------------------------------------------ stopping
    def close(self, keep: bool | None = None, *, resume: bool = False) -> None:
        """Troy first (its pilots leave quietly), then the daemon: it gives the slice back
        unless ``keep`` and exits. ``resume``: what was in flight stays unfinished in the
        store. Idempotent."""
        keep = self.keep if keep is None else keep
        self._stop.set()
        self.counters.stop()
        if self.session is not None:
            try:
                self.save_stats()
            except Exception:  # closing anyway
                log.exception("cannot save the run's counters")
        session, self.session = self.session, None
        self.framework = None
        try:
            if session is not None:
                session.close(keep_unfinished=resume)
        finally:
            self._close_daemon(give_back=not keep)

    def _close_daemon(self, give_back: bool) -> None:
        link, self.link = self.link, None
        if link is None:
            return
        try:
            if not link.attached and not link.fatal:   # it died: a new one gives it back
                self._stop.clear()
                deadline = time.monotonic() + 60
                while not link.attached and time.monotonic() < deadline:
                    time.sleep(0.2)
                self._stop.set()
            done = link.close_daemon(give_back, CLOSE_TIMEOUT)
            if done and give_back:
                ClusterFile.mark_closed(self.state_dir)
            if not done and not link.fatal:
                log.warning("the manager daemon did not say it stopped: see %s",
                            self.state_dir / LOG_FILE)
        finally:
            link.close()
            if self._view is not None:
                self._view.state.close()
                self._view = None
            daemon = self.daemon
            if daemon is not None:
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    log.warning("the manager daemon (pid %d) is still there: stopping it",
                                daemon.pid)
                    daemon.terminate()
                    daemon.wait()


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
