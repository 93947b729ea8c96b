"""`elasticslice run WORKFLOW --state-dir DIR`: a workflow on an elastic cluster, resumable.

    elasticslice -c C run examples/workflows/X.json --state-dir runs/x [--report r.json]

DIR holds the whole run (the cluster CA, the Troy store, the manager's state, ``cluster.json``
with the scheduler's address and the process id, ``run.json`` naming the workflow, the
run's counters, ``run.log``, and each task's output in ``output/``). Run the same command
again after the process died, even of a SIGKILL, or after a Ctrl-C, SIGTERM or --timeout
(which keep the nodes): it resumes (same scheduler port, the node agents rejoin, finished
tasks are not run again). Exit 0: every task DONE; 1: some did not end DONE, --timeout, or
an error; 2: bad usage; 130: interrupted.
"""
from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import click

from elasticslice.errors import ElasticSliceError
from elasticslice.runsettings import (DEFAULT_MAX_NODES, MANAGER_KEYS_RUN_TAKES, POLICY_KEYS,
                                      SETTINGS, RunSettings, SettingsError, option_name)
from elasticslice.runsettings import resolve_settings as _resolve

log = logging.getLogger("elasticslice.run")

TICK = 0.5          # seconds between two looks at the run
PROGRESS_EVERY = 5.0  # a progress line at least this often while something changes
RUN_FILE = "run.json"
OUTPUT_DIR = "output"  # DIR/output: each task's stdout and stderr
#: the report's ``stats``: its names, and the cluster's counter each comes from
STATS = {"units_requeued": "units_requeued", "duplicate_runs": "duplicates",
         "units_lost": "units_lost", "revocations": "revocations",
         "early_releases": "early_releases", "forced_releases": "forced_releases",
         "restarts": "restarts"}


class BadUsage(click.ClickException):
    """A bad argument: one line, exit 2."""

    exit_code = 2


class Stopped(ElasticSliceError):
    """The run stopped before its end (a timeout); DIR keeps it for a resume."""


# ---------------------------------------------------------------- the run's settings --------
def setting_options(f: Any) -> Any:
    """The run's settings as options of a command (``run``, ``doctor``): each a string,
    checked as the config's key is (:func:`resolve_settings`)."""
    for name, (section, key, _default, text) in reversed(SETTINGS.items()):
        metavar = {"listen": "ADDRESS", "public_url": "URL", "image": "URN",
                   "hardware_type": "TYPE", "node_cores": "N", "endpoint_port": "PORT",
                   "metrics_port": "PORT", "scheduler_port": "PORT", "enrol_port": "PORT",
                   "publish_port": "PORT"}.get(name, "SECONDS")
        f = click.option(option_name(name), name, default=None, metavar=metavar,
                         help=text)(f)
    return f


def resolve_settings(client: Any, given: dict[str, Any],
                     max_nodes: int | None = None) -> RunSettings:
    """:func:`elasticslice.runsettings.resolve_settings`, a bad value :class:`BadUsage`."""
    try:
        return _resolve(client, given, max_nodes)
    except SettingsError as err:
        raise BadUsage(str(err)) from None


__all__ = ["DEFAULT_MAX_NODES", "MANAGER_KEYS_RUN_TAKES", "POLICY_KEYS", "SETTINGS",
           "RunSettings", "option_name", "resolve_settings", "setting_options"]


