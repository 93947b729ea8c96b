"""`elasticslice` client commands: talk to CloudLab (or the emulator) as the configured user.

    elasticslice --config C getversion | create-slice | create-sliver RSPEC
        | sliver-status [--json] [--wait] | add-nodes N [--hardware-type T] [--wait]
        | delete-nodes CLIENT_ID... | renew --hours H | discover [--available] [--json]
        | resolve | delete-slice [--cancel] [--blocking] | nodes [--json] | manifest

(``nodes`` and ``manifest`` live in :mod:`elasticslice.commands.nodes`; ``--wait`` in
:mod:`elasticslice.commands.waiting`.) The RSpec package (lxml, the schemas) is imported by
the commands that read or write an RSpec, when they run: most of these commands need none.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import click

from elasticslice.commands.waiting import check_wait_options, wait_options, wait_ready
from elasticslice.config import ClientConfig, load_config
from elasticslice.errors import RPCError, RSpecError
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.cm import SliverStatus

CM_OPTION_HELP = ("Which CM (a substring of its host or URL, or its index in cm_urls). "
                  "Default: the first.")


def _config(ctx: click.Context) -> ClientConfig:
    return load_config(getattr(ctx.obj, "config_path", None))


def _server(ctx: click.Context) -> ProtoGeniServer:
    server = ProtoGeniServer(_config(ctx))
    ctx.call_on_close(server.close)
    return server


class _SliceCommand(click.Command):
    """A command that needs the slice: when the SA has no such slice, say how to make it."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RPCError as err:
            if err.code == GeniCode.SEARCHFAILED and err.method == "GetCredential":
                raise click.ClickException(
                    f"{err} (is the slice registered? `elasticslice create-slice`)") from err
            raise


def _which(cm: str | None) -> int | str | None:
    return int(cm) if cm is not None and cm.isdigit() else cm


def _cm_option(f: Any) -> Any:
    return click.option("--cm", "cm", default=None, metavar="CM", help=CM_OPTION_HELP)(f)


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


MAX_HOURS = 24 * 365


class Hours(click.ParamType):
    """A lifetime in hours: a finite number from 0.1 to a year (timedelta overflows, and NaN
    passes click's range checks)."""

    name = "hours"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            hours = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of hours", param, ctx)
        if not 0.1 <= hours <= MAX_HOURS:  # also refuses nan
            self.fail(f"{value!r} is not between 0.1 and {MAX_HOURS} hours", param, ctx)
        return hours


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def register(group: click.Group) -> None:
    """Attach this module's commands to the top-level group."""
    # (imported here: the nodes module builds on this one's helpers)
    from elasticslice.commands.nodes import manifest, nodes
    for command in (getversion, create_slice, create_sliver, sliver_status, add_nodes,
                    delete_nodes, renew, discover, resolve, delete_slice, nodes, manifest):
        group.add_command(command)


@click.command("getversion")
@_cm_option
@click.pass_context
def getversion(ctx: click.Context, cm: str | None) -> None:
    """Show the SA's and the CM's GetVersion answers (checks TLS and the certificate)."""
    server = _server(ctx)
    _emit({"sa": {"url": server.sa_url, "version": server.get_version()},
           "cm": {"url": server.cm(_which(cm)).url,
                  "version": server.cm(_which(cm)).get_version()}})


@click.command("create-slice")
@click.option("--hours", type=Hours(), default=None,
              help="Slice lifetime in hours, 0.1 to 8760 (default: the SA's default).")
@click.pass_context
def create_slice(ctx: click.Context, hours: float | None) -> None:
    """Register the configured slice (slice_name, project) at the SA."""
    server = _server(ctx)
    expiration = _now() + dt.timedelta(hours=hours) if hours else None
    server.register_slice(expiration=expiration)
    click.echo(f"slice {server.slice_urn()} registered")


def _read_rspec(path: str) -> str:
    """The file's text; at most one byte over the parser's size limit is read, so that an
    oversize file is refused by the parser without being read whole."""
    from elasticslice.rspec.safexml import DEFAULT_MAX_BYTES as RSPEC_MAX_BYTES
    try:
        with open(path, "rb") as handle:
            data = handle.read(RSPEC_MAX_BYTES + 1)
        return data.decode("utf-8")
    except OSError as err:
        raise RSpecError(f"cannot read: {err.strerror or err}", source=path) from err
    except UnicodeDecodeError as err:
        raise RSpecError(f"not UTF-8 text (byte {err.start})", source=path) from err


@click.command("create-sliver", cls=_SliceCommand)
@click.argument("rspec", type=click.Path(dir_okay=False, exists=True))
@_cm_option
@wait_options
@click.pass_context
def create_sliver(ctx: click.Context, rspec: str, cm: str | None, wait: bool,
                  timeout: float | None) -> None:
    """Allocate the resources of request RSPEC (a file) in the slice at a CM.

    The RSpec is checked first (a request, with nodes, valid against request.xsd when
    GENI v3). Your SSH keys come from the SA. The slice must exist (`create-slice`).
    Nodes boot in the background; watch them with `sliver-status`, or --wait.
    """
    check_wait_options(wait, timeout)
    text = _read_rspec(rspec)
    _check_rspec(text, rspec)
    server = _server(ctx)
    _, manifest = server.create_sliver(text, cm=_which(cm))
    nodes = re.findall(r"<(?:\w+:)?node\b", manifest)
    click.echo(f"sliver created at {server.cm(_which(cm)).host}: {len(nodes)} node(s) "
               f"booting; see `elasticslice sliver-status`")
    if wait:
        status = wait_ready(server, _which(cm), timeout)
        click.echo(f"{len(status.nodes)} node(s) ready; `elasticslice nodes` shows how to "
                   f"log in")


