"""`elasticslice run WORKFLOW --state-dir DIR`: a workflow on an elastic cluster, resumable.

    elasticslice -c C run examples/workflows/X.json --state-dir runs/x [--report r.json]

DIR holds the whole run (the cluster CA, the Troy store, the manager's state, ``cluster.json``
with the scheduler's address and the process id, ``run.json`` naming the workflow, the
run's counters and ``run.log``). Run the same command again after the process died, even of
a SIGKILL: it resumes (same scheduler port, the node agents rejoin, finished tasks are not
run again). Exit 0: every task DONE; 1: some did not end DONE, or an error; 2: bad usage;
130: interrupted.
"""
from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import click

from elasticslice.errors import ElasticSliceError

log = logging.getLogger("elasticslice.run")

TICK = 0.5          # seconds between two looks at the run
PROGRESS_EVERY = 5.0  # a progress line at least this often while something changes
RUN_FILE = "run.json"
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
    raise KeyboardInterrupt  # SIGTERM stops a run as Ctrl-C does: resumable, nodes tidy


def log_to_file(path: Path, debug: bool) -> None:
    """The details go to DIR/run.log; stderr keeps warnings, progress and the outcome."""
    from troy.cli import quiet_dask
    if not debug:
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.WARNING)
        quiet_dask()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)


def the_workload(session: Any, fresh: Any) -> tuple[Any, bool]:
    """The run's workload and whether it was dispatched before: the one the session
    resumed, else one the store holds (all its units final: rebuilt as it ended), else
    ``fresh`` (not dispatched yet)."""
    if session.workloads:
        return list(session.workloads.values())[-1], True
    for rec in reversed(session.store.workloads()):
        spec = session.store.workload_spec(rec["id"])
        if spec:
            from troy.workload.manager import WorkloadManager
            from troy.workload.recovery import resume_workload
            w, _ = resume_workload(WorkloadManager(session), rec["id"], spec,
                                   session.store.units(workload=rec["id"]))
            return w, True
    return fresh, False


def dispatch(cluster: Any, workload: Any) -> dict[str, Any]:
    """Run ``workload`` on the cluster's pilots (late binding) in a thread; the returned
    dict gets ``error`` if dispatching failed."""
    import troy
    outcome: dict[str, Any] = {}

    def execute() -> None:
        try:
            troy.execute_workload(cluster.session, workload, cluster.overlay(),
                                  bind_mode="late")
        except Exception as err:  # handed to the main thread
            outcome["error"] = err

    threading.Thread(target=execute, name="run-workload", daemon=True).start()
    return outcome


def progress_line(cluster: Any, workload: Any, elapsed: float) -> str:
    snap = cluster.snapshot()
    done = sum(1 for t in workload.tasks.values() if t.state.value == "DONE")
    return (f"[{elapsed:6.1f}s] tasks {done}/{len(workload.tasks)} done, "
            f"{snap.units_running} units running, {snap.units_queued} queued; "
            f"{snap.nodes_held} nodes, {snap.pilots} pilots")


def follow(cluster: Any, workload: Any, outcome: dict[str, Any],
           timeout: float | None) -> None:
    """Progress on stderr until every task is final; Stopped after ``timeout``."""
    started = time.monotonic()
    shown, shown_at = "", 0.0
    while not workload.finished:
        if "error" in outcome:
            raise outcome["error"]
        now = time.monotonic()
        if timeout is not None and now - started > timeout:
            raise Stopped(f"not finished within --timeout {timeout:g} s; run the same command "
                          f"again to resume")
        line = progress_line(cluster, workload, now - started)
        body = line.split("] ", 1)[1]
        if body != shown and now - shown_at >= PROGRESS_EVERY or not shown:
            click.echo(line, err=True)
            shown, shown_at = body, now
        time.sleep(TICK)
    click.echo(progress_line(cluster, workload, time.monotonic() - started), err=True)


def make_report(workload: Any, wall: float, stats: dict[str, Any]) -> dict[str, Any]:
    """``troy run``'s report of ``workload`` plus ``stats`` (the contract's names) and
    ``nodes_peak``, from the cluster's counters ``stats``."""
    from troy.cli import build_report
    data = build_report(workload, workload.state, wall)
    data["stats"] = {name: int(stats.get(key, 0)) for name, key in STATS.items()}
    data["nodes_peak"] = int(stats.get("nodes_peak", 0))
    return data


def ended_report(state_dir: Path, theirs: dict[str, Any]) -> dict[str, Any]:
    """The report of a run that ended already (from its store; no cluster, no node)."""
    import troy
    with troy.Session(state_dir / "troy.db") as session:
        workload, dispatched = the_workload(session, None)
        if not dispatched:
            raise ElasticSliceError(f"--state-dir {state_dir}: the run ended but its store "
                                    f"holds no workload")
        wall = float(theirs.get("ended", 0.0)) - float(theirs.get("started", 0.0))
        stats = {key: theirs.get("stats", {}).get(name, 0) for name, key in STATS.items()}
        return make_report(workload, wall, {**stats, "nodes_peak": theirs.get("nodes_peak", 0)})


def write_report(path: str, data: dict[str, Any]) -> None:
    from elasticslice.pilots.restart import write_json
    try:
        write_json(Path(path), data)
    except OSError as err:
        raise ElasticSliceError(f"--report {path}: cannot write: {err.strerror or err}") \
            from err


