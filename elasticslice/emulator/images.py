"""Disk images: the stock image every node boots from, and custom images laid over it.

The stock image is the host's operating system: ``/usr``, ``/etc`` and ``/bin``, ``/sbin``,
``/lib*`` (as the host has them, folders or links into ``/usr``), read-only on every node, as
UBUNTU22-64-STD is a full Ubuntu with its own ``python3``. The inventory's ``images`` are its
names (all the same system here).

A custom image is a folder laid over the stock image, as a CloudLab user snapshots a node
with their software installed: ``emulator image add NAME DIR`` copies DIR into
``D/images/NAME/`` and records it in ``D/images.json``; nodes whose ``disk_image`` is its
URN, ``urn:publicid:IDN+<domain>+image+<project>//NAME``, boot from it and no other node sees
its files. Its folders under the stock ones (``usr/local/...``) are overlaid read-only on
them; its folders for the node's own writable tree (``var``, ``root``, ``local``...) are
copied into a node's root when it boots; its other top-level folders (``opt``...) are bound
read-only.

An image may have its own ``python3`` and architecture (``image add --python PATH --arch
aarch64``, :mod:`elasticslice.emulator.imagepython`), as CloudLab's have theirs: its
*system layer*, ``D/images/.system/NAME/``, lies under its files on the image's folders
(``python3`` where Ubuntu has it, what hides the interpreter's pip and ensurepip), and the
node's init binds the interpreter's files into it. ``images.json`` records, per image,
``dir``, ``arch`` and, with ``--python``, ``python`` (the interpreter: its version, binary,
standard library, libpython); an image without one has the stock image's ``python3``.

``init`` registers one more image, ``ELASTICSLICE-PILOT`` (:data:`PILOT_IMAGE`): the stock
image plus this installation's Troy node agent for the image's ``python3``
(:mod:`elasticslice.emulator.pilotimage`), built when a node first boots from it and cached.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticslice.emulator.authority import Identity
from elasticslice.emulator.imagepython import (HOST_ARCH, ImageError, Interpreter,
                                               build_layer, check_arch, host_python,
                                               interpreter, stock_version)
from elasticslice.emulator.setup import write_atomic
from elasticslice.errors import ConfigError

log = logging.getLogger(__name__)

REGISTRY = "images.json"
PILOT_IMAGE = "ELASTICSLICE-PILOT"
PILOT_BUILTIN = "pilot-agent"
# the image's system folders, as on the host (each a folder or a link into /usr)
STOCK_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# the node's own writable tree: an image's files there are copied onto the node's disk
PRIVATE_DIRS = ("tmp", "var", "root", "local", "run")
# never taken from an image: the node's kernel views
RESERVED_DIRS = ("proc", "dev", "sys")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SYSTEM = "images/.system"  # the images' system layers (no image name starts with a dot)
__all__ = ["Image", "ImageError", "ImageInfo", "Images", "host_python", "image_name"]


@dataclass(frozen=True)
class Image:
    """A custom image: its name, the folder laid over the stock image and, when it has
    its own python3 or architecture, its system layer (under the folder) and interpreter."""

    name: str
    root: Path
    python: Interpreter | None = None
    arch: str = HOST_ARCH
    system: Path | None = None


@dataclass(frozen=True)
class ImageInfo:
    """What ``image list`` shows of an image: its ``python3`` version and architecture."""

    name: str
    urn: str
    python3: str
    arch: str
    interpreter: str | None = None  # the host's interpreter (None: the stock python3)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "urn": self.urn, "python3": self.python3,
                "arch": self.arch, "interpreter": self.interpreter}


def host_links() -> dict[str, str]:
    """The stock folders that are links on this host (``bin -> usr/bin``)."""
    return {name: os.readlink(f"/{name}") for name in STOCK_DIRS if os.path.islink(f"/{name}")}


def merge_usr(tree: Path) -> None:
    """Move a tree's ``bin``, ``lib``... into ``usr/...`` where the host has them as links
    (what a file installed at ``/bin/x`` becomes on such a system)."""
    for name, target in host_links().items():
        source = tree / name
        if source.is_dir() and not source.is_symlink():
            dest = tree / target.lstrip("/")
            dest.mkdir(parents=True, exist_ok=True)
            for entry in source.iterdir():
                os.replace(entry, dest / entry.name)
            source.rmdir()


def image_name(urn: str | None) -> str | None:
    """``urn:publicid:IDN+x+image+proj//NAME`` (or ``proj:NAME``, ``NAME:version``) -> NAME."""
    if not urn or "+image+" not in urn:
        return None
    name = urn.rsplit("+image+", 1)[1]
    name = name.rsplit("//", 1)[-1]
    if ":" in name:
        head, _, tail = name.rpartition(":")
        name = head.rsplit(":", 1)[-1] if tail.isdigit() else tail
    return name or None


