"""The ``troy`` command line: ``troy run FILE`` runs a workload file to the end.

Errors of ours (``TroyError``: a bad file, an unknown scheduler, an unreachable Dask
scheduler) become one line and a non-zero exit, never a traceback; so does anything
unexpected (the traceback only with ``--debug``).
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any

import click

from troy.clickutil import OneLineErrors
from troy.errors import BadParameter, TroyError, UsageError
from troy.estimate import estimate
from troy.limits import MAX_PILOT_CORES, MAX_PILOTS
from troy.order import ORDERS
from troy.plot import plot_cmd
from troy.progress import show_progress
from troy.report import build_report
from troy.runs import run_numbers_problem

log = logging.getLogger("troy")


class FriendlyGroup(OneLineErrors):
    """Turns exceptions into one-line messages (usage errors too: no usage block)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except UsageError as err:  # bad usage: exit 2, as click's own usage errors
            raise click.UsageError(str(err)) from err
        except TroyError as err:
            raise click.ClickException(str(err)) from err
        except KeyboardInterrupt:
            raise click.exceptions.Exit(130)
        except Exception as err:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            raise click.ClickException(f"internal error: {type(err).__name__}: {err} "
                                       f"(rerun with --debug for details)") from err


@click.group(cls=FriendlyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Log everything; show tracebacks.")
@click.version_option(package_name="elasticslice", prog_name="troy")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Troy: run workloads of tasks on pilots (local processes or Dask).

    'troy run --help' lists the options of a run and their defaults."""
    ctx.obj = {"debug": debug}
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def parse_pilots(spec: str | None) -> tuple[int, int]:
    """``COUNTxCORES`` (``4x2``) or ``CORES`` (one pilot); default one pilot of all cores."""
    if spec is None:
        return 1, os.cpu_count() or 1
    m = re.fullmatch(r"\s*(?:(\d+)\s*[xX*]\s*)?(\d+)\s*", spec)
    if not m or int(m.group(2)) < 1 or (m.group(1) is not None and int(m.group(1)) < 1):
        raise UsageError(f"--pilots {spec!r}: expected COUNTxCORES such as 4x2")
    count, cores = int(m.group(1) or 1), int(m.group(2))
    if count > MAX_PILOTS:
        raise UsageError(f"--pilots {spec!r}: {count} pilots is more than the limit of "
                         f"{MAX_PILOTS}")
    if cores > MAX_PILOT_CORES:
        raise UsageError(f"--pilots {spec!r}: {cores} cores per pilot is more than the "
                         f"limit of {MAX_PILOT_CORES}")
    return count, cores


@cli.command("status")
@click.argument("store", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def status_cmd(store: str, as_json: bool) -> None:
    """Show the progress of a run from its STORE (troy run --store STORE): per workload,
    tasks done, running, failed and pending, when it started and its last update."""
    from troy.status import format_status, read_status, status_json
    workloads = read_status(store)
    click.echo(json.dumps(status_json(store, workloads), indent=1) if as_json
               else format_status(store, workloads))


@cli.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--framework", type=click.Choice(["local", "dask"]), default="local",
              show_default=True, help="Pilot framework running the units.")
@click.option("--pilots", metavar="COUNTxCORES", default=None,
              help=f"Pilots to start, e.g. 4x2 (default: one pilot with every core; at "
                   f"most {MAX_PILOTS} pilots of {MAX_PILOT_CORES} cores).")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="WfFormat files: multiply recorded runtimes by this.")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="Write a JSON report (per task: pilot, state, start, end, output "
                   "files) here.")
@click.option("--output-dir", type=click.Path(file_okay=False), default=None,
              help="Keep each task's stdout and stderr (the last 64 KiB of each) here "
                   "(default: beside the report, REPORT.json -> REPORT-output/; without "
                   "--report ./troy-out/WORKLOAD/).")
@click.option("--scheduler", default=None,
              help="Troy scheduler: backfill, first_fit, round_robin or seed003 "
                   "(default: backfill).")
@click.option("--order", type=click.Choice(ORDERS), default=None, metavar="ORDER",
              help="The order ready tasks are started in: longest_first (the longest "
                   "runtime first, the others as they came; the default) or fifo (as "
                   "they came).")
@click.option("--no-bundle", is_flag=True,
              help="One unit per task (default: short tasks are bundled into units).")
@click.option("--dask-scheduler", "dask_address", default=None, metavar="URL",
              help="Attach to this Dask scheduler (dask://host:port) instead of starting one.")
@click.option("--timeout", type=float, default=None,
              help="Give up after this many seconds, connecting to a Dask scheduler "
                   "included (default: no limit).")
@click.option("--store", type=click.Path(dir_okay=False), default=None,
              help="Keep the run's unit states in this SQLite file; run again with the "
                   "same file to resume (finished tasks are not run again).")
def run_cmd(file: str, store: str | None, framework: str, pilots: str | None,
            time_scale: float,
            report: str | None, scheduler: str | None, order: str | None, no_bundle: bool,
            dask_address: str | None, timeout: float | None,
            output_dir: str | None) -> None:
    """Run the workload in FILE (Troy JSON or a WfFormat instance) and summarise it.

    Progress goes to stderr (a bar on a terminal), a summary line to stdout; the exit
    status is 0 when every task is DONE, 1 otherwise (2: bad usage)."""
    import troy
    from troy.output import OutputKeeper, default_output_dir, last_lines
    from troy.workload.files import load_workload
    from troy.resume import prepare, resume_line, run_session

    deadline = None if timeout is None else time.monotonic() + timeout

    count, cores = parse_pilots(pilots)
    problem = run_numbers_problem(time_scale, timeout)
    if problem:
        raise UsageError(problem)
    if store and not os.path.isdir(os.path.dirname(os.path.abspath(store))):
        raise UsageError(f"--store {store}: no directory "
                         f"{os.path.dirname(os.path.abspath(store))}")
    if scheduler:
        from troy.schedulers import get_scheduler
        try:
            get_scheduler(scheduler)
        except BadParameter as err:
            raise UsageError(f"--scheduler: {err}") from None
    if report and not os.path.isdir(os.path.dirname(os.path.abspath(report))):
        raise UsageError(f"--report {report}: no directory "
                         f"{os.path.dirname(os.path.abspath(report))}")
    options: dict[str, Any] = {}
    if framework == "dask" and dask_address:
        from troy.frameworks.dask.address import scheduler_url
        try:
            options["scheduler_address"] = scheduler_url(dask_address)
        except BadParameter as err:
            raise UsageError(f"--dask-scheduler: {err}") from None
        if timeout is not None:  # connecting counts against --timeout too
            options["connect_timeout"] = min(timeout, 15.0)
    elif dask_address:
        raise UsageError("--dask-scheduler needs --framework dask")
    workload = load_workload(file, time_scale=time_scale, max_cores=cores)
    outputs = OutputKeeper(output_dir or default_output_dir(file, report))
    if framework == "dask" and not click.get_current_context().find_root().obj.get("debug"):
        from troy.frameworks.dask.processes import silence_dask
        silence_dask()
    manager: dict[str, Any] = {}
    if scheduler:
        from troy.schedulers import get_scheduler
        get_scheduler(scheduler)  # a bad name is said before the run (and its estimate)
        manager["scheduler"] = scheduler
    if no_bundle:
        manager["bundle"] = False
    config = {key: value for key, value in (("scheduler", scheduler), ("order", order))
              if value}
    with run_session(store, config) as session:
        resumed = prepare(session, store, file, workload, time_scale) if store else None
        if resumed is not None:  # the store's workload, its unfinished units queued
            workload = resumed
            click.echo(resume_line(workload), err=True)
        else:  # expand cardinality first: progress counts (and watches) the tasks to run
            troy.Planner(session).plan(workload)
        total = len(workload.tasks)
        wide = max(workload.tasks.values(), key=lambda t: t.description.cores)
        if wide.description.cores > cores:  # it would wait for a pilot that never comes
            raise UsageError(f"{file}: task {wide.id!r} needs {wide.description.cores} "
                               f"cores; the pilots have {cores} ("
                               f"{'--pilots ' + pilots if pilots else 'this machine; see --pilots'})")
        outputs.open().watch(workload)  # (a bad --output-dir is said before the estimate)
        session.add_framework(framework, name=framework, **options)
        # once the pilots' framework is up: a scheduler that cannot be reached is one line
        click.echo(estimate(workload, count * cores).line(), err=True)
        overlay = troy.Overlay([{"size": cores, "framework": framework}] * count)
        left = None if deadline is None else max(0.001, deadline - time.monotonic())
        started = time.time()
        run = troy.WorkloadRun(session, workload, overlay, timeout=left, **manager).start()
        show_progress(run.events(), total)
        overlay.cancel()
        state = run.result()  # what the run raised, raised here
        data = build_report(workload, state, time.time() - started, outputs=outputs,
                            started=started,
                            base=os.path.dirname(os.path.abspath(report)) if report else None)
    if report:
        try:
            with open(report, "w") as f:
                json.dump(data, f, indent=1)
        except OSError as err:
            raise TroyError(f"{report}: cannot write the report: {err.strerror or err}") \
                from err
    click.echo(f"{data['state']}: {data['tasks_done']}/{data['tasks_total']} tasks done, "
               f"{data['tasks_failed']} failed, {data['tasks_canceled']} canceled; "
               f"{data['units_total']} units; makespan {data['makespan_s']:.3f} s; "
               f"{data['units_per_s']:.1f} units/s")
    failed = [e for e in data["tasks"] if e["state"] == "FAILED"]
    for e in failed[:3]:  # why, for the first few (all of them are in the report)
        click.echo(f"task {e['task']} FAILED: {(e['error'] or 'no reason given').strip()}",
                   err=True)
        for line in last_lines(outputs.files(e["task"]).stderr):  # its own words
            click.echo(f"  | {line}", err=True)
    if len(failed) > 3:
        click.echo(f"... and {len(failed) - 3} more failed task(s)"
                   f"{' (see ' + report + ')' if report else ''}", err=True)
    if data["state"] != "DONE":
        sys.exit(1)


cli.add_command(plot_cmd)  # troy plot REPORT -o PNG (troy/plot.py)


def main() -> None:
    cli(prog_name="troy")


if __name__ == "__main__":
    main()
