"""`elasticslice doctor`: is this machine ready for `elasticslice run` on the configured CMs?

    elasticslice -c C doctor [--state-dir DIR] [the run's --listen ... --endpoint-port]

One line per check, ``ok`` or ``FAIL`` (``skip`` when an earlier failure leaves nothing to
check), and for each failure what to do. Exit 0 only when every check passed, 1 otherwise,
2 on a bad option or config value. The checks, in order:

- ``certificate``: the certificate and its key load with the passphrase;
- ``sa``, ``cm N``: the SA and every CM answer GetVersion;
- ``slice``: the configured slice name is free, or the slice is this run's (``--state-dir``);
- ``addresses``: ``listen`` and ``public_url`` are not loopback unless the CM runs on this
  machine (CloudLab in a box) and its nodes share this machine's network; a box whose nodes
  are on networks of their own (its GetVersion names ``box_control_address``) is reached
  there only, as CloudLab's nodes reach a control node only at its public address;
- ``ports``: ``listen`` is an address of this machine and the endpoint's port can be bound;
- ``wheelhouse``: the nodes' software can be built for the image's Python;
- ``endpoint``: the callback endpoint can be registered at every CM (its dynamic-slice
  server answers), at an address the CM can reach.

The settings are the run's own (:func:`elasticslice.commands.run.resolve_settings`: the
options over the config's ``[pilots]``, ``[manager]`` and ``[endpoint]``).
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from elasticslice.commands.run import RunSettings, resolve_settings, setting_options
from elasticslice.errors import ElasticSliceError, RPCError
from elasticslice.pilots import bootstrap

STOCK_PYTHON = bootstrap.STOCK_PYTHON
#: the oldest Python the node agent runs on (the project's own floor, setup.cfg's)
MIN_NODE_PYTHON = bootstrap.MIN_NODE_PYTHON


@dataclass
class Check:
    """One line of the report: ``status`` ok, FAIL or skip; ``detail``; ``fix`` (what to do
    when it failed)."""

    name: str
    status: str
    detail: str
    fix: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "ok"

    def line(self) -> str:
        text = f"{self.status:<4} {self.name}: {self.detail}"
        return f"{text} -> {self.fix}" if self.fix and not self.passed else text


def ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, "FAIL", detail, fix)


def skip(name: str, why: str) -> Check:
    return Check(name, "skip", why)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


# ------------------------------------------------------------------ the checks -------------
def check_certificate(server: Any) -> Check:
    config = server.config
    try:
        server.transport   # loads the passphrase, the certificate and its key, the CA bundle
        urn = server.user_urn
    except ElasticSliceError as err:
        text = _one_line(err)
        if "wrong passphrase" in text:
            fix = ("put the key's passphrase (your CloudLab password) in passphrase_file, or "
                   "$PROTOGENI_PASSPHRASE")
        elif "ca_bundle" in text or "CA bundle" in text:
            fix = "set ca_bundle to the PEM bundle of the CAs the servers' certificates chain to"
        elif "no passphrase" in text:
            fix = "set passphrase_file (a file holding only the passphrase, mode 0600)"
        else:
            fix = ("set certificate to the PEM with your certificate and key (cloudlab.pem, "
                   "from the portal's 'Download Credentials')")
        return fail("certificate", text, fix)
    return ok("certificate", f"{config.certificate} loads with its passphrase ({urn})")


def _once(server: Any, timeout: float) -> Any:
    """A transport with the user's TLS context that tries each call once."""
    from elasticslice.rpc.transport import RetryPolicy, XmlRpcTransport
    return XmlRpcTransport(server.transport.context, timeout=timeout,
                           retry=RetryPolicy(attempts=1))


def _get_version(server: Any, url: str, timeout: float) -> str | None:
    """None when the server at ``url`` answered GetVersion, else why not."""
    transport = _once(server, timeout)
    try:
        transport.call_raw(url, "GetVersion", {}, keep_alive=False)
        return None
    except RPCError as err:
        from elasticslice.errors import TransportError
        return _one_line(err) if isinstance(err, TransportError) else None  # BUSY: it is up
    except (OSError, ElasticSliceError) as err:
        return _one_line(err)
    finally:
        transport.close()


