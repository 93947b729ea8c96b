"""A node's files as the host keeps them, and the machine its init builds from them.

``D/nodes/<node>/`` belongs to the box, never to the node::

    root/          the node's own ``/``: its writable tree (/tmp, /var, /root, /local...,
                   tarballs installed at / or elsewhere); the image is mounted over it
    layer/         files its tarballs put under the image's folders (/usr, /etc...),
                   overlaid read-only on the image
    geni/          what ``geni-get`` needs (``tmcd.json``) and the CM's ``geni_startup``
                   wrapper, read-only at /var/emulab/boot/geni
    startup.log    what the node's init itself says (isolation failures...)
    runlogs        the paths of the node's runlogs (``/var/emulab/logs/runlog.XXXXXX`` on
                   its disk, where its startup command's output goes), one a boot
    installed.json the tarballs installed on it: timestamp and MD5 of the CM's copy
                   (install-tarfile's ``/var/emulab/db/testbed.tarfiles``)
    .startup-pgids the process groups of its startup commands (:mod:`.orphans`)

The emulator writes into ``root/`` only before the node's first process starts, or while
the node is down (a reboot), and then only as :func:`install` does: nothing through a link
the node made that leads out of its tree. It reads a runlog only through
:meth:`NodeDir.runlog_text`, which follows no link.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticslice.emulator.images import (PRIVATE_DIRS, RESERVED_DIRS, STOCK_DIRS, Image,
                                          host_links, merge_usr)
from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

GENI_MOUNT = "var/emulab/boot/geni"
HOST_NAME_MAX = 64
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a node id, safe as a folder
RUNLOG = re.compile(r"^/var/emulab/logs/runlog\.[A-Za-z0-9]{6}$")
RUNLOG_LIMIT = 1 << 20  # what runlog_text reads at most: the end of a longer runlog


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

    @property
    def runlogs(self) -> Path:
        return self.path / "runlogs"

    @property
    def installed(self) -> Path:
        return self.path / "installed.json"

    def add_runlog(self, path: str) -> None:
        """Record the runlog the node's init made for this boot."""
        if RUNLOG.fullmatch(path):
            with open(self.runlogs, "a", encoding="ascii") as handle:
                handle.write(path + "\n")

    def runlog_path(self) -> str | None:
        """The node's last runlog, as the node names it (``/var/emulab/logs/runlog.X``)."""
        try:
            lines = self.runlogs.read_text(encoding="ascii").split()
        except (OSError, UnicodeDecodeError):
            return None
        return next((line for line in reversed(lines) if RUNLOG.fullmatch(line)), None)

    def runlog_text(self, limit: int = RUNLOG_LIMIT) -> str | None:
        """The text of the node's last runlog (its end, when longer than ``limit`` bytes);
        None when it has none. Read from its disk without following any link the node
        made: a runlog the node replaced with a link, a fifo or a folder reads as empty."""
        rel = self.runlog_path()
        if rel is None:
            return None
        try:
            fd = _open_beneath(self.root, rel)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                handle.seek(size - limit)
            return handle.read(limit).decode("utf-8", errors="replace")


def _open_beneath(root: Path, rel: str) -> int:
    """Open ``root/rel`` for reading, following no link at any step; a regular file only."""
    parts = rel.strip("/").split("/")
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, nofollow | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, nofollow | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], nofollow | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise OSError(f"{rel} is not a file")
    return leaf


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


Owners = Callable[[int], int]


def _member(owners: Owners | None) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
    """install-tarfile's ``tar -xvf`` as root with ``umask 0`` (``clientside/os/
    install-tarfile``): each member with the archive's mode and owners, ``owners`` mapping a
    node's uid or gid to the host's (:func:`elasticslice.emulator.nodeusers.host_id`; the
    chown happens where the emulator is root). Where a member may go is tarfile's "data"
    filter's rule (nothing outside the install path, no link out of it, no device); setuid
    and setgid bits of files are dropped (they would be the host's: the node's disk is a
    host folder)."""
    def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        name, linkname = _where(member, dest)
        mode = member.mode
        if not member.isdir():
            mode &= ~(stat.S_ISUID | stat.S_ISGID)
        kept = copy.copy(member)
        kept.name, kept.linkname, kept.mode = name, linkname, mode
        kept.uid = owners(member.uid) if owners is not None else member.uid
        kept.gid = owners(member.gid) if owners is not None else member.gid
        kept.uname = kept.gname = ""
        return kept
    return keep