def fingerprint(path: Path, time_scale: float) -> dict[str, Any]:
    """What names a run's workflow: the file (absolute), its SHA-256, the time scale."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"workflow": str(path.resolve()), "sha256": digest, "time_scale": time_scale}


def check_same_run(state_dir: Path, mine: dict[str, Any]) -> dict[str, Any] | None:
    """The run recorded in ``state_dir`` (None: none yet); BadUsage if it is another one."""
    from elasticslice.pilots.restart import read_json
    if state_dir.exists() and not state_dir.is_dir():
        raise ElasticSliceError(f"--state-dir {state_dir}: not a directory")
    try:
        theirs = read_json(state_dir / RUN_FILE)
    except ElasticSliceError as err:
        raise BadUsage(f"--state-dir {state_dir}: {err}") from err
    if theirs is None:
        return None
    if (theirs.get("sha256"), theirs.get("time_scale")) != (mine["sha256"], mine["time_scale"]):
        raise BadUsage(f"--state-dir {state_dir} holds a run of {theirs.get('workflow')} "
                       f"(time scale {theirs.get('time_scale')}), not of this workflow: give "
                       f"another --state-dir")
    return theirs


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run as Ctrl-C does: resumable, nodes kept


def log_to_file(path: Path, debug: bool) -> None:
    """The details go to DIR/run.log; stderr keeps warnings, progress and the outcome."""
    if not debug:
        from troy.frameworks.dask import silence_dask
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.WARNING)
        silence_dask()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)


def the_workload(session: Any, fresh: Any) -> Any:
    """The run's workload: the one the store holds (resumed: its in-flight units dispatched
    again, or rebuilt as it ended), else ``fresh`` (planned: its tasks are final)."""
    from troy.errors import DoesNotExist
    from troy.planner import Planner
    try:
        return session.resume_workload()
    except DoesNotExist:
        Planner(session).plan(fresh)
        return fresh


class SiteWatch:
    """Nodes and revocations per CM, from the manager daemon's state (``DIR/state``, read
    only, as ``status`` reads it): ``{}`` until the daemon wrote it, or when unreadable."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "state"
        self._state: Any = None

    def counts(self) -> dict[str, dict[str, Any]]:
        from elasticslice.managers.sites import site_counts
        try:
            if self._state is None:
                if not (self.path / "manager.db").is_file():
                    return {}
                from elasticslice.managers.state import ManagerState
                self._state = ManagerState.read_only(self.path)
            return site_counts(self._state)
        except Exception as err:   # a progress line never fails the run
            log.debug("nodes per CM: %s", err)
            return {}

    def close(self) -> None:
        state, self._state = self._state, None
        if state is not None:
            state.close()


def progress_line(cluster: Any, progress: Any, elapsed: float,
                  sites: dict[str, dict[str, Any]] | None = None) -> str:
    """The live line; with nodes at several CMs, each CM's nodes and revocations too."""
    from elasticslice.managers.sites import sites_line
    snap = cluster.snapshot()
    return (f"[{elapsed:6.1f}s] tasks {progress.done}/{progress.total} done, "
            f"{snap.units_running} units running, {snap.units_queued} queued; "
            f"{snap.nodes_held} nodes, {snap.pilots} pilots; {snap.revocations} revocations"
            + (f" [{sites_line(sites)}]" if sites and len(sites) > 1 else ""))


def follow(cluster: Any, run: Any, timeout: float | None, sites: Any = dict) -> Any:
    """Progress on stderr until the run ends (its final state; what it raised, raised);
    Stopped after ``timeout``. ``sites()``: nodes and revocations per CM (SiteWatch)."""
    started = time.monotonic()
    shown, shown_at = "", 0.0
    while not run.wait(0 if not shown else TICK):
        now = time.monotonic()
        if timeout is not None and now - started > timeout:
            raise Stopped(f"not finished within --timeout {timeout:g} s")
        line = progress_line(cluster, run.progress(), now - started, sites())
        for failure in cluster.failures.fresh():  # at once, once each, with its cause
            click.echo(f"[{now - started:6.1f}s] {failure.line()}", err=True)
        body = line.split("] ", 1)[1]
        if body != shown and now - shown_at >= PROGRESS_EVERY or not shown:
            click.echo(line, err=True)
            shown, shown_at = body, now
    click.echo(progress_line(cluster, run.progress(), time.monotonic() - started, sites()),
               err=True)
    return run.result()


def make_report(workload: Any, wall: float, stats: dict[str, Any], outputs: Any = None,
                base: str | None = None) -> dict[str, Any]:
    """``troy run``'s report of ``workload`` (its tasks' kept output files relative to
    ``base``) plus ``stats`` (the contract's names) and ``nodes_peak``, from the cluster's
    counters ``stats``."""
    from troy.report import build_report
    data = build_report(workload, workload.state, wall, outputs=outputs, base=base)
    data["stats"] = {name: int(stats.get(key, 0)) for name, key in STATS.items()}
    data["nodes_peak"] = int(stats.get("nodes_peak", 0))
    return data


