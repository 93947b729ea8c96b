"""The ``elasticslice`` command line.

Sub-commands live in ``elasticslice.commands.<name>`` modules, each exposing
``register(group)``; a module is imported only when one of its commands runs (or ``--help``
lists them): ``COMMANDS`` names each command's module, and a test checks it against what the
modules register. Errors of ours become one clear line (``click.ClickException``); an
unexpected exception becomes one line too, with the traceback only under ``--debug``.
"""
from __future__ import annotations

import importlib
import io
import logging
import os
import sys
from typing import Any

import click

from elasticslice import __version__
from elasticslice.envcheck import warn_unknown_variables
from elasticslice.errors import ElasticSliceError
from troy.clickutil import OneLineErrors

COMMAND_MODULES = ("rspec", "client", "emulator", "manage", "demo", "run", "doctor")
#: each command and the module that registers it (importing them all costs every call of
#: the command line ~0.3 s of CPU; a node or a test calls it hundreds of times)
COMMANDS = {
    "rspec": "rspec",
    **dict.fromkeys(("getversion", "create-slice", "create-sliver", "sliver-status",
                     "add-nodes", "delete-nodes", "renew", "discover", "resolve",
                     "delete-slice", "nodes", "manifest"), "client"),
    "emulator": "emulator", "manage": "manage", "status": "manage", "demo": "demo",
    "run": "run", "doctor": "doctor",
}

log = logging.getLogger("elasticslice")


class CliState:
    """What the group options give every sub-command (``ctx.obj``)."""

    def __init__(self, config: str | None, debug: bool) -> None:
        self.config_path = config
        self.debug = debug


class FriendlyGroup(OneLineErrors):
    """A click group that turns our exceptions into one-line messages (usage errors too:
    one line naming the command's --help, no usage block), and imports a command's module
    only when the command is asked for (:data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"elasticslice.commands.{COMMANDS[cmd_name]}").register(self)
        return self.commands.get(cmd_name)

    def load_all(self) -> None:
        """Every command registered (what walks the whole tree needs it)."""
        for module in COMMAND_MODULES:
            importlib.import_module(f"elasticslice.commands.{module}").register(self)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except ElasticSliceError as err:
            raise click.ClickException(str(err)) from err
        except KeyboardInterrupt:
            raise click.exceptions.Exit(130)
        except BrokenPipeError:  # `elasticslice discover | head`: the reader is gone
            _silence_stdout()
            raise click.exceptions.Exit(141)
        except Exception as err:  # never a traceback in front of a user
            if _debug_requested(ctx):
                raise
            raise click.ClickException(
                f"internal error: {type(err).__name__}: {err} (rerun with --debug for details)"
            ) from err


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing it at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass


def _debug_requested(ctx: click.Context) -> bool:
    state = ctx.find_object(CliState)
    return bool(state and state.debug)


class _UnretrievedAtExit(logging.Filter):
    """asyncio's "Future exception was never retrieved" (a future of Dask's, collected when
    the process ends, seen once after a run's last line): a traceback in front of the user
    that says nothing to them. Shown with --debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).split("\n", 1)[0].endswith("exception was never retrieved")


def setup_logging(debug: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not debug:
        logging.getLogger("asyncio").addFilter(_UnretrievedAtExit())


@click.group(cls=FriendlyGroup, context_settings={"auto_envvar_prefix": "ELASTICSLICE",
                                                  "help_option_names": ["-h", "--help"]})
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None,
              help="Client config (INI). Default: ~/.protogeni/elasticslice.conf. "
                   "Env: ELASTICSLICE_CONFIG.")
@click.option("--debug", "-d", is_flag=True, default=False,
              help="Verbose logging, and tracebacks for unexpected errors.")
@click.version_option(__version__, prog_name="elasticslice")
@click.pass_context
def cli(ctx: click.Context, config: str | None, debug: bool) -> None:
    """Elastic CloudLab/ProtoGENI slices that host pilots.

    Build and check RSpecs (`rspec`), talk to CloudLab as your user (getversion ...
    delete-slice, with the [protogeni] config of --config), or run CloudLab in a box
    (`emulator`: the same protocol over TLS, on this machine), and run the elastic slice
    manager (`manage`, `status`), or a workflow on an elastic cluster (`run`; `doctor`
    checks first that it can work from this machine).
    """
    setup_logging(debug)
    warn_unknown_variables(ctx.command)  # a misspelled ELASTICSLICE_* is not silently ignored
    ctx.obj = CliState(config, debug)



def main() -> None:
    cli(prog_name="elasticslice")


if __name__ == "__main__":
    main()
