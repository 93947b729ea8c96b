"""`elasticslice` sub-commands: emulator (being built)."""
from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Attach this module's commands to the top-level group."""