def ended_report(state_dir: Path, theirs: dict[str, Any], outputs: Any,
                 base: str | None) -> dict[str, Any]:
    """The report of a run that ended already (from its store; no cluster, no node)."""
    import troy
    from troy.errors import DoesNotExist
    with troy.Session(state_dir / "troy.db") as session:
        try:
            workload = session.resume_workload()
        except DoesNotExist as err:
            raise ElasticSliceError(f"--state-dir {state_dir}: the run ended but its store "
                                    f"holds no workload") from err
        outputs.watch(workload)   # the files the run kept
        wall = float(theirs.get("ended", 0.0)) - float(theirs.get("started", 0.0))
        stats = {key: theirs.get("stats", {}).get(name, 0) for name, key in STATS.items()}
        return make_report(workload, wall, {**stats, "nodes_peak": theirs.get("nodes_peak", 0)},
                           outputs, base)


def write_report(path: str, data: dict[str, Any]) -> None:
    from elasticslice.pilots.restart import write_json
    try:
        write_json(Path(path), data)
    except OSError as err:
        raise ElasticSliceError(f"--report {path}: cannot write: {err.strerror or err}") \
            from err


def summary(data: dict[str, Any]) -> str:
    from elasticslice.managers.sites import sites_line
    s, sites = data["stats"], data.get("sites") or {}
    return (f"{data['state']}: {data['tasks_done']}/{data['tasks_total']} tasks done, "
            f"{data['tasks_failed']} failed, {data['tasks_canceled']} canceled; "
            f"{data['nodes_peak']} nodes at most; {s['revocations']} revocation(s): "
            f"{s['early_releases']} released early, {s['forced_releases']} forced; "
            f"{s['restarts']} restart(s), {s['units_requeued']} units requeued, "
            f"{s['units_lost']} lost"
            + (f"; {len(data['node_failures'])} node(s) failed to start (the report names "
               f"them)" if data.get("node_failures") else "")
            + (f"; per CM: {sites_line(sites)}" if len(sites) > 1 else ""))


def check_options(state_dir: Path | None, time_scale: float, timeout: float | None,
                  report: str | None) -> None:
    if state_dir is None:
        raise BadUsage("give --state-dir DIR: where the run lives (the same DIR resumes it)")
    from troy.runs import run_numbers_problem
    problem = run_numbers_problem(time_scale, timeout)
    if problem:
        raise BadUsage(problem)
    if report and not os.path.isdir(os.path.dirname(os.path.abspath(report))):
        raise BadUsage(f"--report {report}: no directory "
                       f"{os.path.dirname(os.path.abspath(report))}")


def stop_line(why: str, state_dir: Path, held: int, released: bool) -> str:
    """What a run stopped before its end says on stderr."""
    nodes = "" if not held else (f"; its {held} node(s) given back (--release)" if released
                                 else f"; its {held} node(s) kept for it (--release gives "
                                      f"them back)")
    return f"{why}: run the same command again to resume ({state_dir}){nodes}"


def close_cluster(cluster: Any, ended: bool, keep: bool, release: bool) -> int:
    """Stop the cluster: a run that ended gives its nodes back (unless ``keep``), one that
    stopped before its end keeps them for a resume (unless ``release``) and leaves what was
    in flight unfinished in its store. Returns how many nodes it held."""
    held = cluster.nodes() if cluster.session is not None else 0
    kept = keep if ended else not release
    cluster.close(keep=kept, resume=not ended)
    if kept and held:   # what the daemon left held: a node being added as it stopped too
        held = cluster.kept_nodes()
    return held


@click.command("run")
@click.argument("workflow", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--state-dir", default=None, type=click.Path(path_type=Path),
              help="Where the run lives (created); the same DIR again resumes it.")
@click.option("--max-nodes", type=click.IntRange(1, 1000), default=None,
              help="Hold at most this many nodes. Config [manager] maxthreshold. Default: "
                   f"{DEFAULT_MAX_NODES}.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="WfFormat files: multiply recorded runtimes by this.")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Write a JSON report: the tasks (with their output files), and 'stats' "
                   "over the whole run.")