def summary(data: dict[str, Any]) -> str:
    s = data["stats"]
    return (f"{data['state']}: {data['tasks_done']}/{data['tasks_total']} tasks done, "
            f"{data['tasks_failed']} failed, {data['tasks_canceled']} canceled; "
            f"{data['nodes_peak']} nodes at most; {s['restarts']} restart(s), "
            f"{s['units_requeued']} units requeued, {s['units_lost']} lost")


def check_options(state_dir: Path | None, time_scale: float, timeout: float | None,
                  report: str | None) -> None:
    if state_dir is None:
        raise BadUsage("give --state-dir DIR: where the run lives (the same DIR resumes it)")
    from troy.cli import run_numbers_problem
    problem = run_numbers_problem(time_scale, timeout)
    if problem:
        raise BadUsage(problem)
    if report and not os.path.isdir(os.path.dirname(os.path.abspath(report))):
        raise BadUsage(f"--report {report}: no directory "
                       f"{os.path.dirname(os.path.abspath(report))}")


@click.command("run")
@click.argument("workflow", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--state-dir", default=None, type=click.Path(path_type=Path),
              help="Where the run lives (created); the same DIR again resumes it.")
@click.option("--max-nodes", type=click.IntRange(1, 1000), default=4, show_default=True,
              help="Hold at most this many nodes.")
@click.option("--hardware-type", default=None, help="Ask the CM for this node type.")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="WfFormat files: multiply recorded runtimes by this.")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Write a JSON report: the tasks, and 'stats' over the whole run.")
@click.option("--keep", is_flag=True, help="Leave the nodes held at the end.")
@click.option("--timeout", type=float, default=None,
              help="Stop after this many seconds (exit 1; run again to resume).")
@click.option("--adopt", is_flag=True,
              help="Work on the configured slice although this --state-dir did not create "
                   "it (another manage or run may be using it).")
@click.option("--connect-timeout", type=click.FloatRange(0.1), default=60.0,
              show_default=True, help="Fail, leaving nothing behind, when the SA or a CM "
                                      "does not answer within this many seconds.")
@click.pass_context
def run_cmd(ctx: click.Context, workflow: Path, state_dir: Path | None, max_nodes: int,
            hardware_type: str | None, time_scale: float, report: str | None, keep: bool,
            timeout: float | None, adopt: bool, connect_timeout: float) -> None:
    """Run WORKFLOW (Troy JSON or WfFormat) on an elastic cluster of the configured CM.

    The cluster grows to the workflow's demand (up to --max-nodes); every node runs a Troy
    pilot agent that joins this process' Dask scheduler over TLS. Progress goes to stderr,
    one summary line to stdout. DIR keeps everything: if this process dies (even of
    SIGKILL), the same command with the same --state-dir resumes the run: the nodes held
    are kept, their agents rejoin, tasks already DONE do not run again. The nodes are given
    back at the end unless --keep. Exit status: 0 every task DONE, 1 otherwise or on an
    error, 2 bad usage, 130 interrupted: Ctrl-C or SIGTERM (the run can be resumed)."""
    from troy.errors import TroyError
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
    if theirs is not None and theirs.get("ended"):
        log_to_file(state_dir / "run.log", bool(getattr(ctx.obj, "debug", False)))
        click.echo(f"the run in {state_dir} ended already: its summary (another --state-dir "
                   f"runs the workflow again)", err=True)
        finish(ctx, ended_report(state_dir, theirs), report)
    from elasticslice.config import load_config
    from elasticslice.pilots import ElasticCluster
    from elasticslice.pilots.restart import write_json
    from elasticslice.managers.ownership import preflight
    from elasticslice.rpc.client import ProtoGeniServer
    server = ProtoGeniServer(load_config(getattr(ctx.obj, "config_path", None)))
    try:  # the CM answers and the slice is ours (or --adopt): else nothing is made
        preflight(server, state_dir / "state", adopt=adopt, connect_timeout=connect_timeout)
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        server.close()
        raise ElasticSliceError(f"--state-dir {state_dir}: cannot make it: "
                                f"{err.strerror or err}") from err
    except BaseException:
        server.close()
        raise
    log_to_file(state_dir / "run.log", bool(getattr(ctx.obj, "debug", False)))
    cluster = ElasticCluster(server, state_dir, maxthreshold=max_nodes,
                             hardware_type=hardware_type, keep=keep,
                             manager_options={"adopt": adopt})
    started = time.time()
    ended = False
    signal.signal(signal.SIGTERM, _terminated)
    try:
        cluster.start()
        workload, dispatched = the_workload(cluster.session, workload)
        if theirs is None:
            write_json(state_dir / RUN_FILE, {**mine, "started": started})
        else:
            started = float(theirs.get("started", started))
        if cluster.resumed:
            click.echo(f"resuming the run in {state_dir} (restart {cluster.restarts}; "
                       f"scheduler {cluster.framework.scheduler_address})", err=True)
        outcome = {} if dispatched else dispatch(cluster, workload)
        follow(cluster, workload, outcome, timeout)
        data = make_report(workload, time.time() - started, cluster.stats())
        ended = True
    except KeyboardInterrupt:
        click.echo(f"interrupted: run the same command again to resume ({state_dir})",
                   err=True)
        raise
    finally:
        if not ended and cluster.session is not None:
            cluster.session.store.close()  # what was in flight is not recorded CANCELED
        cluster.close(keep=keep)
        cluster.server.close()
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
