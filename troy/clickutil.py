"""What both command lines (``troy`` and ``elasticslice``) share about click: a usage error is
one line that names the command to ask for help, never click's usage block; a ``ClickException``
is its one line; Ctrl-C at a prompt is ``Aborted!``; plain ``troy`` (no arguments) prints the
help and exits 0."""
from __future__ import annotations

import sys
from typing import Any

import click


class OneLineErrors(click.Group):
    """A click group whose standalone ``main`` prints errors as one line each."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as err:  # the bare command: its help
            click.echo(err.format_message())
            sys.exit(0)
        except click.UsageError as err:
            if type(err).show is not click.UsageError.show:  # a command's own one line
                err.show()
                sys.exit(err.exit_code)
            where = f" (see '{err.ctx.command_path} --help')" if err.ctx else ""
            click.echo(f"Error: {err.format_message()}{where}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            err.show()
            sys.exit(err.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)