def _check_rspec(text: str, source: str) -> None:
    """Refuse, before sending it, an RSpec that is unreadable, hostile, not a request, empty,
    with a node client_id the CM refuses, or (GENI v3) not valid against request.xsd."""
    from elasticslice.rspec import RSpecType, request_problem
    from elasticslice.rspec import parse as parse_rspec
    from elasticslice.rspec import validate as validate_rspec
    rspec = parse_rspec(text, source)
    if rspec.type != RSpecType.REQUEST:
        raise RSpecError(f"a {rspec.type.value} RSpec, not a request", source=source)
    if not rspec.nodes:
        raise RSpecError("the request has no nodes", source=source)
    if rspec.version == "3":
        problems = validate_rspec(text, source)
        if problems:
            more = f" (and {len(problems) - 1} more; see `elasticslice rspec validate`)" \
                if len(problems) > 1 else ""
            raise RSpecError(f"invalid request: {problems[0].message}{more}", source=source,
                             line=problems[0].line)
    problem = request_problem(rspec)  # the client_id rule of AddNodes and the CM (v2 too)
    if problem:
        raise RSpecError(f"invalid request: {problem}", source=source)


def _status_lines(status: SliverStatus) -> list[str]:
    lines = [f"status: {status.status}  state: {status.state}"
             + (f"  error: {status.error}" if status.error else "")]
    for n in status.nodes:
        extra = ""
        if n.execute_state:
            extra = f"  execute: {n.execute_state}"
            if n.execute_status is not None:
                extra += f" ({n.execute_status})"
        if n.error:
            extra += f"  error: {n.error}"
        lines.append(f"  {n.client_id:<16} {n.status:<9} {n.state:<8} {n.component_id}{extra}")
    return lines


@click.command("sliver-status", cls=_SliceCommand)
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {status, state, nodes: [...]}.")
@_cm_option
@wait_options
@click.pass_context
def sliver_status(ctx: click.Context, as_json: bool, cm: str | None, wait: bool,
                  timeout: float | None) -> None:
    """Show the sliver's status and each node's (ready, notready, changing, failed);
    with --wait, once every node is ready."""
    check_wait_options(wait, timeout)
    server = _server(ctx)
    status = wait_ready(server, _which(cm), timeout) if wait \
        else server.sliver_status(cm=_which(cm))
    if as_json:
        _emit(status.to_json())
    else:
        click.echo("\n".join(_status_lines(status)))


def add_nodes_arguments(client_ids: list[str], hardware_type: str | None,
                        disk_image: str | None,
                        free: dict[str, list[str]] | None = None) -> dict[str, dict[str, Any]]:
    """The AddNodes ``nodes`` struct for new raw nodes (via the RSpec library). CloudLab's
    AddNodes has no hardware type: with one, each node names a different free node of that
    type from ``free`` (hardware type -> free node names, the CM's advertisement); too few
    free is one line, before any call."""
    from elasticslice.rspec import NodeSpec, add_nodes_args, pin_add_args
    args = add_nodes_args([NodeSpec(client_id=c, hardware_type=hardware_type,
                                    disk_image=disk_image) for c in client_ids])
    wire, left_out = pin_add_args(args, free or {})
    if left_out:
        have = len((free or {}).get(hardware_type or "", []))
        raise click.ClickException(
            f"--hardware-type {hardware_type}: {have} free node(s) of that type at the CM, "
            f"{len(client_ids)} asked for (AddNodes names a free node of a type)")
    return wire


