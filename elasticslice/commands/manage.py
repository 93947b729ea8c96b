"""`elasticslice manage [--once]` (the manager daemon) and `elasticslice status [--json]`.

    elasticslice --config C manage          # foreground; SIGTERM/SIGINT stop it cleanly
    elasticslice --config C manage --once   # one full cycle, then exit
    elasticslice --config C status [--json] # slice, nodes, cycle (from the state directory)
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import signal
import threading
from typing import Any

import click

from elasticslice.config import load_config
from elasticslice.errors import ElasticSliceError
from elasticslice.managers.statedir import lock_state_dir

log = logging.getLogger("elasticslice.manage")


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_manager(config_path: str | None, *, endpoint: bool = True,
                  adopt: bool = False) -> Any:
    """The manager the `manage` command runs, from the config file's sections."""
    from elasticslice.managers import SimpleElasticSliceHelper, SimpleElasticSliceManager
    from elasticslice.managers.config import load_manager_config
    from elasticslice.rpc.client import ProtoGeniServer

    client = load_config(config_path)
    mcfg = load_manager_config(client.path)
    lock_state_dir(mcfg.state_dir)
    server = ProtoGeniServer(client)
    helper = SimpleElasticSliceHelper(
        server, mcfg, num_pcs=mcfg.num_pcs, image_urn=mcfg.image_urn, num_lans=mcfg.num_lans,
        multiplex_lans=mcfg.multiplex_lans, tarballs=list(mcfg.tarballs),
        startup_command=mcfg.startup_command, nodetype=mcfg.nodetype,
        node_prefix=mcfg.node_prefix, lan_prefix=mcfg.lan_prefix)
    extra: dict[str, Any] = {"adopt": adopt} if endpoint else {"endpoint": None, "adopt": adopt}
    return SimpleElasticSliceManager.from_config(server, mcfg, helper=helper, **extra)


def serve_manager_metrics(manager: Any) -> Any:
    """The metrics endpoint ``[manager] metrics_port`` asks for (None: off, or it cannot
    listen: one line says why and the daemon runs on)."""
    from elasticslice.metrics import MetricsError, serve_metrics
    port = getattr(manager.config, "metrics_port", None)
    if port is None:
        return None
    try:
        metrics = serve_metrics(manager, port=port)
    except MetricsError as err:
        click.echo(f"warning: {err}: no metrics endpoint", err=True)
        return None
    click.echo(f"metrics: {metrics.url}", err=True)
    return metrics


@click.command("manage")
@click.option("--once", is_flag=True, default=False,
              help="Run one full cycle (every method once, in order) and exit.")
@click.option("--adopt", is_flag=True, default=False,
              help="Manage the configured slice although this state_dir did not create it "
                   "and it holds a sliver (another manage or run may be using it); a slice "
                   "that holds none needs no --adopt.")
@click.pass_context
def manage_cmd(ctx: click.Context, once: bool, adopt: bool) -> None:
    """Run the elastic slice manager in the foreground.

    Keeps the slice and its slivers alive, grows the slice while CloudLab has spare nodes
    (up to maxthreshold), gives nodes back when told (or when enable_delete and CloudLab
    runs short), and answers CloudLab's callbacks on the [endpoint]. SIGTERM or SIGINT stop
    it cleanly: the endpoint is removed at every CM and the state is flushed. A slice
    this state_dir did not create is refused while it holds a sliver, unless --adopt.
    """
    manager = build_manager(ctx.obj.config_path, endpoint=not once, adopt=adopt)
    try:
        if once:
            errors = {k: v for k, v in manager.manage_once().items() if v}
            if errors:
                raise click.ClickException(
                    f"{len(errors)} method(s) failed: " +
                    "; ".join(f"{k}: {v}" for k, v in errors.items()))
            return
        stopping = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            if not stopping.is_set():
                log.info("%s: stopping", signal.Signals(signum).name)
            stopping.set()
            manager.stop_requested()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        metrics = serve_manager_metrics(manager)
        try:
            manager.manage()
        finally:
            if metrics is not None:
                metrics.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
        log.info("manager stopped")
    finally:
        manager.close()
        manager.server.close()


