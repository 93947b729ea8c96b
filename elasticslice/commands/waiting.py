"""``--wait`` and ``--timeout`` of the client commands that start nodes booting
(``create-sliver``, ``add-nodes``) or watch them (``sliver-status``).

Progress goes to stderr, one line whenever the counts change; the end is one line too.
Exit status when waiting does not end with the nodes ready: 1 a node failed,
3 (:data:`EXIT_TIMEOUT`) the time was up.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Any

import click

from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.cm import SliverStatus
from elasticslice.rpc.wait import (
    DEFAULT_TIMEOUT, SliverFailedError, SliverWaitTimeout, wait_for_nodes,
)

EXIT_TIMEOUT = 3


class WaitTimedOut(click.ClickException):
    """The nodes were not ready in time: one line, exit status 3."""

    exit_code = EXIT_TIMEOUT


def wait_options(f: Any) -> Any:
    """Add ``--wait`` and ``--timeout SECONDS`` to a command."""
    f = click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
                     metavar="SECONDS",
                     help=f"With --wait: give up after this long (default "
                          f"{DEFAULT_TIMEOUT:g}), exit status {EXIT_TIMEOUT}.")(f)
    return click.option("--wait", is_flag=True, default=False,
                        help="Wait until the nodes are ready (exit 1 if one fails), showing "
                             "progress on stderr.")(f)


def check_wait_options(wait: bool, timeout: float | None) -> None:
    """Refuse ``--timeout`` without ``--wait`` (it would do nothing), before any call."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout needs --wait")


def wait_ready(server: ProtoGeniServer, cm: int | str | None, timeout: float | None,
               client_ids: Collection[str] | None = None) -> SliverStatus:
    """Poll SliverStatus at ``cm`` until the nodes ``client_ids`` (None: all) are ready."""
    try:
        return wait_for_nodes(lambda: server.sliver_status(cm=cm), client_ids=client_ids,
                              timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
                              report=lambda line: click.echo(line, err=True))
    except SliverWaitTimeout as err:
        raise WaitTimedOut(str(err)) from err
    except SliverFailedError as err:
        raise click.ClickException(str(err)) from err