@click.option("--output-dir", type=click.Path(path_type=Path), default=None,
              help="Keep each task's stdout and stderr (the last 64 KiB of each) here "
                   "(default: DIR/output).")
@click.option("--keep", is_flag=True, help="Leave the nodes held when the run ends.")
@click.option("--release", is_flag=True,
              help="Give the nodes back when the run stops before its end (Ctrl-C, SIGTERM, "
                   "--timeout, an error); by default they are kept for a resume.")
@click.option("--timeout", type=float, default=None,
              help="Stop after this many seconds (exit 1; the nodes are kept: run again to "
                   "resume).")
@click.option("--adopt", is_flag=True,
              help="Work on the configured slice although this --state-dir did not create "
                   "it and it holds a sliver (another manage or run may be using it); a "
                   "slice that holds none, as a run that ended leaves it, needs no --adopt.")
@click.option("--cm", "cms", multiple=True, metavar="CM",
              help="Hold nodes at this CM of [protogeni] cm_urls: a cluster's name (utah), "
                   "a part of its URL, or its number; repeat for several (a sliver at each, "
                   "the policy spreads the nodes in this order). Config [manager] cmlist. "
                   "Default: every CM of cm_urls.")
@click.option("--connect-timeout", type=click.FloatRange(0.1), default=60.0,
              show_default=True, help="Fail, leaving nothing behind, when the SA or a CM "
                                      "does not answer within this many seconds.")