def check_servers(server: Any, timeout: float) -> list[Check]:
    checks = []
    try:
        sa_url = server.sa_url
    except ElasticSliceError as err:
        return [fail("sa", _one_line(err), "set sa_url in [protogeni]")]
    problem = _get_version(server, sa_url, timeout)
    checks.append(ok("sa", f"{sa_url} answers GetVersion") if problem is None else fail(
        "sa", f"{sa_url} does not answer GetVersion: {problem}", _unverified(problem) or
        "check sa_url (default: the SA your certificate names), this machine's network and "
        "firewall, and the testbed's status"))
    for i, cm in enumerate(server.cms):
        problem = _get_version(server, cm.url, timeout)
        checks.append(ok(f"cm {i}", f"{cm.url} answers GetVersion") if problem is None
                      else fail(f"cm {i}", f"{cm.url} does not answer GetVersion: {problem}",
                                _unverified(problem) or
                                "check cm_urls (docs/cloudlab.md lists CloudLab's clusters), "
                                "this machine's network and firewall"))
    return checks


def _unverified(problem: str) -> str:
    """What to do when the server's certificate did not verify ("" when that was not it)."""
    if any(k in problem for k in ("server certificate not trusted", "CERTIFICATE_VERIFY_FAILED",
                                  "certificate verify failed")):
        return "add the CA the server's certificate chains to to ca_bundle (docs/cloudlab.md)"
    return ""


def check_slice(server: Any, state_dir: Path | None) -> Check:
    from elasticslice.managers.state import DB_NAME, ManagerState
    from elasticslice.rpc.codes import GeniCode
    try:
        urn = server.slice_urn()
    except ElasticSliceError as err:
        return fail("slice", _one_line(err), "set slice_name in [protogeni]")
    if state_dir is not None and (state_dir / "state" / DB_NAME).is_file():
        # imported here: it brings the manager's cycle (APScheduler), for a run's state only
        from elasticslice.managers.ownership import owns_slice
        state = ManagerState.open(state_dir / "state")
        try:
            if owns_slice(state, urn):
                return ok("slice", f"{urn} is the run's in {state_dir}")
        finally:
            state.close()
    try:
        server.get_slice_credential()
    except RPCError as err:
        if err.code == GeniCode.SEARCHFAILED:
            return ok("slice", f"{urn} is free (the run creates it)")
        if err.code == GeniCode.FORBIDDEN:
            return fail("slice", f"{urn} exists and is not yours",
                        "choose another slice_name in [protogeni]")
        return fail("slice", f"cannot tell whether {urn} exists: {_one_line(err)}",
                    "check that the SA answers (above)")
    except ElasticSliceError as err:
        return fail("slice", f"cannot tell whether {urn} exists: {_one_line(err)}",
                    "check that the SA answers (above)")
    from elasticslice.managers.ownership import holdings_of
    try:
        held = holdings_of(server)
    except ElasticSliceError as err:
        return fail("slice", f"cannot tell what {urn} holds: {_one_line(err)}",
                    "check that the CMs answer (above)")
    if not held:
        return ok("slice", f"{urn} exists and holds no sliver (the run reuses it)")
    where = f" and {state_dir} did not create it" if state_dir else ""
    return fail("slice", f"{urn} exists already, holds a sliver at {', '.join(held)}{where}",
                "give another slice_name, or the --state-dir of the run that made it (run "
                "--adopt takes it over on purpose)")


