"""The elastic demo (the default of ``elasticslice demo``, ``make demo`` and ``bin/demo``).

Four steps: start CloudLab in a box (a fresh emulator in ``DIR/emulator``, or
``--emulator-dir``); start the elastic cluster against it (``elasticslice.pilots``'
``ElasticCluster``: the manager with the pilot helper, its CA, a Dask scheduler on TLS, a
Troy session; every node it acquires boots a real node agent that joins as a pilot); run a
real workflow with Troy on whatever pilots there are, while the other tenants' load takes
one node back mid-run (drain, early release), with a live progress line; stop everything
and give the nodes back. ``ElasticDemo(options, console).run()`` returns the
``ElasticReport``; ``close()`` stops what is still running after a failure or Ctrl-C.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticslice.demo.console import Console, DemoError, port_open, rel, stop_emulator
from elasticslice.demo.report import ElasticReport, Progress, ProgressPrinter, event_lines
from elasticslice.demo.tenantload import SiteAdmins, TenantLoad
from elasticslice.emulator import EmulatorServer, init_emulator
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.emulator.clusters import TYPES, inventory_text

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_WORKLOAD = REPO / "examples" / "workflows" / "montage-chameleon-2mass-005d-001.json"
STEPS = 4
TICK = 0.5
SITES_EVERY = 2.0   # seconds between looks at each site's pool (--sites)
HARDWARE_TYPE = "m510"
NODE_MEMORY = 16384   # MB, each emulated node


def inventory(hw: str, prefix: str, count: int, cores: int) -> str:
    """The demo's pool: ``count`` nodes of one hardware type."""
    return inventory_text(hw, [(hw, count, cores, NODE_MEMORY, prefix)], images=None)


