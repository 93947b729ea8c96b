"""A node's files as the host keeps them, and the machine its init builds from them.

``D/nodes/<node>/`` belongs to the box, never to the node::

    root/          the node's own ``/``: its writable tree (/tmp, /var, /root, /local...,
                   tarballs installed at / or elsewhere); the image is mounted over it
    layer/         files its tarballs put under the image's folders (/usr, /etc...),
                   overlaid read-only on the image
    geni/          what ``geni-get`` needs (``tmcd.json``), read-only at /var/emulab/boot/geni
    startup.log    the startup commands' output
    .startup-pgids the process groups of its startup commands (:mod:`.orphans`)

The emulator writes only there and in ``root/`` before the node's first process starts, so
no link a node makes in its own tree can lead the emulator's writes astray.
"""
from __future__ import annotations

import logging
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticslice.emulator.images import (PRIVATE_DIRS, RESERVED_DIRS, STOCK_DIRS, Image,
                                          host_links, merge_usr)
from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

GENI_MOUNT = "var/emulab/boot/geni"
HOST_NAME_MAX = 64


class InstallError(ElasticSliceError):
    """A tarball could not be installed on a node."""


@dataclass(frozen=True)
class NodeDir:
    """The paths of one node's folder on the host."""

    path: Path

    @property
    def root(self) -> Path:
        return self.path / "root"

    @property
    def layer(self) -> Path:
        return self.path / "layer"

    @property
    def geni(self) -> Path:
        return self.path / "geni"

    @property
    def log(self) -> Path:
        return self.path / "startup.log"


def prepare(node: NodeDir, image: Image | None) -> None:
    """A freshly imaged disk: the node's root, with the image's files for its writable
    tree copied in (a node writes its own copy, as on CloudLab)."""
    node.root.mkdir(parents=True, exist_ok=True)
    node.geni.mkdir(exist_ok=True)
    if image is None:
        return
    for name in PRIVATE_DIRS:
        source = image.root / name
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, node.root / name, symlinks=True, dirs_exist_ok=True)


def install(tarball: Path, url: str, install_path: str, node: NodeDir) -> None:
    """Unpack a kept tarball on the node at ``install_path`` (inside its root)."""
    root = node.root.resolve()
    target = (root / install_path.lstrip("/")).resolve()
    if not target.is_relative_to(root):
        raise InstallError(f"install path {install_path} leaves the node's disk")
    if not tarball.is_file():
        raise InstallError(f"the testbed's copy of {url} is gone")
    target.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tarball) as tar:
            tar.extractall(target, filter="data")
    except (OSError, tarfile.TarError) as err:
        raise InstallError(f"cannot unpack {url}: {err} (the box installs tar archives: "
                           ".tar, .tar.gz, .tgz, .bz2)") from err


def settle(node: NodeDir) -> None:
    """After the tarballs: what they put under the image's folders moves to the node's
    layer (the image is mounted over those folders of its root)."""
    merge_usr(node.root)
    for name in STOCK_DIRS:
        source = node.root / name
        if source.is_dir() and not source.is_symlink():
            _merge_into(source, node.layer / name)
    for name in RESERVED_DIRS:
        source = node.root / name
        if source.is_dir() and not source.is_symlink() and any(source.iterdir()):
            log.warning("node %s: tarball files under /%s are hidden by the node's own",
                        node.path.name, name)


def _merge_into(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        target = dest / entry.name
        if entry.is_dir() and not entry.is_symlink() and target.is_dir():
            _merge_into(entry, target)
        else:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
    source.rmdir()


def hostname(fqdn: str, client_id: str) -> str:
    """The node's host name (its FQDN, or its client_id when that is too long)."""
    return fqdn if 0 < len(fqdn) <= HOST_NAME_MAX else client_id[:HOST_NAME_MAX]


def machine_spec(node: NodeDir, image: Image | None, box: Path | None, host: str,
                 hide: list[str]) -> dict[str, Any]:
    """What the node's init mounts (see :mod:`elasticslice.emulator.nodeinit`): the image's
    folders (layers, top first: the node's tarball files, the box's, the image's own, its
    system layer, the host's), the standard library of an image's own python3 over
    ``/usr/lib/python3.X``, and read-only binds (the image's other top-level folders, its
    python3's binary and libpython over their placeholders, the node's ``geni`` folder)."""
    tops = [node.layer, box, image.root if image else None, image.system if image else None]

    def layers(rel: str) -> list[str]:
        return [str(top / rel) for top in tops
                if top is not None and (top / rel).is_dir() and not (top / rel).is_symlink()]

    image_dirs = []
    for name in STOCK_DIRS:
        on_host = Path("/") / name
        if on_host.is_symlink() or not on_host.is_dir():
            continue
        image_dirs.append([name, [*layers(name), str(on_host)]])
    python = image.python if image is not None else None
    if python is not None and python.stdlib_mount():
        image_dirs.append([python.lib, [*layers(python.lib), python.stdlib]])
    binds = []
    if image is not None:
        for entry in sorted(image.root.iterdir()):
            if entry.is_dir() and not entry.is_symlink() and entry.name not in (
                    *STOCK_DIRS, *PRIVATE_DIRS, *RESERVED_DIRS):
                binds.append([entry.name, str(entry)])
    if python is not None:
        binds += [[rel, source] for rel, source in python.files()]
    binds.append([GENI_MOUNT, str(node.geni)])
    return {"root": str(node.root), "image": image_dirs, "links": host_links(),
            "binds": binds, "hide": hide, "hostname": host, "cwd": "/"}