class Images:
    """The custom images of an emulator directory (read on every use: ``image add`` works
    while the emulator serves)."""

    def __init__(self, directory: Path, identity: Identity, project: str) -> None:
        self.directory = directory
        self.identity = identity
        self.project = project

    def urn(self, name: str) -> str:
        return f"urn:publicid:IDN+{self.identity.domain}+image+{self.project}//{name}"

    def _registry(self) -> dict[str, Any]:
        try:
            data = json.loads((self.directory / REGISTRY).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise ImageError(f"{self.directory / REGISTRY}: unreadable: {err}") from err
        return data if isinstance(data, dict) else {}

    def names(self) -> list[str]:
        return sorted(self._registry())

    def register_pilot(self) -> None:
        """Offer the pilot image (``init`` does)."""
        registry = self._registry()
        registry[PILOT_IMAGE] = {"builtin": PILOT_BUILTIN}
        self._save(registry)

    def add(self, name: str, source: Path | None = None, *, python: str | None = None,
            arch: str | None = None) -> str:
        """Make custom image NAME: ``source`` copied into ``D/images/NAME`` (none: no files
        of its own), with ``python`` (a host interpreter, or a version :func:`host_python`
        finds) as its ``python3`` and ``arch`` as its architecture; its URN."""
        if not NAME.fullmatch(name):
            raise ConfigError(f"image name {name!r}: 1-64 letters, digits, '.', '_', '-'",
                              key="NAME")
        if name in self._registry():
            raise ConfigError(f"image {name!r} exists already", path=str(self.directory))
        if source is None and python is None and arch is None:
            raise ImageError(f"image {name}: give its folder (DIR), --python or --arch")
        arch = check_arch(arch)
        found = interpreter(python) if python is not None else None
        target = self.directory / "images" / name
        if source is not None:
            self._copy(Path(source), target)
        else:
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
        entry: dict[str, Any] = {"dir": f"images/{name}", "arch": arch}
        if found is not None or arch != HOST_ARCH:
            build_layer(self.directory / SYSTEM / name, found, arch)
            entry["system"] = f"{SYSTEM}/{name}"
        if found is not None:
            entry["python"] = found.to_json()
        registry = self._registry()
        registry[name] = entry
        self._save(registry)
        log.info("image %s added (%s, python3 %s)%s", name, arch,
                 found.version if found else "of the stock image",
                 f" from {source}" if source is not None else "")
        return self.urn(name)

    @staticmethod
    def _copy(source: Path, target: Path) -> None:
        if not source.is_dir():
            raise ConfigError("not a folder", path=str(source))
        reserved = [n for n in RESERVED_DIRS if (source / n).exists()]
        if reserved:
            raise ConfigError(f"an image may not hold /{reserved[0]} (the node's own)",
                              path=str(source))
        if target.exists():
            shutil.rmtree(target)
        try:
            shutil.copytree(source, target, symlinks=True)
        except (OSError, shutil.Error) as err:
            shutil.rmtree(target, ignore_errors=True)
            raise ImageError(f"cannot copy {source} into {target}: {err}") from err
        merge_usr(target)

    def _save(self, registry: dict[str, Any]) -> None:
        write_atomic(self.directory / REGISTRY, json.dumps(registry, indent=2) + "\n")

    def resolve(self, disk_image: str | None) -> Image | None:
        """The custom image a node boots from, or None for the stock image (an image the
        box does not know boots the stock one: see docs/emulator.md)."""
        name = image_name(disk_image)
        entry = self._registry().get(name or "")
        if entry is None:
            return None
        if entry.get("builtin") == PILOT_BUILTIN:
            from elasticslice.emulator import pilotimage
            return Image(str(name), pilotimage.agent_image())
        images = self.directory.resolve() / "images"
        root = (self.directory / str(entry.get("dir", ""))).resolve()
        if not root.is_relative_to(images) or not root.is_dir():
            raise ImageError(f"image {name}: its folder {root} is missing")
        python = Interpreter.from_json(entry["python"]) if entry.get("python") else None
        gone = python.missing() if python is not None else None
        if gone:
            raise ImageError(f"image {name}: its python3's {gone} is gone from this machine")
        system = None
        if entry.get("system"):
            system = (self.directory / str(entry["system"])).resolve()
            if not system.is_relative_to(images) or not system.is_dir():
                raise ImageError(f"image {name}: its system layer {system} is missing")
        return Image(str(name), root, python, str(entry.get("arch") or HOST_ARCH), system)

    def info(self, name: str) -> ImageInfo:
        """The ``python3`` version and architecture of custom image NAME."""
        entry = self._registry()[name]
        python = entry.get("python") or {}
        return ImageInfo(name, self.urn(name), python.get("version") or stock_version(),
                         str(entry.get("arch") or HOST_ARCH), python.get("path"))

    def describe(self, disk_image: str | None) -> ImageInfo:
        """What nodes booted from ``disk_image`` have: a custom image's, else the stock's
        (``urn`` empty)."""
        name = image_name(disk_image)
        if name in self._registry():
            return self.info(str(name))
        return stock_info()


def stock_info() -> ImageInfo:
    """The stock image's: this machine's ``/usr/bin/python3`` and architecture."""
    return ImageInfo("(stock)", "", stock_version(), HOST_ARCH)
