"""The ``troy`` command line (being built: ``troy run`` arrives with the Troy issue)."""
from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Troy: run workloads of tasks on pilots (local processes or Dask)."""


def main() -> None:
    cli(prog_name="troy")
