"""`elasticslice nodes` and `elasticslice manifest`: the nodes you got, and how to log in.

    elasticslice nodes [--json] [--cm CM]     client_id, status, hostname, IP, ssh line
                                              (several CMs, no --cm: every CM's, named)
    elasticslice manifest [--cm CM]           the sliver's manifest RSpec, as the CM gives it

Both read the manifest with the CM's ``Resolve`` of the slice; ``nodes`` adds each node's
status from ``SliverStatus``.
"""
from __future__ import annotations

import json
from typing import Any

import click

from elasticslice.commands.client import _cm_option, _server, _SliceCommand, _which
from elasticslice.errors import RPCError
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.nodes import SliverNode, sliver_nodes

# The RSpec package (lxml) and `rspec`'s table are imported by the commands when they run:
# every client command imports this module (elasticslice.commands.client registers it).


def fetch_manifest(server: ProtoGeniServer, cm: int | str | None) -> str:
    """The sliver's manifest RSpec (text) from the CM's ``Resolve`` of the slice."""
    value = server.cm(cm).resolve()
    manifest = value.get("manifest") if isinstance(value, dict) else None
    if not isinstance(manifest, str) or not manifest.strip():
        raise RPCError("the answer holds no manifest", method="Resolve",
                       server=server.cm(cm).url)
    return manifest


def _user(server: ProtoGeniServer) -> str:
    return server.user_urn.rsplit("+", 1)[-1]


def render_nodes(nodes: list[SliverNode], sites: list[str] | None = None) -> str:
    """The table ``elasticslice nodes`` prints; ``sites``: each node's CM (several CMs)."""
    from elasticslice.commands.rspec import _table
    rows = [[n.client_id, n.status, n.hostname or "-", n.ipv4 or "-", n.ssh or "-"]
            for n in nodes]
    head = ["CLIENT_ID", "STATUS", "HOSTNAME", "IP", "SSH"]
    if sites is not None:
        rows, head = [[site, *row] for site, row in zip(sites, rows)], ["CM", *head]
    return "\n".join(_table(head, rows))


def cm_nodes(server: ProtoGeniServer, which: int | str | None) -> list[SliverNode]:
    """The nodes of the sliver at one CM: its manifest, with SliverStatus's status."""
    text = fetch_manifest(server, which)
    cm_host = server.cm(which).host
    from elasticslice.rspec import RSpecType
    from elasticslice.rspec import parse as parse_rspec
    manifest = parse_rspec(text, f"manifest from {cm_host}")
    if manifest.type is not RSpecType.MANIFEST:
        raise RPCError(f"Resolve answered a {manifest.type.value} RSpec, not a manifest",
                       method="Resolve", server=cm_host)
    return sliver_nodes(manifest, server.sliver_status(cm=which), _user(server))


def every_cm_nodes(server: ProtoGeniServer
                   ) -> tuple[dict[str, str], list[tuple[str, SliverNode]]]:
    """The CMs holding a sliver of the slice (name -> URL; a CM without one is left out,
    none with one: the first CM's error) and their nodes, (CM name, node)."""
    from elasticslice.managers.sites import cm_name
    cms: dict[str, str] = {}
    out: list[tuple[str, SliverNode]] = []
    first: RPCError | None = None
    for i, cm in enumerate(server.cms):
        try:
            listing = cm_nodes(server, i)
        except RPCError as err:
            if err.code != GeniCode.SEARCHFAILED:
                raise
            first = first or err
            continue
        cms[cm_name(cm.url)] = cm.url
        out += [(cm_name(cm.url), n) for n in listing]
    if not cms and first is not None:
        raise first
    return cms, out


@click.command("nodes", cls=_SliceCommand)
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: {slice_urn, cm, nodes: [{client_id, status, hostname, ipv4, "
                   "ssh, login, ...}]}; with several CMs and no --cm, {slice_urn, cms: "
                   "{NAME: URL}, nodes: [{cm: NAME, ...}]}.")
@_cm_option
@click.pass_context
def nodes(ctx: click.Context, as_json: bool, cm: str | None) -> None:
    """List the sliver's nodes: client_id, status, hostname, IP and a ready-to-paste
    `ssh -p PORT user@host` (from the manifest; status from SliverStatus). With several CMs
    in cm_urls and no --cm: the nodes of every CM holding a sliver, each with its CM's
    name (CM column)."""
    server = _server(ctx)
    which = _which(cm)
    if which is None and len(server.cms) > 1:
        cms, found = every_cm_nodes(server)
        if as_json:
            click.echo(json.dumps({
                "slice_urn": server.slice_urn(), "cms": cms,
                "nodes": [{"cm": name, **n.to_json_dict()} for name, n in found]}, indent=2))
        else:
            click.echo(render_nodes([n for _, n in found], [name for name, _ in found]))
        return
    listing = cm_nodes(server, which)
    if as_json:
        data: dict[str, Any] = {"slice_urn": server.slice_urn(), "cm": server.cm(which).host,
                                "nodes": [n.to_json_dict() for n in listing]}
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render_nodes(listing))


@click.command("manifest", cls=_SliceCommand)
@_cm_option
@click.pass_context
def manifest(ctx: click.Context, cm: str | None) -> None:
    """Print the sliver's manifest RSpec (hostnames, logins, IPs, links), as the CM gives it:
    `elasticslice manifest > manifest.xml; elasticslice rspec show manifest.xml`."""
    text = fetch_manifest(_server(ctx), _which(cm))
    click.echo(text, nl=not text.endswith("\n"))