def status_data(state: Any) -> dict[str, Any]:
    """The `status --json` document: {"slice": {...}, "nodes": [...], "to_release":
    [...], "cycle": {...}}; ``to_release``: the nodes asked to be given back that the
    manager's ``release_nodes`` has not given back yet, oldest first, each with why."""
    record = state.slice()
    slivers = [{"cm": s.cm, "urn": s.urn, "expires": _iso(s.expires), "status": s.status}
               for s in state.slivers()]
    pending = {p.node_id: p for p in state.pending_deletes() if not p.finished}
    nodes = []
    for n in state.nodes():
        p = pending.get(n.node_id or "")
        deadline = n.pending_deadline if n.pending_deadline is not None else (
            p.deadline if p else None)
        nodes.append({"cm": n.cm, "client_id": n.client_id, "node_id": n.node_id,
                      "hostname": n.hostname, "state": n.state, "initial": bool(n.initial),
                      "added_at": _iso(n.added_at), "value": n.value,
                      "pending_delete": ({"deadline": _iso(deadline)}
                                         if deadline is not None else None)})
    cycle = {}
    for method, c in sorted(state.cycle_log.records().items()):
        cycle[method] = {"last_run": _iso(c.last_run), "last_ok": _iso(c.last_ok),
                         "next_run": _iso(c.next_run), "last_error": c.last_error,
                         "failures": c.failures}
    to_release = [{"cm": r.cm, "client_id": r.client_id, "node_id": r.node_id,
                   "source": r.source, "reason": r.reason, "asked": _iso(r.asked)}
                  for r in state.to_release.rows()]
    return {"slice": {"urn": record.urn if record else None,
                      "expires": _iso(record.expires) if record else None,
                      "slivers": slivers},
            "nodes": nodes, "to_release": to_release, "cycle": cycle,
            "sites": sites_data(state)}


def sites_data(state: Any) -> dict[str, dict[str, Any]]:
    """Per CM (by its short name): :func:`~elasticslice.managers.sites.site_counts`."""
    from elasticslice.managers.sites import site_counts
    return site_counts(state)


def _print_status(data: dict[str, Any]) -> None:
    from elasticslice.managers.sites import cm_name, sites_line
    s, sites = data["slice"], data.get("sites") or {}
    several = len(sites) > 1   # a slice over several CMs: each line names its CM
    click.echo(f"slice   {s['urn'] or '(none yet)'}  expires {s['expires'] or '-'}")
    for sl in s["slivers"]:
        site = f"{cm_name(sl['cm'])}  " if several else ""
        click.echo(f"sliver  {site}{sl['cm']}  expires {sl['expires'] or '-'}  "
                   f"{sl['status'] or ''}")
    click.echo(f"nodes   {len(data['nodes'])}" + (f"  {sites_line(sites)}" if several else ""))
    for n in data["nodes"]:
        pend = n["pending_delete"]
        extra = f"  PENDING DELETE by {pend['deadline']}" if pend else ""
        value = "" if n["value"] is None else f"  value {n['value']:.2f}"
        site = f"{cm_name(n['cm']):<8} " if several else ""
        click.echo(f"  {site}{n['client_id']:<16} {n['node_id'] or '-':<10} {n['state']:<9}"
                   f" {n['hostname'] or ''}{value}{extra}")
    for name, site in sites.items():
        for method, f in sorted((site.get("failing") or {}).items()):
            retry = "next run" if f["retry_at"] is None else _iso(f["retry_at"])
            click.echo(f"failing {name}  {method} ({f['failures']}x, retry {retry}): "
                       f"{f['last_error']}")
    if data["to_release"]:
        click.echo(f"to give back {len(data['to_release'])}")
    for r in data["to_release"]:
        click.echo(f"  {r['client_id']:<16} {r['node_id'] or '-':<10} asked {r['asked']}"
                   f" ({r['source']}): {r['reason']}")
    click.echo("cycle")
    for method, c in data["cycle"].items():
        err = f"  ERROR ({c['failures']}x): {c['last_error']}" if c["last_error"] else ""
        click.echo(f"  {method:<22} last {c['last_run'] or '-'}  next {c['next_run'] or '-'}"
                   f"{err}")


@click.command("status")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print JSON.")
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show the manager's view: slice and sliver expiry, nodes, the nodes asked to be given
    back and not yet gone, and the cycle's methods (last run, next run, last error). Reads the state directory; the daemon may or may
    not be running."""
    from elasticslice.managers.config import load_manager_config
    from elasticslice.managers.state import ManagerState

    client = load_config(ctx.obj.config_path)
    mcfg = load_manager_config(client.path)
    if not (mcfg.state_dir / "manager.db").exists():
        raise ElasticSliceError(f"{mcfg.state_dir}: no manager state yet (run "
                                f"`elasticslice manage` first; [manager] state_dir)")
    state = ManagerState.read_only(mcfg.state_dir)
    try:
        data = status_data(state)
    finally:
        state.close()
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        _print_status(data)


def register(group: click.Group) -> None:
    group.add_command(manage_cmd)
    group.add_command(status_cmd)