def _disk_image(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return value
    from elasticslice.rspec.rules import image_problem
    problem = image_problem(value)
    if problem:  # CloudLab's AddNodes refuses it too: say so before any call
        raise click.BadParameter(problem, ctx, param)
    return value


def _new_client_ids(existing: set[str], count: int, prefix: str) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"{prefix}{i}"
        if name not in existing:
            out.append(name)
        i += 1
    return out


@click.command("add-nodes", cls=_SliceCommand)
@click.argument("count", type=click.IntRange(min=1, max=10000), metavar="N")
@click.option("--hardware-type", "-t", default=None, metavar="T",
              help="Hardware type of the new nodes (e.g. m400, m510): each is asked for by "
                   "the name of a free node of that type (one DiscoverResources first; "
                   "CloudLab's AddNodes has no type). Default: any free node, the CM's "
                   "choice.")
@click.option("--disk-image", default=None, metavar="URN", callback=_disk_image,
              help="Disk image URN for the nodes, e.g. "
                   "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD.")
@click.option("--prefix", default="node-", show_default=True,
              help="client_id prefix; new nodes get the first free <prefix><n>.")
@_cm_option
@wait_options
@click.pass_context
def add_nodes(ctx: click.Context, count: int, hardware_type: str | None,
              disk_image: str | None, prefix: str, cm: str | None, wait: bool,
              timeout: float | None) -> None:
    """Add N nodes to the running sliver (CM v2 AddNodes); they boot in the background
    (--wait: until these N are ready)."""
    check_wait_options(wait, timeout)
    server = _server(ctx)
    existing = {n.client_id for n in server.sliver_status(cm=_which(cm)).nodes}
    ids = _new_client_ids(existing, count, prefix)
    from elasticslice.rspec.parse import count_nodes
    free = count_nodes(server.discover_resources(available=True, cm=_which(cm)),
                       "the CM's advertisement").free_by_type if hardware_type else None
    server.add_nodes(add_nodes_arguments(ids, hardware_type, disk_image, free), cm=_which(cm))
    click.echo(f"added {len(ids)} node(s): {' '.join(ids)}")
    if wait:
        wait_ready(server, _which(cm), timeout, client_ids=ids)
        click.echo(f"{len(ids)} node(s) ready")


@click.command("delete-nodes", cls=_SliceCommand)
@click.argument("client_ids", nargs=-1, required=True, metavar="CLIENT_ID...")
@_cm_option
@click.pass_context
def delete_nodes(ctx: click.Context, client_ids: tuple[str, ...], cm: str | None) -> None:
    """Give nodes back (CM v2 DeleteNodes), by client_id (as `sliver-status` shows).

    The CM refuses to delete every node of a sliver: use `delete-slice` for that.
    """
    unique = list(dict.fromkeys(client_ids))  # `delete-nodes a a` deletes one node
    _server(ctx).delete_nodes(unique, cm=_which(cm))
    click.echo(f"deleted {len(unique)} node(s): {' '.join(unique)}")


@click.command("renew", cls=_SliceCommand)
@click.option("--hours", type=Hours(), required=True,
              help="New lifetime from now, in hours (0.1 to 8760; the SA may allow less).")
@_cm_option
@click.pass_context
def renew(ctx: click.Context, hours: float, cm: str | None) -> None:
    """Extend the slice at the SA (when it would end sooner) and the sliver at the CM to
    now + H hours."""
    server = _server(ctx)
    answer = server.renew(_now() + dt.timedelta(hours=hours), cm=_which(cm))
    click.echo(f"renewed until {answer}")


@click.command("discover")
@click.option("--available", is_flag=True, help="Only nodes free right now.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary of the nodes.")
@_cm_option
@click.pass_context
def discover(ctx: click.Context, available: bool, as_json: bool, cm: str | None) -> None:
    """Show the CM's advertisement RSpec (v3), or a node summary with --json."""
    ad = _server(ctx).discover_resources(available=available, cm=_which(cm))
    if not as_json:
        click.echo(ad)
        return
    from elasticslice.rspec import parse as parse_rspec
    rspec = parse_rspec(ad, "advertisement")
    _emit({"available_by_type": dict(rspec.available_by_type),
           "total_by_type": dict(rspec.total_by_type),
           "nodes": [_ad_node(n) for n in rspec.nodes]})


def _ad_node(node: Any) -> dict[str, Any]:
    return {"component_id": node.component_id, "component_name": node.component_name,
            "hardware_types": list(node.hardware_types) or [node.hardware_type],
            "available": node.available, "exclusive": node.exclusive}


@click.command("resolve")
@click.option("--user", "what", flag_value="user", help="Resolve the user at the SA.")
@click.option("--slice", "what", flag_value="slice", default=True,
              help="Resolve the slice at the SA (default).")
@click.option("--sliver", "what", flag_value="sliver", help="Resolve the slice at the CM.")
@_cm_option
@click.pass_context
def resolve(ctx: click.Context, what: str, cm: str | None) -> None:
    """Resolve the slice (or --user, or --sliver at the CM) and print JSON."""
    server = _server(ctx)
    if what == "user":
        value = server.resolve_user()
    elif what == "sliver":
        value = server.cm(_which(cm)).resolve()
    else:
        value = server.resolve_slice()
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in ("gid", "manifest")} | (
            {"manifest": "(omitted)"} if "manifest" in value else {})
    _emit(value)


@click.command("delete-slice", cls=_SliceCommand)
@click.option("--cancel", is_flag=True,
              help="Delete even while the nodes are still being set up (else: BUSY).")
@click.option("--blocking", is_flag=True,
              help="Return only when the delete is complete (else it continues in the "
                   "background).")
@_cm_option
@click.pass_context
def delete_slice(ctx: click.Context, cancel: bool, blocking: bool, cm: str | None) -> None:
    """Release every resource of the slice at a CM (the slice itself expires at the SA)."""
    server = _server(ctx)
    server.delete_slice(cm=_which(cm), cancel=cancel, blocking=blocking)
    click.echo(f"sliver of {server.slice_urn()} deleted at {server.cm(_which(cm)).host}")

