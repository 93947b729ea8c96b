"""``elasticslice demo`` (also ``make demo`` and ``bin/demo``: the same code).

The default is the elastic demo (``elasticslice/demo/elastic.py``): every node a pilot, the
workload's demand sizing the slice, a revocation mid-run drained and released early.
``--static`` runs the single-machine walkthrough (``elasticslice/demo/static.py``).
A bad option is one line and exit 2; a failure one line and exit 1; Ctrl-C exit 130; in
every case whatever the demo started is stopped first.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import click

from elasticslice.demo.console import Console, DemoError
from elasticslice.demo.elastic import DEFAULT_WORKLOAD, ElasticDemo, ElasticOptions
from elasticslice.demo.report import check_report_path
from elasticslice.demo.runner import run_demo, static_summary

STATIC_ONLY = ("nodes", "add_nodes", "hardware_type", "framework")
ELASTIC_ONLY = ("emulator_dir", "nodes_min", "nodes_max", "node_cores", "pool", "notice",
                "margin", "revocations", "idle_timeout", "report", "sites")
DEFAULTS = {"time_scale": (1.0, 0.1), "timeout": (240.0, 60.0)}   # (elastic, static)


class OneLineUsageError(click.UsageError):
    """A bad option: one line on stderr (no usage block), exit 2."""

    def show(self, file: TextIO | None = None) -> None:
        (file or sys.stderr).write(f"demo: {self.format_message()} (see --help)\n")


class DemoCommand(click.Command):
    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as err:
            raise OneLineUsageError(err.format_message(), ctx=err.ctx) from err


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_mode(ctx: click.Context, static: bool) -> None:
    """Options of the other mode are refused, not ignored."""
    wrong, why = (ELASTIC_ONLY, "not with --static") if static else \
        (STATIC_ONLY, "only with --static")
    for name in wrong:
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            raise OneLineUsageError(f"{_flag(name)}: {why}", ctx=ctx)


@click.command("demo", cls=DemoCommand,
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("demo-run"), show_default=True,
              help="Demo directory (report.json, demo.log, the cluster's state, the "
                   "emulator unless --emulator-dir), recreated on every run. A non-empty "
                   "directory the demo did not make is refused.")
@click.option("--emulator-dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Use this emulator directory instead of a fresh one in "
                                 "DIR/emulator: if an emulator serves from it, the demo "
                                 "uses it as it is and leaves it running; else it is "
                                 "created if needed and started for the demo.")
@click.option("--workload", "--workflow", "workload",
              type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_WORKLOAD,
              show_default=str(DEFAULT_WORKLOAD.relative_to(DEFAULT_WORKLOAD.parents[2])),
              help="Workflow to run: a WfFormat instance (WfCommons) or Troy JSON.")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Multiply the workflow's recorded task runtimes by this "
                   "[default: 1 (the recorded runtimes); --static: 0.1].")
@click.option("--nodes-min", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Nodes the cluster always holds (the manager's minthreshold).")
@click.option("--nodes-max", type=click.IntRange(1, 16), default=4, show_default=True,
              help="Nodes the cluster may hold at most (maxthreshold); between the two, "
                   "the workload's demand decides.")
@click.option("--node-cores", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Cores of each emulated node (each node's pilot offers them).")
@click.option("--pool", type=click.IntRange(2, 64), default=8, show_default=True,
              help="Nodes in the emulated CloudLab (ours and the other tenants').")
@click.option("--notice", type=click.IntRange(1, 600), default=30, show_default=True,
              help="Seconds of notice a reclaimed node gets (the emulator's max wait): "
                   "its pilot drains within them, then the node is given back early.")
@click.option("--margin", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Drain safety margin: units not expected to end this many seconds "
                   "before the deadline are requeued at once.")
@click.option("--revocations", type=click.IntRange(0, 8), default=None,
              help="Nodes the other tenants take back mid-run, one at a time (0: none); "
                   "with --sites, at each site in turn [default: 1, one per site].")
@click.option("--sites", type=click.IntRange(1, 3), default=1, show_default=True,
              help="CloudLab clusters in the box, each a CM of its own behind one SA "
                   "(utah, wisc, clemson): the slice holds a sliver at each; the first "
                   "holds half of --nodes-max, so it fills and the slice grows at the next.")
@click.option("--idle-timeout", type=click.FloatRange(min=0), default=10.0,
              show_default=True, help="Seconds a pilot may idle before its node is given "
                                      "back (down to --nodes-min).")
@click.option("--boot-delay", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds an emulated node takes to boot.")
@click.option("--timeout", type=click.FloatRange(min=1), default=None,
              help="Give up when the workload is not done by then [default: 240; "
                   "--static: 60 per wait].")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the report (units_total, units_done, units_lost, "
                   "units_requeued, duplicates, revocations, early_releases, "
                   "forced_releases, nodes_peak, node_seconds, makespan_s, ...) to this "
                   "JSON file; DIR/report.json is always written.")
@click.option("--quiet", "-q", is_flag=True, help="Only the step lines, events and the "
                                                   "summary.")
@click.option("--static", is_flag=True,
              help="The single-machine walkthrough instead: CreateSliver, AddNodes, the "
                   "workflow on pilots of this machine sized to the nodes, DeleteSlice.")
@click.option("--nodes", type=click.IntRange(1, 16), default=2, show_default=True,
              help="--static: nodes in the first sliver (CreateSliver).")
@click.option("--add-nodes", type=click.IntRange(1, 16), default=2, show_default=True,
              help="--static: nodes added afterwards (AddNodes), then given back.")
@click.option("--hardware-type", default=None,
              help="--static: hardware type of every node (default: the inventory's, m510).")
@click.option("--framework", type=click.Choice(["local", "dask"]), default="local",
              show_default=True, help="--static: Troy pilot framework.")
@click.pass_context
def demo(ctx: click.Context, **o: Any) -> None:
    """Elastic Troy on CloudLab in a box, for real: every node a pilot.

    \b
    1. start the emulator (SA + CM over TLS, its own CA) in DIR/emulator
    2. start the elastic cluster: the manager, its CA, a Dask scheduler on TLS, Troy;
       every node it acquires boots a node agent that joins as a pilot
    3. run the workflow on the pilots while the workload's demand sizes the slice; other
       tenants take a node back mid-run: its pilot drains (nothing new goes there, units
       that cannot end in time run elsewhere) and the node is given back early
    4. stop everything and give the nodes back; a summary and DIR/report.json

    Live progress: nodes held, pilots, units queued/running/done, revocations (one
    updating line on a terminal, a line every few seconds on a pipe).
    """
    static = o.pop("static")
    check_mode(ctx, static)
    for key, (elastic_default, static_default) in DEFAULTS.items():
        if o[key] is None:
            o[key] = static_default if static else elastic_default
    if not o["workload"].is_file():
        raise OneLineUsageError(f"--workload {o['workload']}: no such file", ctx=ctx)
    console = Console(sys.stdout, quiet=o["quiet"], steps=5 if static else 4)
    if static:
        _static(o, console)
        return
    if o["revocations"] is None:
        o["revocations"] = o["sites"]
    options = ElasticOptions(**{k: v for k, v in o.items() if k not in STATIC_ONLY})
    try:
        check_report_path(options.report)
    except DemoError as err:
        raise OneLineUsageError(str(err), ctx=ctx) from err
    if options.nodes_min > options.nodes_max:
        raise OneLineUsageError(f"--nodes-min {options.nodes_min} is above --nodes-max "
                                f"{options.nodes_max}", ctx=ctx)
    result = run_demo(options.directory, lambda: ElasticDemo(options, console), console,
                      dask=True,
                      banner="elasticslice demo: elastic Troy on CloudLab in a box "
                             "(every node a pilot)")
    result.summary(console, [*filter(None, [options.directory / "report.json",
                                            options.report])],
                   options.directory / "demo.log")


def _static(o: dict[str, Any], console: Console) -> None:
    from elasticslice.demo.static import Demo, DemoOptions
    options = DemoOptions(directory=o["directory"], nodes=o["nodes"],
                          add_nodes=o["add_nodes"], hardware_type=o["hardware_type"],
                          framework=o["framework"], workflow=o["workload"],
                          time_scale=o["time_scale"], boot_delay=o["boot_delay"],
                          timeout=o["timeout"], quiet=o["quiet"])
    result = run_demo(options.directory, lambda: Demo(options, console), console,
                      dask=o["framework"] == "dask",
                      banner="elasticslice demo --static: CloudLab in a box + the "
                             "ProtoGENI client + Troy")
    static_summary(result, console)


def register(group: click.Group) -> None:
    group.add_command(demo)


def main() -> None:
    """``bin/demo``: the same command, standalone."""
    demo.main(prog_name="demo")