def _loopback(host: str) -> bool:
    """``host`` (an address or a name) is a loopback address, or a name that resolves only
    to loopback addresses."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                               for a in found)


def box_control_address(server: Any, timeout: float) -> str | None:
    """Where the box's nodes reach this machine, when they are on networks of their own
    (the first CM's GetVersion, an extension of the box); None otherwise."""
    if not server.cms:
        return None
    transport = _once(server, timeout)
    try:
        answer = transport.call_raw(server.cms[0].url, "GetVersion", {}, keep_alive=False)
    except (OSError, ElasticSliceError):
        return None
    finally:
        transport.close()
    value = answer.get("value") if isinstance(answer, dict) else None
    found = value.get("box_control_address") if isinstance(value, dict) else None
    return str(found) if found else None


def check_addresses(settings: RunSettings, cm_local: bool, box: str | None = None) -> Check:
    listen, public = settings.listen, settings.public_url
    where = f"listen {listen} ({settings.sources['listen']})"
    if public:
        where += f", public_url {public} ({settings.sources['public_url']})"
    if cm_local and box:
        bad = [] if listen == box else [f"listen {listen} ({settings.sources['listen']})"]
        host = urlsplit(public).hostname if public else None
        if host and host != box:
            bad.append(f"public_url {public} ({settings.sources['public_url']})")
        if bad:
            return fail("addresses", " and ".join(bad) + " is not where the box's nodes "
                        f"reach this machine: they are on a network of their own, as on "
                        f"CloudLab, and reach it at {box} only (a loopback address is "
                        f"theirs, not this machine's)",
                        f"set --listen / [pilots] listen to {box} (the config the emulator "
                        f"writes says so)")
        return ok("addresses", f"{where}: where the box's nodes reach this machine")
    if cm_local:
        return ok("addresses", f"{where}: the CM runs on this machine (the box), so its "
                               f"nodes reach this machine on any of its addresses")
    bad = []
    address = ipaddress.ip_address(listen)
    if address.is_loopback:
        bad.append(f"listen {listen} ({settings.sources['listen']}) is loopback")
    elif address.is_private:
        return fail("addresses", f"listen {listen} ({settings.sources['listen']}) is a private "
                    f"address: CloudLab's nodes reach the scheduler and enrolment at that very "
                    f"address (a NAT's port forward does not change what the nodes are "
                    f"told; public_url rewrites only the publisher's URLs)",
                    "run the control node where its own address is public: a CloudLab node "
                    "(examples/cloudlab/control-node.py) or a server with a public address")
    if public and _loopback(urlsplit(public).hostname or ""):
        bad.append(f"public_url {public} ({settings.sources['public_url']}) is loopback")
    if bad:
        return fail("addresses", "; ".join(bad) + ": CloudLab's nodes and servers cannot "
                                                  "reach this machine there",
                    "set --listen / [pilots] listen to this machine's public address (and "
                    "--public-url / [pilots] public_url to a URL CloudLab can fetch from)")
    return ok("addresses", f"{where}: not loopback, not private")


def check_ports(settings: RunSettings) -> Check:
    from elasticslice.config import is_this_machine
    listen, port = settings.listen, settings.endpoint_port
    if not is_this_machine(listen):
        return fail("ports", f"listen {listen} is not an address of this machine",
                    "give --listen / [pilots] listen an address of one of this machine's "
                    "interfaces (the public one, on a CloudLab control node)")
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    fixed = [("endpoint_port", "the callback endpoint", "--endpoint-port / [endpoint] port"),
             ("scheduler_port", "the Dask scheduler", "--scheduler-port / [pilots] "
                                                      "scheduler_port"),
             ("enrol_port", "enrolment", "--enrol-port / [pilots] enrol_port"),
             ("publish_port", "the tarball publisher", "--publish-port / [pilots] "
                                                       "publish_port")]
    for name, what, option in fixed:
        value = getattr(settings, name)
        if not value:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((listen, value))
            except OSError as err:
                return fail("ports", f"cannot bind {listen} port {value} for {what} "
                                     f"({settings.sources[name]}): {err.strerror or err}",
                            f"stop what holds the port, or choose another {option}")
    metrics = settings.metrics_port
    if metrics:   # served on 127.0.0.1 (never elsewhere by default)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", metrics))
            except OSError as err:
                return fail("ports", f"cannot bind 127.0.0.1 port {metrics} for the metrics "
                                     f"({settings.sources['metrics_port']}): "
                                     f"{err.strerror or err}",
                            "stop what holds the port, or choose another --metrics-port / "
                            "[pilots] metrics_port")
    given = [f"{getattr(settings, n)} for {w}" for n, w, _ in fixed if getattr(settings, n)]
    rest = [w for n, w, _ in fixed if not getattr(settings, n)]
    return ok("ports", f"{listen}: " + "; ".join(
        [*(["ports " + ", ".join(given)] if given else []),
         *([f"free ports for {', '.join(rest)}"] if rest else [])]) + " can be bound")


def image_python(settings: RunSettings, cm_local: bool) -> str | None:
    """The ``major.minor`` of the ``python3`` the nodes' image has (None: unknown)."""
    return bootstrap.image_python(settings.image, cm_local)


def wheelhouse_check(version: str) -> tuple[bool, str, str]:
    """Whether the nodes' software can be had for Python ``version`` (``major.minor``):
    (passed, detail, what to do). The seam for ``elasticslice.pilots.wheelhouse``: with it,
    the wheelhouse built for ``version`` must pin the versions this control node runs;
    without it, only a node Python equal to this control node's can be served (its own
    wheels)."""
    here = "%d.%d" % sys.version_info[:2]
    if tuple(int(x) for x in version.split(".")[:2]) < MIN_NODE_PYTHON:
        return (False, f"the image's Python {version} is older than the node agent needs "
                       f"({'.'.join(map(str, MIN_NODE_PYTHON))})",
                "use a newer image (UBUNTU22-64-STD has Python 3.10, UBUNTU24-64-STD 3.12), "
                "or an image with the agent's environment and [pilots] node_python")
    try:
        from elasticslice.pilots.wheelhouse import Wheelhouse  # type: ignore[import-not-found]
    except ImportError:
        if version == here:
            return True, f"the image's Python {version} is this control node's", ""
        return (False, f"the image's Python {version} differs from this control node's "
                       f"({here}) and no wheelhouse builder is installed",
                f"run the control node with Python {version}, or use an image with "
                f"Python {here}")
    from importlib import metadata
    # its own line says what came of it: the builder's "built the wheelhouse" log line
    # (the first run on a machine) would be one more line in front of the checks
    builder = logging.getLogger("elasticslice.pilots.wheelhouse")
    level = builder.level
    if not builder.isEnabledFor(logging.DEBUG):
        builder.setLevel(logging.WARNING)
    try:
        house = Wheelhouse.for_python(version)
        pins = dict(house.pins)
    except Exception as err:  # noqa: BLE001 - whatever stops the build is the answer
        return (False, f"no wheelhouse for Python {version}: {_one_line(err)}",
                "see docs/node-software.md (how the wheelhouse is built)")
    finally:
        builder.setLevel(level)
    differ = []
    for name in ("troy", "dask", "distributed"):
        try:
            mine = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if name in pins and pins[name] != mine:
            differ.append(f"{name} {pins[name]} (here {mine})")
    if differ:
        return (False, f"the wheelhouse for Python {version} pins {', '.join(differ)}",
                "rebuild it (remove its directory; the next run builds it again)")
    return True, f"the wheelhouse for Python {version} pins this control node's versions", ""


def check_wheelhouse(settings: RunSettings, cm_local: bool) -> Check:
    if settings.node_python:
        return ok("wheelhouse", f"not needed: the image brings the agent's environment "
                                f"([pilots] node_python = {settings.node_python})")
    version = image_python(settings, cm_local)
    if version is None:
        return fail("wheelhouse", f"cannot tell which Python the image "
                                  f"{settings.image or '(the CM default)'} has",
                    "give --image / [pilots] disk_image a standard image ("
                    + ", ".join(sorted(STOCK_PYTHON)) + "), or an image with the agent's "
                    "environment and [pilots] node_python")
    passed, detail, fix = wheelhouse_check(version)
    return ok("wheelhouse", detail) if passed else fail("wheelhouse", detail, fix)


def check_endpoint(server: Any, settings: RunSettings, cm_local: bool,
                   timeout: float = 15.0) -> list[Check]:
    manager = settings.manager
    ep = manager.endpoint if manager is not None else None
    if ep is not None and not ep.enabled:
        return [fail("endpoint", "disabled ([endpoint] enabled = false): CloudLab takes nodes "
                                 "back without notice",
                     "remove enabled = false from [endpoint]")]
    address = ep.address if ep is not None and "endpoint.address" in manager.given \
        else settings.listen
    url = (ep.url if ep is not None and ep.url else
           f"https://{address}:{settings.endpoint_port or 'PORT'}/")
    host = urlsplit(url).hostname or ""
    if not cm_local and _loopback(host):
        return [fail("endpoint", f"{url} is loopback: the CM cannot call it",
                     "set --listen / [pilots] listen (or [endpoint] url) to this machine's "
                     "public address")]
    checks = []
    transport = _once(server, timeout)
    for i, cm in enumerate(server.cms):
        try:
            defaults = transport.call(cm.dynslice_url, "GetServerDefaults", {},
                                      keep_alive=False)
        except (ElasticSliceError, OSError) as err:
            checks.append(fail(f"endpoint {i}", f"{cm.dynslice_url} does not answer "
                                                f"GetServerDefaults: {_one_line(err)}",
                               "check dynslice_urls in [protogeni] (one per CM)"))
            continue
        wait = defaults.get("maxwaittime") if isinstance(defaults, dict) else None
        checks.append(ok(f"endpoint {i}", f"{url} registrable at {cm.dynslice_url}"
                                          + (f" (notices up to {wait} s ahead)" if wait else "")))
    transport.close()
    return checks


def run_checks(server: Any, settings: RunSettings, *, state_dir: Path | None,
               timeout: float) -> list[Check]:
    from elasticslice.config import cm_is_local
    checks = [check_certificate(server)]
    cm_local = all(cm_is_local(u) for u in settings.cm_urls)
    if checks[0].passed:
        servers = check_servers(server, timeout)
        checks += servers
        if all(c.passed for c in servers):
            checks.append(check_slice(server, state_dir))
        else:
            checks.append(skip("slice", "needs the SA (above)"))
    else:
        checks += [skip("sa, cms", "need the certificate"), skip("slice", "needs the SA")]
    box = box_control_address(server, timeout) if cm_local and checks[0].passed else None
    checks += [check_addresses(settings, cm_local, box), check_ports(settings),
               check_wheelhouse(settings, cm_local)]
    if all(c.passed for c in checks[:1]):
        checks += check_endpoint(server, settings, cm_local, timeout)
    else:
        checks.append(skip("endpoint", "needs the certificate"))
    return checks


@click.command("doctor")
@click.option("--state-dir", default=None, type=click.Path(path_type=Path),
              help="The run's DIR: its slice counts as ours.")
@click.option("--connect-timeout", type=click.FloatRange(0.1), default=15.0,
              show_default=True, help="Seconds to wait for each server's answer.")
@setting_options
@click.pass_context
def doctor_cmd(ctx: click.Context, state_dir: Path | None, connect_timeout: float,
               **settings: str | None) -> None:
    """Check that `elasticslice run` can work from this machine: the certificate and
    passphrase, the SA and every CM, the slice name, the addresses and ports, the nodes'
    software and the callback endpoint. One line per check, with what to do when it fails.
    Takes the run's options (--listen ... --endpoint-port; the config's [pilots],
    [manager] and [endpoint] otherwise). Exit 0 only when every check passed."""
    from elasticslice.config import load_config
    from elasticslice.rpc.client import ProtoGeniServer
    client = load_config(getattr(ctx.obj, "config_path", None))
    chosen = resolve_settings(client, settings)
    server = ProtoGeniServer(client)
    try:
        checks = run_checks(server, chosen, timeout=connect_timeout,
                            state_dir=state_dir.expanduser().resolve() if state_dir else None)
    finally:
        server.close()
    for check in checks:
        click.echo(check.line())
    failed = [c for c in checks if not c.passed]
    if failed:
        click.echo(f"{len(failed)} of {len(checks)} checks did not pass", err=True)
        ctx.exit(1)
    click.echo(f"all {len(checks)} checks passed: `elasticslice run` can start")


def register(group: click.Group) -> None:
    group.add_command(doctor_cmd)
