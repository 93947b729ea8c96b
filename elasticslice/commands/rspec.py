"""`elasticslice rspec`: build, validate and show RSpecs.

Exit codes of ``validate`` (a contract other tools rely on): 0 every file is valid, 1 at
least one is invalid against the GENI v3 schema of its type, 2 a file is unreadable, not
XML, or hostile. ``show`` exits 2 for the same input problems.
"""
from __future__ import annotations

import json
import sys

import click

from elasticslice.errors import RSpecError
from elasticslice.rspec import (
    DEFAULT_MAX_BYTES, LinkSpec, NodeSpec, RSpec, RSpecType, build_request, parse, validate,
)
from elasticslice.rspec.rules import image_problem
from elasticslice.rspec.tarball import tarball_problem

EXIT_INVALID = 1
EXIT_BAD_INPUT = 2
#: ``validate`` prints at most this many problems per file by default (``--max-problems``).
MAX_PROBLEMS_SHOWN = 20


class BadInput(click.ClickException):
    """Unreadable, non-XML or hostile input: one line, exit status 2."""

    exit_code = EXIT_BAD_INPUT


def _read(path: str) -> bytes:
    """At most one byte more than the size limit, so an oversize file is refused by the
    parser without being read whole."""
    limit = DEFAULT_MAX_BYTES + 1
    if path == "-":
        return sys.stdin.buffer.read(limit)
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError as err:
        raise BadInput(f"{path}: cannot read: {err.strerror or err}") from err


def _image(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--image``: an image URN, checked here (CloudLab refuses anything else, e.g. the
    placeholder ``URN``)."""
    problem = image_problem(value) if value is not None else None
    if problem:
        raise click.BadParameter(problem, ctx, param)
    return value


def _split_tarball(value: str) -> tuple[str, str]:
    """``URL[:PATH]``: the path is what follows the last ':' if that is absolute and what
    precedes it is still a URL (so ``https://host:8080/a.tgz`` keeps its port)."""
    head, sep, tail = value.rpartition(":")
    url, path = (head, tail) if sep and tail.startswith("/") and "://" in head else (value, "/")
    problem = tarball_problem(url) if "://" in url else \
        "not a URL (want http(s)://.../NAME.tar.gz, optionally followed by :PATH)"
    if problem:
        raise click.UsageError(f"--tarball {value!r}: {problem}")
    return url, path


@click.group("rspec")
def rspec_group() -> None:
    """Build, validate and show GENI v3 RSpecs (requests, manifests, advertisements)."""


@rspec_group.command("build")
@click.option("--count", "-n", type=click.IntRange(1, 10000), default=1, show_default=True,
              help="Number of nodes.")
@click.option("--prefix", "-p", default="node-", show_default=True,
              help="Node client_id prefix; nodes are named PREFIX0 .. PREFIX{N-1}.")
@click.option("--hardware-type", "-t", default=None,
              help="Hardware type of every node, e.g. d430, m510, c220g2.")
@click.option("--image", "-i", default=None, callback=_image, metavar="URN",
              help="Disk image URN, e.g. "
                   "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD.")
@click.option("--sliver-type", default="raw-pc", show_default=True,
              help="Sliver type (raw-pc for a whole machine, emulab-xen for a VM).")
@click.option("--lan", default=None, metavar="NAME",
              help="Put every node on one LAN with this client_id (interfaces PREFIXi:if0).")
@click.option("--multiplex", is_flag=True, default=False,
              help="With --lan: allow link multiplexing (turns on VLAN tagging too).")
@click.option("--startup", default=None, metavar="CMD",
              help="Command every node runs at boot (services/execute).")
@click.option("--shell", default="sh", show_default=True, metavar="SH",
              help="Shell for --startup.")
@click.option("--tarball", "tarballs", multiple=True, metavar="URL[:PATH]",
              help="Tarball URL to unpack on every node at PATH (default /); CloudLab "
                   "fetches http(s)/ftp URLs ending .tar.gz, .tgz, .tar... (no file://, "
                   "no query string). Repeatable.")
@click.option("--routable-ip", is_flag=True, default=False,
              help="Ask for a publicly routable control IP on every node.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file instead of standard output.")
def build_cmd(count: int, prefix: str, hardware_type: str | None, image: str | None,
              sliver_type: str, lan: str | None, multiplex: bool, startup: str | None,
              shell: str, tarballs: tuple[str, ...], routable_ip: bool,
              output: str | None) -> None:
    """Print a request RSpec for COUNT identical nodes (validated against request.xsd).

    \b
    Example:
      elasticslice rspec build --count 4 --prefix node- --hardware-type d430 \\
          --image urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD \\
          --lan lan0 --startup /local/start.sh --shell bash
    """
    if multiplex and not lan:
        raise click.UsageError("--multiplex needs --lan")
    shell_source = click.get_current_context().get_parameter_source("shell")
    if not startup and shell_source is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--shell needs --startup")
    installs = [_split_tarball(t) for t in tarballs]
    executes = [(shell, startup)] if startup else []
    nodes = []
    for index in range(count):
        cid = f"{prefix}{index}"
        nodes.append(NodeSpec(
            client_id=cid, hardware_type=hardware_type, sliver_type=sliver_type,
            disk_image=image, interfaces=[(f"{cid}:if0", None, None)] if lan else [],
            installs=list(installs), executes=list(executes),
            routable_control_ip=routable_ip))
    links = []
    if lan:
        links.append(LinkSpec(
            client_id=lan, interfaces=[f"{n.client_id}:if0" for n in nodes], link_type="lan",
            vlan_tagging=True if multiplex else None,
            link_multiplexing=True if multiplex else None))
    text = build_request(nodes, links)
    if output:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        click.echo(text, nl=False)


@rspec_group.command("validate")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--strict", is_flag=True, default=False,
              help="Use the XSDs exactly as published (refuse host@ipv4 and extra "
                   "emulab:vnode attributes that real CloudLab manifests carry).")
@click.option("--quiet", "-q", is_flag=True, default=False, help="Print only problems.")
@click.option("--max-problems", type=click.IntRange(0), default=MAX_PROBLEMS_SHOWN,
              show_default=True, metavar="N",
              help="Print at most N problems per file, then how many more (0: all).")
def validate_cmd(files: tuple[str, ...], strict: bool, quiet: bool, max_problems: int) -> None:
    """Validate RSpec FILEs against the GENI v3 schema of their type ('-' reads stdin).

    Requests are also checked for node client_ids that AddNodes and CreateSliver refuse
    (1-64 letters, digits, '-', '_' or '.', unique) and for disk images that are not image
    URNs (urn:publicid:IDN+<authority>+image+<project>//<name>).

    Exit status: 0 all valid, 1 one or more invalid (each problem printed as FILE:LINE:
    message, at most --max-problems of them per file, then '... and N more'), 2 a file is
    unreadable, not XML, or hostile (DTDs, entities, oversize).
    """
    status = 0
    for path in files:
        try:
            problems = validate(_read(path), source=path, strict=strict)
        except BadInput as err:
            click.echo(f"error: {err.message}", err=True)
            status = EXIT_BAD_INPUT
            continue
        except RSpecError as err:
            click.echo(f"error: {err}", err=True)
            status = EXIT_BAD_INPUT
            continue
        if problems:
            shown = problems[:max_problems] if max_problems else problems
            for problem in shown:
                click.echo(f"{path}:{problem.line}: {problem.message}", err=True)
            if len(problems) > len(shown):
                click.echo(f"{path}: ... and {len(problems) - len(shown)} more problem(s) "
                           f"({len(problems)} in all; --max-problems 0 prints every one)",
                           err=True)
            status = max(status, EXIT_INVALID)
        elif not quiet:
            click.echo(f"{path}: valid")
    click.get_current_context().exit(status)


@rspec_group.command("show")
@click.argument("file", metavar="FILE")
@click.option("--json", "as_json", is_flag=True, default=False,
              help="Print JSON: type, expires, nodes, links, available_by_type, total_by_type.")
def show_cmd(file: str, as_json: bool) -> None:
    """Show the nodes and links of an RSpec FILE ('-' reads stdin) as a table or JSON.

    Reads requests, manifests and advertisements, GENI v3 and ProtoGENI v2. Exit status 2
    when the file is unreadable, not an RSpec, or hostile.
    """
    data = _read(file)
    try:
        rspec = parse(data, source=file)
    except RSpecError as err:
        raise BadInput(str(err)) from err
    if as_json:
        click.echo(json.dumps(rspec.to_json_dict(), indent=2))
    else:
        click.echo(render_table(rspec))


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers).rstrip()]
    lines += [fmt.format(*row).rstrip() for row in rows]
    return lines