class UnsafeMember(tarfile.TarError):
    """A member that the "data" filter refuses (where this Python has no such filter)."""


def _where(member: tarfile.TarInfo, dest: str) -> tuple[str, str]:
    """The member's name and link name as tarfile's "data" filter (PEP 706) leaves them, or
    its refusal. That filter's own checks where this Python has it; the same checks here
    where it has not (CPython before 3.10.12 and 3.11.4: Debian 12's 3.11.2 among them)."""
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is not None:
        safe = data_filter(member, dest)
        return safe.name, safe.linkname
    dest = os.path.realpath(dest)
    name = member.name.lstrip("/" + os.sep)

    def inside(path: str) -> bool:
        return os.path.commonpath([os.path.realpath(path), dest]) == dest

    if os.path.isabs(name) or not inside(os.path.join(dest, name)):
        raise UnsafeMember(f"{member.name!r} would be extracted outside the destination")
    if not (member.isreg() or member.islnk() or member.isdir() or member.issym()):
        raise UnsafeMember(f"{member.name!r} is a special file")
    if member.islnk() or member.issym():
        base = os.path.dirname(name) if member.issym() else ""
        if os.path.isabs(member.linkname) or \
                not inside(os.path.join(dest, base, member.linkname)):
            raise UnsafeMember(f"{member.name!r} links outside the destination")
    return name, member.linkname


def _extract(tar: tarfile.TarFile, target: Path, members: list[tarfile.TarInfo],
             keep: Callable[[tarfile.TarInfo, str], tarfile.TarInfo]) -> None:
    """``extractall`` with ``keep`` as its filter; where this Python's ``extractall`` takes
    none (before PEP 706), every member is filtered first, so nothing is written when one
    is refused."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(target, members=members, filter=keep, numeric_owner=True)
    else:
        kept = [keep(m, str(target)) for m in members]
        tar.extractall(target, members=kept, numeric_owner=True)


def install(tarball: Path, url: str, install_path: str, node: NodeDir,
            owners: Owners | None = None) -> None:
    """Unpack a kept tarball on the node at ``install_path`` (inside its root), with the
    archive's owners and modes; folders it needs that it does not hold are made as GNU tar
    makes them under ``umask 0`` (0777, root's)."""
    root = node.root.resolve()
    target = (root / install_path.lstrip("/")).resolve()
    if not target.is_relative_to(root):
        raise InstallError(f"install path {install_path} leaves the node's disk")
    if not tarball.is_file():
        raise InstallError(f"the testbed's copy of {url} is gone")
    target.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tarball) as tar:
            members = tar.getmembers()
            named = {os.path.normpath(m.name.lstrip("/")) for m in members}
            implicit = {parent for m in members
                        for parent in _parents(os.path.normpath(m.name.lstrip("/")))
                        if parent not in named and not (target / parent).exists()}
            _extract(tar, target, members, _member(owners))
    except (OSError, tarfile.TarError) as err:
        raise InstallError(f"cannot unpack {url}: {err} (the box installs tar archives: "
                           ".tar, .tar.gz, .tgz, .bz2)") from err
    for parent in sorted(implicit):
        path = target / parent
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o777)


def _parents(name: str) -> list[str]:
    parts = name.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[0] not in ("", "..")]


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def install_changed(node: NodeDir, tarballs: list[list[str]], kept: Callable[[str], Path],
                    owners: Owners | None = None) -> list[str]:
    """install-tarfile for each ``[url, install_path]``: skipped when the CM's kept copy
    (``kept(url)``) is no newer than at this node's last install of it, or has the same MD5
    (then only its timestamp is noted); else unpacked and noted. The URLs installed."""
    try:
        records = json.loads(node.installed.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        records = {}
    done = []
    for url, path in tarballs:
        copy, key = kept(url), f"{path} {url}"
        if not copy.is_file():
            raise InstallError(f"the testbed's copy of {url} is gone")
        stamp, old = int(copy.stat().st_mtime), records.get(key) or {}
        if old and old.get("stamp", -1) >= stamp:
            continue  # "Tarfile ... has already been installed!"
        md5 = _md5(copy)
        if md5 != old.get("md5"):
            install(copy, url, path, node, owners)
            done.append(url)
        records[key] = {"stamp": stamp, "md5": md5}
    staged = node.installed.with_name(".installed.json.tmp")
    staged.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    os.replace(staged, node.installed)
    return done


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
