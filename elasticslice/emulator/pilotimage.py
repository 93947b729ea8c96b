"""The pilot image: the stock image plus this installation's Troy node agent.

What a CloudLab user would make by installing the agent on a node (``sudo pip install``
into the image's ``python3``) and snapshotting it: ``usr/local/lib/python3.X/dist-packages``
holding the project's packages (``troy``, ``elasticslice``, copied from this installation,
editable or not) and the exact versions of the agent's dependencies installed here (Dask,
Distributed and what they require; numpy too when installed here, for Dask's arrays, and
Parsl, for its worker pool: ``CloudLabProvider(node_python="python3")``), so
``python3 -m troy.frameworks.dask node ...`` runs on the node. The files are copied (hard
links where the file system allows) from this environment, whose Python must be the image's
minor version (compiled wheels are then ABI-compatible). Built once per set of versions and sources, into a cache next to the
environment (``<venv>/var/elasticslice-node-images/``, else ``~/.cache/elasticslice``).

Issue 20 replaces this with a bootstrap on the stock image; until then the pilots of the
box boot from this image.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import NamedTuple

from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

AGENT_DISTRIBUTIONS = ("distributed", "dask")
#: what Dask's collections need on a worker to even read their tasks (``dask[array]``:
#: numpy), in the image when installed here, as a user who runs Dask on the nodes installs
#: it (without it a dask.array task breaks the worker's connection: KilledWorker); Parsl, for
#: the Parsl provider's worker pools on an image that has them (``node_python``)
COLLECTION_DISTRIBUTIONS = ("numpy", "parsl")
PROJECT_PACKAGES = ("troy", "elasticslice")
IMAGE_PYTHON = "/usr/bin/python3"
STALE_AFTER = 24 * 3600.0  # seconds before an unused build of other sources is removed
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class PilotImageError(ElasticSliceError):
    """The pilot image cannot be built from this environment."""


def cache_root() -> Path:
    """Where builds are kept: in the virtualenv when there is a writable one."""
    if sys.prefix != sys.base_prefix and os.access(sys.prefix, os.W_OK):
        return Path(sys.prefix) / "var" / "elasticslice-node-images"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "elasticslice" / "node-images"


_VERSIONS: dict[tuple[int, int], tuple[int, int]] = {}  # (inode, mtime) of python3 -> version


def image_python_version() -> tuple[int, int]:
    """The major and minor version of the image's ``python3`` (asked once per binary)."""
    try:
        info = os.stat(IMAGE_PYTHON)
        stamp = (info.st_ino, info.st_mtime_ns)
    except OSError as err:
        raise PilotImageError(f"the image has no usable {IMAGE_PYTHON}: {err}") from err
    if stamp in _VERSIONS:
        return _VERSIONS[stamp]
    try:
        out = subprocess.run([IMAGE_PYTHON, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=True,
                             env={"PATH": "/usr/bin:/bin"}).stdout.split()
        version = int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as err:
        raise PilotImageError(f"the image has no usable {IMAGE_PYTHON}: {err}") from err
    _VERSIONS[stamp] = version
    return version


class _Dist(NamedTuple):
    """An installed distribution, its metadata read once (each ``.metadata`` parses the
    METADATA file again: reading them for every node boot cost ~40 ms of CPU)."""
    name: str
    version: str
    dist: md.Distribution


def _closure(names: tuple[str, ...]) -> list[_Dist]:
    """The distributions ``names`` need (their requirements without extras), installed."""
    seen: dict[str, _Dist] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-").replace(".", "-")
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError as err:
            raise PilotImageError(f"{name} is not installed here") from err
        meta = dist.metadata
        seen[key] = _Dist(meta["Name"], meta["Version"], dist)
        for req in meta.get_all("Requires-Dist") or []:
            if "extra ==" in req or "extra==" in req:
                continue
            if ";" in req and not _marker_ok(req.split(";", 1)[1]):
                continue
            match = _REQ_NAME.match(req)
            if match:
                todo.append(match.group(1))
    return list(seen.values())


#: the agent's distributions, per state of the import path's folders (installing or
#: removing a distribution changes its site-packages folder's mtime)
_CLOSURES: dict[tuple[tuple[str, int], ...], list[_Dist]] = {}


def _agent_dists() -> list[_Dist]:
    stamp = []
    for entry in sys.path:
        try:
            stamp.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            continue
    key = tuple(stamp)
    if key not in _CLOSURES:
        roots = (*AGENT_DISTRIBUTIONS, *_installed(COLLECTION_DISTRIBUTIONS))
        _CLOSURES.clear()
        _CLOSURES[key] = [d for d in _closure(roots) if d.name.lower() not in PROJECT_PACKAGES]
    return _CLOSURES[key]


def _installed(names: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for name in names:
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            continue
        out.append(name)
    return tuple(out)


def _marker_ok(marker: str) -> bool:
    try:
        from packaging.markers import Marker
    except ImportError:  # without packaging: take it (a needless copy is harmless)
        return True
    try:
        return Marker(marker).evaluate({"extra": ""})
    except Exception:  # noqa: BLE001 - an odd marker: take the requirement
        return True


def _top_levels(dist: md.Distribution) -> set[str]:
    """The top-level files and folders of a distribution in its site-packages."""
    tops = set()
    for file in dist.files or []:
        parts = Path(file).parts
        if parts and parts[0] != ".." and not parts[0].endswith(".pth"):
            tops.add(parts[0])
    return tops


def _project_dirs() -> list[Path]:
    import importlib
    return [Path(importlib.import_module(name).__file__).parent  # type: ignore[arg-type]
            for name in PROJECT_PACKAGES]


def _key(version: tuple[int, int], dists: list[_Dist]) -> str:
    digest = hashlib.sha256(f"{version}{sys.version}".encode())
    for dist in sorted(dists, key=lambda d: d.name.lower()):
        digest.update(f"{dist.name}=={dist.version};".encode())
    # every node boot asks: os.walk and strings, not rglob and Paths (which also walked
    # every __pycache__), 0.9 ms where they took 8 ms
    for top in _project_dirs():
        base = len(str(top.parent)) + 1
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = os.path.join(folder, name)
                try:
                    info = os.stat(path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    digest.update(f"{path[base:]}:{info.st_size}:{info.st_mtime_ns};".encode())
    return digest.hexdigest()[:20]


def _link_tree(source: Path, target: Path) -> None:
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True, copy_function=link,
                        ignore=shutil.ignore_patterns("*.pth"))
    else:
        link(str(source), str(target))


def agent_image() -> Path:
    """The pilot image's folder (built now if this environment has none yet)."""
    version = image_python_version()
    if version != sys.version_info[:2]:
        raise PilotImageError(
            f"the image's python3 is {version[0]}.{version[1]}, this environment's "
            f"{sys.version_info[0]}.{sys.version_info[1]}: the pilot image copies this "
            "environment's packages, so they must be the same minor version")
    dists = _agent_dists()
    root = cache_root()
    built = root / _key(version, dists)
    if (built / ".complete").exists():
        os.utime(built)
        return built
    staging = root / f".build-{uuid.uuid4().hex}"
    site = staging / "usr" / "local" / "lib" / f"python{version[0]}.{version[1]}" / \
        "dist-packages"
    try:
        site.mkdir(parents=True)
        for dist in dists:
            base = Path(str(dist.dist.locate_file("")))
            for top in _top_levels(dist.dist):
                if (base / top).exists() and not (site / top).exists():
                    _link_tree(base / top, site / top)
        for package in _project_dirs():
            _link_tree(package, site / package.name)
        (staging / ".complete").touch()
        try:
            os.replace(staging, built)
        except OSError:  # another process built it meanwhile
            if not (built / ".complete").exists():
                raise
    except OSError as err:
        raise PilotImageError(f"cannot build the pilot image in {root}: {err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("built the pilot image in %s (%d distributions)", built, len(dists))
    _prune(root, keep=built)
    return built


def _prune(root: Path, keep: Path) -> None:
    """Remove builds of other sources nobody used for a day."""
    now = time.time()
    for entry in root.iterdir():
        if entry != keep and entry.is_dir() and now - entry.stat().st_mtime > STALE_AFTER:
            shutil.rmtree(entry, ignore_errors=True)