def _s(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render_table(rspec: RSpec) -> str:
    """The human-readable view ``rspec show`` prints."""
    expires = rspec.to_json_dict()["expires"]
    lines = [f"{rspec.type.value} (v{rspec.version}), {len(rspec.nodes)} nodes, "
             f"{len(rspec.links)} links" + (f", expires {expires}" if expires else "")]
    if rspec.type is RSpecType.ADVERTISEMENT:
        rows = [[_s(n.component_name or n.component_id), ",".join(n.hardware_types) or "-",
                 _s(n.exclusive), _s(n.available)] for n in rspec.nodes]
        lines += [""] + _table(["NODE", "HARDWARE TYPES", "EXCLUSIVE", "AVAILABLE"], rows)
        rows = [[name, str(rspec.available_by_type.get(name, 0)), str(total)]
                for name, total in rspec.total_by_type.items()]
        lines += [""] + _table(["HARDWARE TYPE", "AVAILABLE", "TOTAL"], rows)
        return "\n".join(lines)
    rows = []
    for n in rspec.nodes:
        login = n.logins[0] if n.logins else None
        ssh = (f"{login.username + '@' if login.username else ''}{login.hostname or ''}"
               f"{':' + str(login.port) if login.port else ''}") if login else "-"
        ips = ",".join(i.ip for i in n.interfaces if i.ip) or "-"
        rows.append([_s(n.client_id), _s(n.hardware_type), _s(n.component_name or n.component_id),
                     _s(n.hostname), _s(n.ipv4), ssh, ips])
    lines += [""] + _table(["CLIENT_ID", "HW TYPE", "COMPONENT", "HOSTNAME", "IPV4", "LOGIN",
                            "LAN IPS"], rows)
    if rspec.links:
        rows = [[_s(link.client_id), _s(link.link_type), str(len(link.interfaces)),
                 _s(link.vlan_tagging), _s(link.link_multiplexing), _s(link.vlantag)]
                for link in rspec.links]
        lines += [""] + _table(["LINK", "TYPE", "IFACES", "VLAN TAGGING", "MULTIPLEX",
                                "VLANTAG"], rows)
    return "\n".join(lines)


def register(group: click.Group) -> None:
    """Attach this module's commands to the top-level group."""
    group.add_command(rspec_group)