@dataclass
class ElasticOptions:
    """What ``elasticslice demo`` lets the user choose (see ``--help``)."""

    directory: Path = Path("demo-run")
    emulator_dir: Path | None = None
    workload: Path = DEFAULT_WORKLOAD
    time_scale: float = 1.0
    nodes_min: int = 1
    nodes_max: int = 4
    node_cores: int = 4
    pool: int = 8
    notice: int = 30
    notify_interval: float = 2.0
    margin: float = 5.0
    revocations: int = 1
    idle_timeout: float = 10.0
    boot_delay: float = 1.0
    timeout: float = 240.0
    report: Path | None = None
    quiet: bool = False
    sites: int = 1

    def site_pools(self) -> list[tuple[str, str, str, int]]:
        """``(cluster, hardware type, node name prefix, nodes)`` of each site: the first
        holds half of ``nodes_max`` (it fills, and the slice grows at the next), the others
        ``pool`` each."""
        first = max(1, self.nodes_max // self.sites)
        out = []
        for i, (name, (hw, types)) in enumerate(list(TYPES.items())[:self.sites]):
            prefix = next(t[4] for t in types if t[0] == hw)   # the cluster's own names
            out.append((name, hw, prefix, first if i == 0 else self.pool))
        return out


class ElasticDemo:
    """The walkthrough; ``run()`` does every step, ``close()`` stops what is left."""

    steps = STEPS

    def __init__(self, options: ElasticOptions, console: Console) -> None:
        self.o = options
        self.c = console
        self.dir = options.directory.resolve()
        self.emu_dir = (options.emulator_dir or self.dir / "emulator").resolve()
        self.report = ElasticReport(workload=options.workload.name,
                                    time_scale=options.time_scale)
        self.emu: EmulatorServer | None = None
        self.cluster: Any = None
        self.tenants: TenantLoad | None = None
        self.outputs: Any = None   # troy.output.OutputKeeper, once the workload is loaded
        self.node_cores: int | None = None
        self.owned_dirs: list[Path] = []   # emulators we started: their nodes are ours
        self.t0 = time.monotonic()

    @property
    def report_paths(self) -> list[Path]:
        return [self.dir / "report.json", *([self.o.report] if self.o.report else [])]

    @property
    def log_path(self) -> Path:
        return self.dir / "demo.log"

    # ---------------------------------------------------------------- step 1
    def start_emulator(self) -> None:
        self.c.step("Start CloudLab in a box (the emulator: SA + CM over TLS, its own CA)",
                    "emulator")
        d = self.emu_dir
        running = self._running_port(d)
        if running:
            self._check_sites(d)
            self.c.detail("emulator", f"{rel(d)}/ serves already (port {running}): used as "
                                      f"it is, left running")
            url = json.loads((d / "server.json").read_text(encoding="utf-8"))["url"]
            self.report.emulator_url = str(url)
            return
        pool: Path | None = self.dir / "inventory.ini"
        if self.o.sites > 1:
            self._init_sites(d)
            pool = None   # each cluster has its own
        else:
            if not (d / "ca.pem").exists():
                init_emulator(d, port=0)
            self._check_sites(d)
            pool.write_text(inventory(HARDWARE_TYPE, "ms10", self.o.pool, self.o.node_cores),
                            encoding="utf-8")
        self.emu = EmulatorServer(d, port=0, inventory=pool,
                                  boot_delay=self.o.boot_delay,
                                  notify_interval=self.o.notify_interval,
                                  max_wait=self.o.notice)
        self.emu.start()
        self.owned_dirs.append(d)
        self.node_cores = self.o.node_cores
        self.report.emulator_url = self.emu.url
        self.c.detail("directory", f"{rel(d)}/  (node sandboxes in nodes/<node>/)")
        self.c.detail("URL", f"{self.emu.url}")
        if self.o.sites == 1:
            self.c.detail("inventory", f"{self.o.pool} {HARDWARE_TYPE} nodes, "
                                       f"{self.o.node_cores} cores each")
        for name, hw, _, count in self.o.site_pools() if self.o.sites > 1 else ():
            self.c.detail(f"cluster {name}", f"its own CM, {count} {hw} nodes of "
                                             f"{self.o.node_cores} cores")
        self.c.detail("notices", f"a reclaimed node gets {self.o.notice} s "
                                 f"(NotifyDeletePending every {self.o.notify_interval:g} s)")

    def _init_sites(self, d: Path) -> None:
        """A box of ``--sites`` clusters (one SA, a CM each), made here the first time."""
        if not (d / "ca.pem").exists():
            specs = []
            for name, hw, prefix, count in self.o.site_pools():
                path = self.dir / f"inventory-{name}.ini"
                path.write_text(inventory(hw, prefix, count, self.o.node_cores),
                                encoding="utf-8")
                specs.append(f"{name}={path}")
            init_emulator(d, port=0, clusters=tuple(specs))
        self._check_sites(d)

    def _check_sites(self, d: Path) -> None:
        have = self._clusters(d)
        if len(have) != (self.o.sites if self.o.sites > 1 else 0):
            what = f"a box of {len(have)} clusters" if have else "a box of one CM"
            raise DemoError(f"{rel(d)}/ is {what}, made by an earlier run: --sites "
                            f"{self.o.sites} needs another --dir (or remove {rel(d)}/)")

    @staticmethod
    def _clusters(d: Path) -> list[str]:
        try:
            data = json.loads((d / "emulator.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        return [str(c).split("=", 1)[0] for c in data.get("clusters") or []]

    @staticmethod
    def _running_port(d: Path) -> int:
        try:
            port = int(json.loads((d / "server.json").read_text(encoding="utf-8"))["port"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0
        return port if port_open(port) else 0

    # ---------------------------------------------------------------- step 2
    def start_cluster(self) -> None:
        self.c.step("Start the elastic cluster: manager daemon, TLS Dask scheduler, Troy; "
                    "every node a pilot", "elastic cluster")
        from elasticslice.runsettings import resolve_settings
        from elasticslice.config import load_config
        from elasticslice.pilots.daemon import DaemonCommand
        from elasticslice.pilots.workload import WorkloadCluster
        config = self.emu_dir / "elasticslice.conf"
        self.started_at = time.time()   # the report's timeline starts here (waits included)
        # as `elasticslice run` does: the manager daemon holds the credentials and the CA
        # key, this process Troy and the scheduler; both listen where the emulator's config
        # says its nodes reach this machine (its control address), else loopback
        settings = {"margin": str(self.o.margin), "idle_timeout": str(self.o.idle_timeout)}
        if self.node_cores is not None:   # else what the first node has
            settings["node_cores"] = str(self.node_cores)
        command = DaemonCommand(str(config), settings, max_nodes=self.o.nodes_max,
                                min_nodes=self.o.nodes_min)
        chosen = resolve_settings(load_config(config, open_files=False), settings,
                                  self.o.nodes_max)
        self.cluster = WorkloadCluster(command, self.dir / "cluster", listen=chosen.listen,
                                       scheduler_port=chosen.scheduler_port)
        self.cluster.start()
        fw = self.cluster.framework
        address = getattr(fw, "scheduler_address", None) or getattr(fw, "address", None)
        if address:
            self.c.detail("scheduler", f"{address} (TLS; certificates from the cluster's "
                                       f"own CA)")
        self.c.detail("nodes", f"{self.o.nodes_min} to {self.o.nodes_max}, as the "
                               f"workload's demand says; drain margin {self.o.margin:g} s")

    # ---------------------------------------------------------------- step 3
    def run_workload(self) -> None:
        import troy
        self.c.step("Run the workload on the pilots, elastically; other tenants take a "
                    "node back mid-run", "workload")
        from troy.output import OutputKeeper
        workload = self.load_workload(self.node_cores)
        self.outputs = OutputKeeper(self.dir / "output").open()  # tasks' stdout/stderr
        self.outputs.watch(workload)
        total = len(workload.tasks)
        work = sum(t.description.runtime or 0.0 for t in workload.tasks.values())
        self.report.units_total = total
        self.c.detail("workload", f"{self.o.workload.name}: {total} tasks, {work:.0f} s of "
                                  f"task time (recorded runtimes x {self.o.time_scale:g})")
        self.tenants = TenantLoad(self.admin(), revocations=self.o.revocations,
                                  node_cores=self.node_cores)
        run = troy.WorkloadRun(self.cluster.session, workload, self.cluster.overlay(),
                               bind_mode="late", timeout=self.o.timeout, name="demo-workload",
                               events=False)
        started = time.monotonic()
        run.start()
        printer = ProgressPrinter(self.c)
        last_stats: dict[str, Any] = {}
        sites, sites_at = "", -SITES_EVERY
        while True:
            alive = not run.done()
            snap = self.cluster.snapshot()
            stats = dict(self.cluster.stats())
            done = run.progress().done
            if time.monotonic() - sites_at >= SITES_EVERY or not alive:
                sites, sites_at = self.look_at_sites(), time.monotonic()
            progress = Progress(time.monotonic() - started, int(snap.nodes_held),
                                int(snap.pilots), int(snap.units_queued),
                                int(snap.units_running), done, total,
                                int(stats.get("revocations", snap.revocations)), sites)
            if self.tenants.node_cores is None:     # a shared emulator: the pilots say
                self.tenants.node_cores = self.pilot_cores()
            lines = event_lines(last_stats, stats) + self.tenants.step(
                snap, stats, work_left=alive and done < total)
            last_stats = stats
            for line in lines:
                self.c.event(f"{progress.elapsed:5.1f}s  * {line}")
            printer.show(progress, final=not alive)
            if not alive:
                break
            run.wait(TICK)
        self.report.makespan_s = time.monotonic() - started
        self.finish_workload(workload, run.exception())

    def admin(self) -> Any:
        """The emulator's admin path: with ``--sites``, each site's in turn."""
        if self.o.sites == 1:
            return AdminClient(self.emu_dir)
        return SiteAdmins({name: AdminClient(self.emu_dir, cluster=name)
                           for name, *_ in self.o.site_pools()})

    def look_at_sites(self) -> str:
        """Our nodes at each site now (the emulator's pools), kept for the report:
        ``"utah 2, wisc 1"``; "" with one site."""
        if self.o.sites == 1 or not isinstance(self.tenants.admin, SiteAdmins):
            return ""
        parts = []
        for name, admin in self.tenants.admin.admins.items():
            try:
                held = sum(int(r.get("slice", 0)) for r in
                           admin.call("Status")["pool"].values())
            except Exception as err:  # noqa: BLE001 - a look, not a step: say why, go on
                log.warning("cannot read %s's pool: %s", name, err)
                return ""
            site = self.report.sites.setdefault(name, {"nodes_peak": 0})
            site["nodes_peak"] = max(site["nodes_peak"], held)
            parts.append(f"{name} {held}")
        return ", ".join(parts)

    def pilot_cores(self) -> int | None:
        pilots = self.cluster.pilots() if self.cluster is not None else []
        cores = max((p.size for p in pilots), default=0)
        return int(cores) if cores else None

    def load_workload(self, max_cores: int | None) -> Any:
        from troy.workload.files import load_workload
        return load_workload(self.o.workload, time_scale=self.o.time_scale,
                             max_cores=max_cores)

    def finish_workload(self, workload: Any, err: BaseException | None) -> None:
        import troy
        from troy.errors import NoSuccess
        states = [t.state for t in workload.tasks.values()]
        r = self.report
        r.units_done = sum(1 for s in states if s is troy.State.DONE)
        r.units_failed = sum(1 for s in states if s is troy.State.FAILED)
        r.workload_state = str(getattr(workload.state, "value", workload.state))
        r.take_tasks(workload, self.outputs, self.dir)
        if self.cluster is not None:
            from elasticslice.pilots.timeline import run_timeline
            r.timeline = run_timeline(self.cluster, self.started_at)
        self.take_counts()
        caused = self.tenants.forced if self.tenants is not None else 0
        if caused < self.o.revocations:
            self.c.event(f"note: {caused} of the {self.o.revocations} revocation(s) asked "
                         f"for happened: the workload ended, or never ran on two busy "
                         f"pilots again, before the next (a larger --time-scale leaves "
                         f"time for it)")
        if isinstance(err, NoSuccess) and r.units_done < r.units_total:
            raise DemoError(f"the workload did not finish within --timeout "
                            f"{self.o.timeout:g}s ({r.units_done}/{r.units_total} units "
                            f"done)") from err
        if err is not None:
            raise err
        if r.units_done < r.units_total or r.units_lost:
            raise DemoError(f"the workload ended {r.workload_state}: {r.units_done}/"
                            f"{r.units_total} units done, {r.units_failed} failed, "
                            f"{r.units_lost} lost (see {rel(self.report_paths[0])})")

    def take_counts(self) -> None:
        """The cluster's counters and Troy's unit counts into the report."""
        if self.cluster is None:
            return
        stats = dict(self.cluster.stats())
        self.report.take_stats(stats)
        unit_stats = getattr(self.cluster.session, "unit_stats", None)
        if unit_stats is not None:
            us = unit_stats()
            self.report.units_lost = int(us.lost)
            self.report.units_requeued = max(self.report.units_requeued, int(us.requeued))
            self.report.duplicates = max(self.report.duplicates, int(us.duplicates))
        else:
            self.report.units_lost = int(stats.get("units_lost", 0))

    # ---------------------------------------------------------------- step 4
    def stop(self) -> None:
        self.c.step("Stop: give the nodes back, stop the Dask scheduler and the emulator",
                    "stop")
        self.collect_reclamations()
        self.close_cluster()
        self.take_nodes_back_detail()
        port = self.emu.port if self.emu is not None else 0
        self.stop_emulator()
        if port:
            if port_open(port):
                raise DemoError(f"the emulator still answers on port {port} after stop")
            self.c.detail("emulator", f"stopped; port {port} closed")

    def collect_reclamations(self) -> None:
        sites = [name for name, *_ in self.o.site_pools()] if self.o.sites > 1 else [None]
        for name in sites:
            try:
                rows = list(AdminClient(self.emu_dir, cluster=name).call("Report"))
            except Exception:   # the report is a nicety; the log says why it is missing
                log.exception("cannot read the emulator's reclamation report")
                continue
            for row in rows:
                if name is not None:
                    row["site"] = name
                    site = self.report.sites.setdefault(name, {"nodes_peak": 0})
                    outcome = str(row.get("outcome", "?"))
                    site[outcome] = int(site.get(outcome, 0)) + 1
                    site["revocations"] = int(site.get("revocations", 0)) + 1
            self.report.reclamations.extend(rows)

    def take_nodes_back_detail(self) -> None:
        outcomes: dict[str, int] = {}
        for rec in self.report.reclamations:
            outcomes[rec.get("outcome", "?")] = outcomes.get(rec.get("outcome", "?"), 0) + 1
        if outcomes:
            self.c.detail("emulator says", "reclamations: " + ", ".join(
                f"{n} {k}" for k, n in sorted(outcomes.items())))
        self.c.detail("cluster", "closed: nodes given back, Dask scheduler stopped")

    # ---------------------------------------------------------------- life cycle
    def run(self) -> ElasticReport:
        """Every step; the report is written after a failure too (what was done so far)."""
        self.load_workload(None)   # a bad workload file fails now, not after a minute
        self.report.settings = {k: (str(v) if isinstance(v, Path) else v)
                                for k, v in vars(self.o).items()}
        try:
            self.start_emulator()
            self.start_cluster()
            self.run_workload()
            self.stop()
            self.report.ok = True
        except BaseException as err:
            self.report.error = str(err) or type(err).__name__
            raise
        finally:
            self.report.wall_s = time.monotonic() - self.t0
            if self.report.tenant_load == {} and self.tenants is not None:
                self.report.tenant_load = self.tenants.to_json()
            self.report.write(*self.report_paths)
        return self.report

    def close_cluster(self) -> None:
        if self.tenants is not None:
            self.report.tenant_load = self.tenants.to_json()
            if self.emu is None:      # a shared emulator: its load as it was
                self.tenants.restore()
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            try:
                self.report.take_stats(dict(cluster.stats()))
            except Exception:
                log.exception("cannot read the cluster's last counters")
            log.info("closing the elastic cluster")
            cluster.close()

    def stop_emulator(self) -> None:
        if self.emu is not None:
            emu, self.emu = self.emu, None
            stop_emulator(emu)

    def close(self) -> None:
        """Stop whatever is still running (after a failure or an interrupt). Idempotent."""
        try:
            self.close_cluster()
        except Exception:
            log.exception("closing the elastic cluster failed")
        try:
            self.stop_emulator()
        except Exception:
            log.exception("stopping the emulator failed")
