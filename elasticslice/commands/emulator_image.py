"""`elasticslice emulator image ...`: the disk images nodes boot from (add, list)."""
from __future__ import annotations

import json
from pathlib import Path

import click

# elasticslice.emulator.images and .setup are imported by the commands that use them:
# every `emulator` command imports this module, for DIR_OPTION

#: the emulator directory, an option of every ``emulator`` command
DIR_OPTION = click.option("--dir", "directory", required=True, envvar="ELASTICSLICE_EMULATOR_DIR",
                          type=click.Path(file_okay=False, path_type=Path),
                          help="The emulator directory (env: ELASTICSLICE_EMULATOR_DIR).")


@click.group("image")
def image_group() -> None:
    """Disk images nodes boot from: the stock image (the host's system, read-only) and
    custom images laid over it, each with its python3 and architecture (docs/emulator.md,
    "Custom images")."""


@image_group.command("add")
@DIR_OPTION
@click.argument("name")
@click.argument("source", required=False,
                type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--python", "python", metavar="PATH|X.Y", default=None,
              help="The image's python3: an interpreter of this machine (e.g. "
                   "/root/.pyenv/versions/3.10.13/bin/python3.10), or a version (3.10) to "
                   "find one (pyenv's, /usr/bin/python3.X, uv's). Nodes see it as "
                   "/usr/bin/python3.X and python3, without pip and ensurepip. Default: the "
                   "stock image's (this machine's /usr/bin/python3).")
@click.option("--arch", default=None, metavar="x86_64|aarch64",
              help="The image's architecture (default this machine's). Another is a "
                   "label: the node's python3 reports it to sysconfig and pip (linux-"
                   "aarch64), so wheels of another architecture are refused; the code "
                   "still runs on this machine's CPU.")
def image_add_cmd(directory: Path, name: str, source: Path | None, python: str | None,
                  arch: str | None) -> None:
    """Make custom image NAME from folder SOURCE (copied into DIR), laid over the stock
    image, with its own python3 (--python) and architecture (--arch).

    Nodes whose disk_image is its URN (printed) boot from it; no other node sees its files.
    SOURCE holds the files as they are on the node (usr/local/..., opt/..., root/...); it
    may be left out when --python or --arch is given. Works whether or not the server runs
    (it reads the images at each boot)."""
    from elasticslice.emulator.images import Images
    from elasticslice.emulator.setup import load_config
    cfg = load_config(directory)
    images = Images(directory.resolve(), cfg.identity, cfg.project)
    urn = images.add(name, source, python=python, arch=arch)
    info = images.info(name)
    click.echo(f"image {name} (python3 {info.python3}, {info.arch}): {urn}")


@image_group.command("list")
@DIR_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def image_list_cmd(directory: Path, as_json: bool) -> None:
    """The images nodes boot from: the stock image (this machine's system and python3)
    and the custom images of DIR, each with its python3 version, architecture and URN."""
    from elasticslice.emulator.images import Images, stock_info
    from elasticslice.emulator.setup import load_config
    cfg = load_config(directory)
    images = Images(directory.resolve(), cfg.identity, cfg.project)
    stock, custom = stock_info(), [images.info(name) for name in images.names()]
    if as_json:
        click.echo(json.dumps({"stock": stock.to_json(),
                               "images": [i.to_json() for i in custom]}, indent=2))
        return
    click.echo(f"{'NAME':24} {'PYTHON3':8} {'ARCH':8} URN")
    click.echo(f"{stock.name:24} {stock.python3:8} {stock.arch:8} the inventory's images "
               "(UBUNTU22-64-STD...): this machine's /usr/bin/python3")
    for info in custom:
        click.echo(f"{info.name:24} {info.python3:8} {info.arch:8} {info.urn}")
