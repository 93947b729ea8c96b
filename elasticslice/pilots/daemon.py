"""The manager daemon's command, and how a workload starts it.

    python -m elasticslice.pilots.daemon --config FILE --state-dir DIR [--settings JSON]

The daemon (:class:`~elasticslice.pilots.managerdaemon.ManagerDaemon`) is the one process of
the control node that holds the user's CloudLab credentials, the cluster CA's key and the
manager's state. :class:`DaemonCommand` says how to start it, :func:`spawn_daemon` starts it
and waits until it serves.

``elasticslice run`` starts it (or attaches to the one already serving ``DIR``); it makes
the CM calls, answers CloudLab's callbacks, enrols the nodes and publishes the slice's
tarball, and decodes nothing a node's agent or a task sends through Dask: the Dask
scheduler and Troy's session live in the workload's process
(:class:`~elasticslice.pilots.workload.WorkloadCluster`), which tells it the demand and
the pilots over the local channel (:mod:`elasticslice.channel`; its end here is
:class:`~elasticslice.pilots.remote.RemoteWorkload`) and hears back which nodes are held,
which failed, and what to drain before a revocation's deadline.

It writes the scheduler's own certificate and key (``scheduler-tls.json`` says where; the
workload's process reloads them when they are renewed), starts the manager once the
workload says where its scheduler serves, and stops when the workload says the run ends
(giving the slice back or keeping it), on SIGTERM (keeping it), or after
``--orphan-timeout`` seconds with no workload attached (keeping it: a run resumed later
starts a new daemon). Its log is ``DIR/daemon.log``. Until it is ready it speaks on
stderr: one ``Error: ...`` line and exit 1 (2: a bad setting) when it cannot start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.policy import PolicyConfig
from elasticslice.pilots.managerdaemon import (DAEMON_FILE, LOG_FILE, ORPHAN_TIMEOUT,
                                               TLS_FILE, ManagerDaemon, cluster_policy,
                                               default_policy, held_nodes)
from elasticslice.pilots.daemonkit import serve
from elasticslice.pilots.restart import write_json

log = logging.getLogger(__name__)

START_TIMEOUT = 180.0       # seconds a daemon has to be ready, besides its CM's timeout
#: seconds the manager daemon keeps the nodes with no workload attached (default: the
#: daemon's, 600)
ORPHAN_ENV = "ELASTICSLICE_ORPHAN_TIMEOUT"

__all__ = ["DAEMON_FILE", "LOG_FILE", "ORPHAN_ENV", "TLS_FILE", "DaemonCommand",
           "ManagerDaemon", "cluster_policy", "default_policy", "held_nodes", "main",
           "spawn_daemon"]


@dataclasses.dataclass
class DaemonCommand:
    """How to start the manager daemon of a run: its config file, the run's settings as
    given (JSON), and the options of ``elasticslice run`` it follows."""

    config: str | None
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: instead of ``settings``: the daemon's keyword arguments (JSON-able; ``policy`` a
    #: ``PolicyConfig``), as ``CloudLabCluster`` gives them
    arguments: Mapping[str, Any] | None = None
    max_nodes: int | None = None
    min_nodes: int | None = None
    adopt: bool = False
    connect_timeout: float = 60.0
    orphan_timeout: float | None = None
    debug: bool = False
    #: variables the daemon's environment gets besides this process' (none by default)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def argv(self, state_dir: Path) -> list[str]:
        args = [sys.executable, "-m", "elasticslice.pilots.daemon", "--state-dir",
                str(state_dir), "--settings", json.dumps(dict(self.settings)),
                "--connect-timeout", str(self.connect_timeout)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        if self.arguments is not None:
            arguments = dict(self.arguments)
            if dataclasses.is_dataclass(arguments.get("policy")):
                arguments["policy"] = dataclasses.asdict(arguments["policy"])
            try:
                args += ["--arguments", json.dumps(arguments)]
            except (TypeError, ValueError) as err:
                raise ElasticSliceError(f"the manager daemon's arguments must be what JSON "
                                        f"carries: {err}") from None
        if self.max_nodes is not None:
            args += ["--max-nodes", str(self.max_nodes)]
        if self.min_nodes is not None:
            args += ["--min-nodes", str(self.min_nodes)]
        orphan = self.orphan_timeout
        if orphan is None and os.environ.get(ORPHAN_ENV):
            try:
                orphan = float(os.environ[ORPHAN_ENV])
            except ValueError:
                raise ElasticSliceError(f"${ORPHAN_ENV}: {os.environ[ORPHAN_ENV]!r} is not a "
                                        f"number of seconds") from None
        if orphan is not None:
            args += ["--orphan-timeout", str(orphan)]
        return args + ["--adopt"] * self.adopt + ["--debug"] * self.debug


def spawn_daemon(command: Any, state_dir: Path) -> subprocess.Popen:
    """Start the daemon (``command``: a :class:`DaemonCommand` or Parsl's
    ``ParslDaemonCommand``: its ``argv``, ``env`` and ``connect_timeout``) and wait until it
    serves the channel; its one ``Error:`` line (as :class:`ElasticSliceError`, with the exit
    status in ``status``) when it cannot."""
    proc = subprocess.Popen(command.argv(state_dir), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **command.env} if command.env else None,
                            start_new_session=True)   # a Ctrl-C here is not its signal
    limit = command.connect_timeout + START_TIMEOUT
    out, err = _until_ready(proc, time.monotonic() + limit)
    if out is None:
        proc.kill()
        proc.wait()
        raise ElasticSliceError(f"{state_dir}: the manager daemon did not start within "
                                f"{limit:g} s")
    if b"ready" in out.split() and proc.poll() is None:
        return proc
    proc.wait()
    lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
    line = lines[-1] if lines else f"the manager daemon exited {proc.returncode}"
    failure = ElasticSliceError(line[len("Error: "):] if line.startswith("Error: ") else line)
    failure.status = proc.returncode   # type: ignore[attr-defined]
    raise failure


def _until_ready(proc: subprocess.Popen, deadline: float) -> tuple[bytes | None, bytes]:
    """What the daemon wrote on stdout and stderr until both ended (it is ready, its
    output now goes to its log, or it exited); None for stdout at ``deadline``."""
    import selectors
    chunks: dict[Any, list[bytes]] = {proc.stdout: [], proc.stderr: []}
    with selectors.DefaultSelector() as selector:
        for pipe in chunks:
            selector.register(pipe, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return None, b"".join(chunks[proc.stderr])
            for key, _ in selector.select(left):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fileobj].append(data)
                else:
                    selector.unregister(key.fileobj)
                    key.fileobj.close()
    return b"".join(chunks[proc.stdout]), b"".join(chunks[proc.stderr])



# ---------------------------------------------------------------------- the command ----
def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m elasticslice.pilots.daemon",
        description="The manager daemon of an elastic cluster: the only process holding the "
                    "CloudLab credentials and the cluster CA's key (started by `elasticslice "
                    "run`).")
    parser.add_argument("--config", default=None, help="the elasticslice config file")
    parser.add_argument("--state-dir", required=True, type=Path, help="the run's directory")
    parser.add_argument("--settings", default="{}",
                        help="the run's settings, as `elasticslice run` was given them (JSON)")
    parser.add_argument("--arguments", default=None,
                        help="instead of --settings: the ManagerDaemon's keyword arguments "
                             "(JSON; 'policy' an object of PolicyConfig's fields), as "
                             "CloudLabCluster passes them")
    parser.add_argument("--max-nodes", type=int, default=None)
    parser.add_argument("--min-nodes", type=int, default=None)
    parser.add_argument("--adopt", action="store_true")
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    parser.add_argument("--orphan-timeout", type=float, default=ORPHAN_TIMEOUT)
    parser.add_argument("--debug", action="store_true")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> ManagerDaemon:
    """The daemon of a run: its config's server, its settings resolved as `run` does, and
    the slice checked (``preflight``); :class:`ElasticSliceError` or ``BadUsage``."""
    from elasticslice.runsettings import resolve_settings
    from elasticslice.config import load_config
    from elasticslice.managers.ownership import preflight
    from elasticslice.rpc.client import ProtoGeniServer
    try:
        settings = json.loads(args.settings)
        given = json.loads(args.arguments) if args.arguments is not None else None
    except ValueError as err:
        raise ElasticSliceError(f"--settings/--arguments: not JSON: {err}") from None
    client = load_config(args.config)
    if given is None:
        chosen = resolve_settings(client, settings, args.max_nodes)
        arguments = chosen.cluster_arguments()
        if args.min_nodes is not None:
            arguments["minthreshold"] = min(args.min_nodes, arguments["maxthreshold"])
    else:
        arguments = _arguments_of(given)
    arguments.setdefault("manager_options", {})["adopt"] = args.adopt
    state_dir = args.state_dir.expanduser().resolve()
    server = ProtoGeniServer(client)
    try:
        preflight(server, state_dir / "state", adopt=args.adopt,
                  connect_timeout=args.connect_timeout)
        return ManagerDaemon(server, state_dir, orphan_timeout=args.orphan_timeout,
                             **arguments)
    except TypeError as err:   # an argument it does not take
        server.close()
        raise ElasticSliceError(f"--arguments: {err}") from None
    except BaseException:
        server.close()
        raise


def _arguments_of(given: Any) -> dict[str, Any]:
    """``--arguments`` as ManagerDaemon's keyword arguments (its policy a PolicyConfig)."""
    if not isinstance(given, dict):
        raise ElasticSliceError("--arguments: expected a JSON object")
    arguments = dict(given)
    policy = arguments.get("policy")
    if policy is not None:
        if not isinstance(policy, dict):
            raise ElasticSliceError("--arguments: policy: expected an object")
        try:
            arguments["policy"] = PolicyConfig(**policy)
        except (TypeError, ValueError) as err:
            raise ElasticSliceError(f"--arguments: policy: {err}") from None
    return arguments


def main(argv: list[str] | None = None) -> int:
    """Start, say ``ready`` on stdout, then serve with the log in ``DIR/daemon.log``."""
    from elasticslice.runsettings import SettingsError
    args = _arguments(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        daemon = build(args).start()
    except SettingsError as err:
        print(f"Error: {err}", file=sys.stderr, flush=True)
        return 2
    except (ElasticSliceError, OSError) as err:
        print(f"Error: {err}", file=sys.stderr, flush=True)
        return 1
    write_json(daemon.state_dir / DAEMON_FILE,
               {"pid": os.getpid(), "argv": sys.argv[1:] if argv is None else list(argv)})
    return serve(daemon, daemon.state_dir / LOG_FILE, debug=args.debug, name="manager daemon")


if __name__ == "__main__":
    sys.exit(main())
