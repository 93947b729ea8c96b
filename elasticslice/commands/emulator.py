"""`elasticslice emulator ...`: CloudLab in a box (init, serve, and admin commands).

The server (:mod:`elasticslice.emulator.app` and all it needs) is imported by the commands
that need it, when they run: `stop`, `status` and the other admin commands only call the
running server or read its directory.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import click

from elasticslice.commands.emulator_image import DIR_OPTION, image_group
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.emulator.daemon import (DEFAULT_LOG, STOP_TIMEOUT, start_background,
                                          stop_emulator)
from elasticslice.emulator.pressure import Pressure, parse_items
from elasticslice.emulator.pace import PROFILES
from elasticslice.emulator.setup import (DEFAULT_DOMAIN, DEFAULT_PROJECT, DEFAULT_USER,
                                         issue_user, load_config)
from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

CM_OPTION = click.option(
    "--cm", "cluster", default=None, metavar="NAME",
    help="In a box of several clusters (init --cm): the cluster's CM (default: the first).")


def _admin(directory: Path, cluster: str | None) -> AdminClient:
    """The admin client of the box's CM (``--cm``: that cluster's; checked against DIR)."""
    from elasticslice.emulator.clusters import pick
    chosen = pick(directory, cluster) if cluster is not None else None
    return AdminClient(directory, cluster=chosen.name if chosen is not None else None)


def _home(directory: Path, cluster: str | None) -> Path:
    """Where the CM's state and nodes are: DIR, or a cluster's DIR/cms/NAME."""
    from elasticslice.emulator.clusters import pick
    chosen = pick(directory, cluster)
    return chosen.home if chosen is not None else directory


@click.group("emulator")
def emulator() -> None:
    """CloudLab in a box: SA, CM v2 and dynamic slices over TLS, on 127.0.0.1.

    \b
    Quick start:
      elasticslice emulator init  --dir ~/emu
      elasticslice emulator serve --dir ~/emu --background
      elasticslice --config ~/emu/elasticslice.conf getversion
      elasticslice emulator stop  --dir ~/emu

    Admin commands (revoke, reboot, load, status) reach the server running on the same
    --dir; report and log read its directory and work offline too. Nodes are machines
    booted from an image (image add makes custom ones); serve --latency cloudlab keeps
    CloudLab's pace.
    """


emulator.add_command(image_group)


@emulator.command("init")
@DIR_OPTION
@click.option("--port", type=click.IntRange(0, 65535), default=12369, show_default=True,
              help="Port `serve` listens on (0: any free port, chosen at start).")
@click.option("--user", default=DEFAULT_USER, show_default=True, help="The user's login name.")
@click.option("--project", default=DEFAULT_PROJECT, show_default=True,
              help="Project of the slice (slice URNs are <domain>:<project>+slice+<name>).")
@click.option("--domain", default=DEFAULT_DOMAIN, show_default=True,
              help="Authority domain of every URN.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address `serve` listens on by default (also put in the server certificate).")
@click.option("--hostname", "hostnames", multiple=True,
              help="Extra DNS name for the server certificate (repeatable).")
@click.option("--force", is_flag=True, help="Start over in an existing emulator directory.")
@click.option("--cm", "clusters", multiple=True, metavar="NAME[=INVENTORY]",
              help="A cluster (a CM of its own) behind the one SA, as CloudLab's Utah and "
                   "Wisconsin (repeatable, in order: the client config lists them so). Built "
                   "in: utah, wisc, clemson, each with its own hardware types; another name "
                   "needs its inventory INI: --cm NAME=FILE. Without --cm: one CM.")
def init_cmd(directory: Path, port: int, user: str, project: str, domain: str, host: str,
             hostnames: tuple[str, ...], force: bool, clusters: tuple[str, ...]) -> None:
    """Create the CA, certificates, user.pem, password and elasticslice.conf in --dir.

    The client config works as is: `elasticslice --config DIR/elasticslice.conf ...`.
    Refuses an existing emulator directory unless --force (which wipes its state).

    \b
    Several clusters (docs/emulator.md, "Several clusters"):
      elasticslice emulator init --dir ~/emu --cm utah --cm wisc
    Each cluster NAME is a CM with its own URN (NAME.<domain>), nodes, node network,
    dynamic-slice server and reclaimer, at https://HOST:PORT/cluster/NAME/protogeni/xmlrpc/.
    """
    from elasticslice.emulator import init_emulator
    d = init_emulator(directory, port, user=user, project=project, domain=domain, host=host,
                      hostnames=hostnames, force=force, clusters=clusters)
    click.echo(f"emulator initialised in {d}")
    if clusters:
        names = [c.partition("=")[0] for c in clusters]
        click.echo(f"clusters: {', '.join(names)} (one SA, a CM each)")
    click.echo(f"client config: {d / 'elasticslice.conf'}")
    click.echo(f"next: elasticslice emulator serve --dir {d}")


@emulator.command("serve")
@DIR_OPTION
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Listen port (default: the one given to init; 0: any free port). The "
                   "client config is rewritten with the real port.")
@click.option("--host", default=None, help="Listen address (default 127.0.0.1).")
@click.option("--inventory", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Node inventory INI (default: the built-in one, as etc/emulator-inventory.ini). "
                   "A box of several clusters has one per cluster, given at init (--cm).")
@click.option("--boot-delay", type=click.FloatRange(0), default=5.0, show_default=True,
              help="Seconds from allocation to ready.")
@click.option("--notify-interval", type=click.FloatRange(0.01), default=10.0,
              show_default=True, help="Seconds between NotifyDeletePending calls.")
@click.option("--max-wait", type=click.IntRange(0), default=60, show_default=True,
              help="Longest wait (s) before a reclaimed node is taken by force.")
@click.option("--fault-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of calls answering BUSY, 503 or slowly, and of boots failing.")
@click.option("--seed", type=int, default=None,
              help="Seed for faults, the tenant load, the pace and the mapper's draws.")
@click.option("--tenant-load", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Mean fraction of nodes other tenants want (0: off).")
@click.option("--tenant-interval", type=click.FloatRange(0.01), default=5.0, show_default=True,
              help="Seconds between changes of the tenant load.")
@click.option("--allow-remote-endpoints", is_flag=True,
              help="Accept client endpoints that are not on 127.0.0.1.")
@click.option("--slow", "slow", multiple=True, metavar="METHOD=SECONDS",
              help="Every call of METHOD waits SECONDS before it is carried out (e.g. "
                   "AddNodes=30, as CloudLab's CM; wisc/AddNodes=30: at cluster wisc only). "
                   "Repeatable.")
@click.option("--busy", "busy", multiple=True, metavar="METHOD=FRACTION",
              help="That share of METHOD's calls answer BUSY at once (e.g. AddNodes=0.5; "
                   "wisc/AddNodes=0.5: at cluster wisc only). Repeatable.")
@click.option("--latency", type=click.Choice(PROFILES), default="none", show_default=True,
              help="cloudlab: CreateSliver and AddNodes take 10-40 s, DeleteNodes 5-10 s, "
                   "boots 3-8 min (estimates, docs/emulator.md), each tarball URL the "
                   "sliver holds 1.2-1.5 s at each of those calls, times --time-scale.")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="Multiply the --latency cloudlab figures by this "
                                      "(0.01: minutes become seconds).")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Log there (appended), one line per request too, instead of on stderr. "
                   f"With --background the default is DIR/{DEFAULT_LOG}.")
@click.option("--background", "--daemon", "background", is_flag=True,
              help="Return once the emulator serves, leaving it running detached from the "
                   "terminal; `emulator stop --dir DIR` ends it.")
@click.pass_context
def serve_cmd(ctx: click.Context, directory: Path, port: int | None, host: str | None,
              inventory: str | None, boot_delay: float, notify_interval: float, max_wait: int,
              fault_rate: float, seed: int | None, tenant_load: float, tenant_interval: float,
              allow_remote_endpoints: bool, slow: tuple[str, ...], busy: tuple[str, ...],
              latency: str, time_scale: float,
              log_file: Path | None, background: bool) -> None:
    """Serve SA, CM v2, the dynamic-slice server and admin calls until Ctrl-C or SIGTERM
    (or, with --background, until `emulator stop`).

    URLs: https://HOST:PORT/protogeni/xmlrpc/{sa,cm,cm/2.0,dynslice}, on 127.0.0.1 unless
    --host (or init --host) says otherwise; client certificates from the emulator's CA only.
    State (slices, slivers, nodes) is kept in DIR/state.db across restarts; DIR/server.json
    names the URL and pid of the running server. One server per directory.

    Nodes are machines of their own: namespaces, a root from the image, and a network of
    their own at the manifest's addresses where this machine allows it (root, ip, nsenter,
    nft), this machine at the control address DIR/server.json names (control_address,
    100.64.0.1 for the first emulator) and writes into the client config as [pilots]
    listen. ELASTICSLICE_NODE_NETWORK=off: nodes share this machine's network
    (docs/emulator.md, "The node's network").
    """
    pressure = {"slow": parse_items(slow, "--slow"), "busy": parse_items(busy, "--busy")}
    if background:
        Pressure(**pressure)  # a bad method name is said here, not in the log
        _serve_in_background(ctx, directory, log_file or directory / DEFAULT_LOG)
        return
    with _logging_to(log_file, debug=_debug(ctx)):
        _serve(directory, port=port, host=host, inventory=inventory, boot_delay=boot_delay,
               notify_interval=notify_interval, max_wait=max_wait, fault_rate=fault_rate,
               seed=seed, tenant_load=tenant_load, tenant_interval=tenant_interval,
               allow_remote_endpoints=allow_remote_endpoints, latency=latency,
               time_scale=time_scale, **pressure)


def _debug(ctx: click.Context) -> bool:
    return bool(getattr(ctx.find_root().obj, "debug", False))


def _serve_in_background(ctx: click.Context, directory: Path, log_file: Path) -> None:
    """Start this same serve command detached (absolute paths, --log-file) and say where."""
    load_config(directory)  # not an emulator directory: said here, not in the log
    args = ["--debug"] if _debug(ctx) else []
    args += ["emulator", "serve"]
    command = ctx.command
    for param in command.params:
        value = ctx.params[param.name]  # type: ignore[index]
        if param.name in ("background", "log_file") or value is None or value is False:
            continue
        flag = param.opts[0]
        if param.name in ("directory", "inventory"):
            value = Path(value).resolve()
        if isinstance(value, tuple):  # a repeatable option (--slow, --busy)
            args += [a for v in value for a in (flag, str(v))]
            continue
        args += [flag] if value is True else [flag, str(value)]
    log_file = log_file.resolve()
    running = start_background(directory.resolve(), [*args, "--log-file", str(log_file)],
                               log_file)
    click.echo(f"emulator serving {running.url}/{{sa,cm,dynslice}} (pid {running.pid})")
    _echo_clusters(directory)
    click.echo(f"client config: {directory.resolve() / 'elasticslice.conf'}")
    click.echo(f"log: {log_file}")
    click.echo(f"stop with: elasticslice emulator stop --dir {directory}")


def _echo_clusters(directory: Path) -> None:
    """A line per cluster of a box of several CMs (``server.json``), none otherwise."""
    try:
        clusters = json.loads((directory / "server.json").read_text()).get("clusters") or {}
    except (OSError, ValueError, AttributeError):
        return
    for name, info in clusters.items():
        click.echo(f"  cluster {name}: {info.get('url')}/{{cm,dynslice}} "
                   f"({info.get('cm_urn')})")


@contextmanager
def _logging_to(log_file: Path | None, debug: bool) -> Iterator[None]:
    """With a log file: the root logger's records and the request log go there (not to
    stderr); without: requests are logged on stderr only under --debug."""
    from elasticslice.emulator.server import access
    root = logging.getLogger()
    handlers = list(root.handlers)
    handler: logging.Handler | None = None
    if log_file is not None:
        try:
            os.close(os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
            handler = logging.FileHandler(log_file, encoding="utf-8")
        except OSError as err:
            raise ElasticSliceError(f"--log-file {log_file}: {err.strerror or err}") from err
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s"))
        for h in handlers:
            root.removeHandler(h)
        root.addHandler(handler)
    access_handlers = [handler] if handler else (handlers if debug else [])
    for h in access_handlers:
        access.addHandler(h)
    access.setLevel(logging.INFO)
    try:
        yield
    finally:
        for h in access_handlers:
            access.removeHandler(h)
        if handler is not None:
            root.removeHandler(handler)
            handler.close()
            for h in handlers:
                root.addHandler(h)


def _serve(directory: Path, **options: object) -> None:
    from elasticslice.emulator import EmulatorServer
    server = EmulatorServer(directory, **options)  # type: ignore[arg-type]
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    server.start()
    try:
        click.echo(f"emulator serving {server.url}/{{sa,cm,dynslice}}", nl=True)
        _echo_clusters(directory)
        click.echo(f"client config: {server.config_path}")
        click.echo(f"stop with Ctrl-C or: elasticslice emulator stop --dir {directory}")
        sys.stdout.flush()
        while not done.wait(timeout=0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
        click.echo("emulator stopped")


@emulator.command("stop")
@DIR_OPTION
@click.option("--timeout", type=click.FloatRange(0), default=STOP_TIMEOUT, show_default=True,
              help="Seconds to wait for it to stop.")
def stop_cmd(directory: Path, timeout: float) -> None:
    """Stop the emulator serving --dir (SIGTERM to the pid it records; waits until it has
    stopped, its nodes' processes too). Exit 1 when none is running there."""
    load_config(directory)
    stopped = stop_emulator(directory, timeout)
    click.echo(f"emulator stopped (pid {stopped.pid}, {stopped.url or 'was starting'})")


@emulator.command("add-user")
@DIR_OPTION
@click.argument("uid")
def add_user_cmd(directory: Path, uid: str) -> None:
    """Issue one more user certificate from the emulator's CA, with its own client config.

    An ordinary user, like a second CloudLab account: it cannot act on anyone else's slice
    unless that slice's owner delegates a credential to it. Works with or without a running
    server (a server started later rewrites the config with its port).
    """
    files = issue_user(directory, uid)
    click.echo(f"user {files.urn}")
    click.echo(f"certificate and key: {files.pem} (passphrase in {files.password})")
    click.echo(f"client config: {files.config}")


@emulator.command("revoke")
@DIR_OPTION
@CM_OPTION
@click.argument("node_ids", nargs=-1, required=True)
def revoke_cmd(directory: Path, cluster: str | None, node_ids: tuple[str, ...]) -> None:
    """Take nodes back by NODE_ID (e.g. ms0101; see `status`, or the component_id of
    `sliver-status`).

    A slice that registered a client endpoint gets the NotifyDeletePending countdown; a
    node of any other slice is taken at once.
    """
    result = _admin(directory, cluster).call("Revoke", nodes=list(node_ids))
    for node_id, what in result.items():
        click.echo(f"{node_id}: {what}")


@emulator.command("reboot")
@DIR_OPTION
@CM_OPTION
@click.argument("node_ids", nargs=-1, required=True)
def reboot_cmd(directory: Path, cluster: str | None, node_ids: tuple[str, ...]) -> None:
    """Reboot nodes of slices by NODE_ID (e.g. ms0101), as CloudLab reboots a node.

    Every process of the node gets SIGTERM, then SIGKILL 3 s later; its disk and addresses
    stay. SliverStatus shows it notready (rawstate SHUTDOWN), then changing (BOOTING) for
    half its boot time, then ready; tarballs whose copy at the CM changed are installed
    again, then its startup command runs again, with a new runlog (`emulator log`).
    An unknown node, one not in a slice or one still booting is one line and exit 1,
    and then no node of the command reboots.
    """
    result = _admin(directory, cluster).call("Reboot", nodes=list(node_ids))
    for node_id, what in result.items():
        click.echo(f"{node_id}: {what}")


@emulator.command("log")
@DIR_OPTION
@CM_OPTION
@click.argument("node_id")
def log_cmd(directory: Path, cluster: str | None, node_id: str) -> None:
    """Print the runlog of node NODE_ID: what its last startup command printed, ending with
    `<command> returned <status>` (CloudLab's /var/emulab/logs/runlog.XXXXXX on the node).

    Reads DIR: works whether or not the server is running.
    """
    from elasticslice.emulator.nodefs import NODE_NAME, NodeDir
    from elasticslice.emulator.store import Store
    load_config(directory)
    home = _home(directory, cluster)
    if not NODE_NAME.fullmatch(node_id):
        raise ElasticSliceError(f"{node_id!r} is not a node id (e.g. ms0101)")
    if not (home / "state.db").exists():
        raise ElasticSliceError(f"{home}: no state yet (the emulator never ran here)")
    store = Store(home / "state.db").open()
    try:
        known = store.get_node(node_id) is not None
    finally:
        store.close()
    if not known:
        raise ElasticSliceError(f"no node {node_id} in {home}")
    text = NodeDir(home / "nodes" / node_id).runlog_text()
    if text is None:
        raise ElasticSliceError(f"node {node_id} has no runlog (no startup command has run "
                                "on it since it was given to its slice)")
    click.echo(text, nl=False)


@emulator.command("load")
@DIR_OPTION
@CM_OPTION
@click.option("--busy", type=click.IntRange(0, 1_000_000), required=True,
              help="How many nodes other tenants hold (reclaims from dynamic slices if needed).")
def load_cmd(directory: Path, cluster: str | None, busy: int) -> None:
    """Set how many nodes other tenants hold (free nodes first, then reclaimed from
    dynamic slices); --busy 0 gives every node back. Under `serve --tenant-load` the model
    moves the target again at its next step."""
    target = _admin(directory, cluster).call("SetLoad", busy=busy)
    click.echo(f"other tenants now want {target} nodes")


@emulator.command("status")
@DIR_OPTION
@CM_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def status_cmd(directory: Path, cluster: str | None, as_json: bool) -> None:
    """The running emulator's pool (free / in slices / other tenants) and slivers."""
    status = _admin(directory, cluster).call("Status")
    if as_json:
        click.echo(json.dumps(status, indent=2, sort_keys=True))
        return
    click.echo(f"{'type':8} {'free':>5} {'slice':>6} {'tenant':>7}")
    for hw, row in sorted(status["pool"].items()):
        click.echo(f"{hw:8} {row['free']:5d} {row['slice']:6d} {row['tenant']:7d}")
    for urn in status["slivers"]:
        click.echo(f"sliver of {urn}")
    if status["tenant_target"] >= 0:
        click.echo(f"other tenants want {status['tenant_target']} nodes")


@emulator.command("report")
@DIR_OPTION
@CM_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def report_cmd(directory: Path, cluster: str | None, as_json: bool) -> None:
    """Reclamations: node, slice, notified at, released at, forced or early.

    Reads DIR/state.db: works whether or not the server is running.
    """
    from elasticslice.emulator.admin import reclamation_report
    from elasticslice.emulator.store import Store
    load_config(directory)
    home = _home(directory, cluster)
    if not (home / "state.db").exists():
        raise ElasticSliceError(f"{home}: no state yet (the emulator never ran here)")
    store = Store(home / "state.db").open()
    try:
        events = reclamation_report(store)
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps({"reclamations": events}, indent=2))
        return
    if not events:
        click.echo("no reclamations")
    for e in events:
        click.echo(f"{e['node_id']:8} {e['client_id'] or '-':12} {e['reason']:7} "
                   f"notified {e['notified_at']} released {e['released_at'] or '-'} "
                   f"{e['outcome']} ({e['notifications']} notices)")


def register(group: click.Group) -> None:
    """Attach this module's commands to the top-level group."""
    group.add_command(emulator)