@setting_options
@click.pass_context
def run_cmd(ctx: click.Context, workflow: Path, state_dir: Path | None, max_nodes: int | None,
            time_scale: float, report: str | None,
            output_dir: Path | None, keep: bool, release: bool,
            timeout: float | None, adopt: bool, connect_timeout: float,
            cms: tuple[str, ...], **settings: Any) -> None:
    """Run WORKFLOW (Troy JSON or WfFormat) on an elastic cluster of the configured CM.

    The cluster grows to the workflow's demand (up to --max-nodes); every node runs a Troy
    pilot agent that joins this run's Dask scheduler (a process of its own) over TLS. The
    CloudLab credentials are opened by the manager daemon alone, which this command starts
    (or attaches to) and stops at the end; its log is DIR/daemon.log. Progress goes to stderr,
    one summary line to stdout; each task's output is kept in DIR/output. DIR keeps
    everything: if this process dies (even of SIGKILL), or stops on Ctrl-C, SIGTERM or
    --timeout, the same command with the same --state-dir resumes the run: the nodes held
    are kept, their agents rejoin, tasks already DONE do not run again (--release gives the
    nodes back when it stops instead). The nodes are given back at the end unless --keep.
    Each of --listen ... --endpoint-port may instead be set in the config file ([pilots],
    [endpoint]; the option wins), and the run follows the config's [manager] and [endpoint]
    as `manage` does. `elasticslice doctor` checks the settings before a real run.
    Exit status: 0 every task DONE, 1 otherwise, on --timeout or on an error, 2 bad usage,
    130 interrupted (Ctrl-C or SIGTERM)."""
    from troy.errors import TroyError
    from troy.output import OutputKeeper
    from troy.workload.files import load_workload
    check_options(state_dir, time_scale, timeout, report)
    try:
        workload = load_workload(workflow, time_scale=time_scale)
        mine = fingerprint(workflow, time_scale)
    except (TroyError, OSError) as err:
        raise BadUsage(str(err) if isinstance(err, TroyError)
                       else f"{workflow}: cannot read: {err.strerror or err}") from err
    state_dir = state_dir.expanduser().resolve()
    theirs = check_same_run(state_dir, mine)
    outputs = OutputKeeper(output_dir or state_dir / OUTPUT_DIR)
    base = os.path.dirname(os.path.abspath(report)) if report else None
    if theirs is not None and theirs.get("ended"):
        log_to_file(state_dir / "run.log", bool(getattr(ctx.obj, "debug", False)))
        click.echo(f"the run in {state_dir} ended already: its summary (another --state-dir "
                   f"runs the workflow again)", err=True)
        finish(ctx, ended_report(state_dir, theirs, outputs, base), report)
    from elasticslice.config import load_config
    from elasticslice.pilots.restart import write_json
    from elasticslice.pilots.daemon import DaemonCommand
    from elasticslice.pilots.workload import WorkloadCluster
    config_path = getattr(ctx.obj, "config_path", None)
    # the settings only: the CloudLab credentials are the manager daemon's to open
    client = load_config(config_path, open_files=False)
    if cms:
        settings["cm"] = list(cms)     # the daemon resolves them as this does
    chosen = resolve_settings(client, settings, max_nodes)  # bad values: exit 2, no node
    debug = bool(getattr(ctx.obj, "debug", False))
    command = DaemonCommand(str(client.path) if config_path is not None else None,
                            settings, max_nodes=max_nodes, adopt=adopt,
                            connect_timeout=connect_timeout, debug=debug)
    cluster = WorkloadCluster(command, state_dir, listen=chosen.listen,
                              scheduler_port=chosen.scheduler_port, keep=keep,
                              metrics=chosen.metrics_port is not None)
    try:  # the daemon checks the config and the slice (or --adopt): else nothing is made
        cluster.attach()
    except ElasticSliceError as err:
        if getattr(err, "status", 1) == 2:
            raise BadUsage(str(err)) from err
        raise
    try:
        outputs.open()    # a bad --output-dir is said before any node is taken
    except TroyError as err:
        cluster.close(keep=True, resume=True)
        raise BadUsage(str(err)) from err
    log_to_file(state_dir / "run.log", debug)
    log.info("settings: %s", ", ".join(f"{name} {getattr(chosen, name)!r} ({source})"
                                       for name, source in chosen.sources.items()))
    started = time.time()
    data: dict[str, Any] | None = None
    interrupted, timed_out = False, ""
    signal.signal(signal.SIGTERM, _terminated)
    watch = SiteWatch(state_dir)
    try:
        cluster.start()
        if cluster.metrics_url:
            click.echo(f"metrics: {cluster.metrics_url}", err=True)
        workload = the_workload(cluster.session, workload)
        if theirs is None:
            write_json(state_dir / RUN_FILE, {**mine, "started": started})
        else:
            started = float(theirs.get("started", started))
        if cluster.resumed:
            click.echo(f"resuming the run in {state_dir} (restart {cluster.restarts}; "
                       f"scheduler {cluster.framework.scheduler_address})", err=True)
        outputs.watch(workload)           # before any task can end
        import troy
        run = troy.WorkloadRun(cluster.session, workload, cluster.overlay(),
                               name="run-workload", events=False).start()
        follow(cluster, run, timeout, watch.counts)
        data = make_report(workload, time.time() - started, cluster.stats(), outputs, base)
        data["sites"] = watch.counts()   # nodes and revocations per CM
        data["node_failures"] = [f.to_json() for f in cluster.failures.all()]
        from elasticslice.pilots.timeline import run_timeline
        data["timeline"] = run_timeline(cluster, started)   # what troy plot marks
    except KeyboardInterrupt:
        interrupted = True
        raise
    except Stopped as err:
        timed_out = str(err)
    except TroyError as err:   # one line, as ours
        raise ElasticSliceError(str(err)) from err
    finally:
        watch.close()
        held = close_cluster(cluster, data is not None, keep, release)
        if interrupted:
            click.echo(stop_line("interrupted", state_dir, held, release), err=True)
        elif data is None and not timed_out and held:   # an error: its line comes next
            click.echo(stop_line("stopped by the error below", state_dir, held, release),
                       err=True)
    if timed_out:
        raise click.ClickException(stop_line(timed_out, state_dir, held, release))
    if not keep:  # the nodes went back: a rerun only tells how it ended
        write_json(state_dir / RUN_FILE, {**mine, "started": started, "ended": time.time(),
                                          "stats": data["stats"],
                                          "nodes_peak": data["nodes_peak"]})
    finish(ctx, data, report)


def finish(ctx: click.Context, data: dict[str, Any], report: str | None) -> None:
    """The report file, the summary line, the exit status."""
    if report:
        write_report(report, data)
    click.echo(summary(data))
    ctx.exit(0 if data["state"] == "DONE" else 1)


def register(group: click.Group) -> None:
    group.add_command(run_cmd)
