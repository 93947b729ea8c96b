"""Wheels made here: the installed distributions repacked, and the project's own wheel.

:mod:`elasticslice.pilots.wheelhouse` explains why (PEP 427: the files a distribution's
``RECORD`` lists, under ``site-packages``, with its ``.dist-info``; console scripts are left
to the installer, which makes them from ``entry_points.txt``). Wheels of this Python also
carry each module's bytecode for it, as unchecked hash-based pycs (PEP 552). The zips have
fixed timestamps and a fixed order.
"""
from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.metadata as md
import importlib.util
import marshal
import os
import re
import sys
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path

from elasticslice.errors import ElasticSliceError

PROJECT = "elasticslice"
PROJECT_PACKAGES = ("troy", "elasticslice")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_DIST_INFO = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}


class WheelhouseError(ElasticSliceError):
    """The wheelhouse cannot be built here (one line saying why)."""


def atomic_write(path: Path, make: Callable[[Path], object]) -> None:
    """``make(temp)`` writes the file, which then replaces ``path`` at once."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        make(temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _tags(dist: md.Distribution) -> str:
    """The wheel file name's tag triple from ``WHEEL``'s ``Tag:`` lines (compressed)."""
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "")
            .splitlines() if line.startswith("Tag:")]
    if not tags:
        return "py3-none-any"
    parts = [t.split("-") for t in tags]
    sets = [sorted({p[i] for p in parts}) for i in range(3)]
    if len(sets[0]) * len(sets[1]) * len(sets[2]) == len(set(tags)):
        return "-".join(".".join(s) for s in sets)
    return tags[0]


def wheel_name(dist: md.Distribution) -> str:
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    return f"{name}-{dist.version}-{_tags(dist)}.whl"


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _installed_code(source: Path, data: bytes) -> bytes | None:
    """The marshalled code in ``source``'s installed bytecode (``__pycache__``, as pip and
    ``make bytecode`` leave it) when the import system would take it for these bytes: this
    interpreter's magic number, and the source's time and size (a timestamp pyc) or its
    hash (a hash-based one); None otherwise."""
    pyc = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    try:
        raw = pyc.read_bytes()
        info = source.stat()
    except OSError:
        return None
    if len(raw) < 16 or raw[:4] != importlib.util.MAGIC_NUMBER or info.st_size != len(data):
        return None
    flags = int.from_bytes(raw[4:8], "little")
    if flags & 0b1:
        valid = raw[8:16] == importlib.util.source_hash(data)
    else:
        valid = (flags == 0
                 and int.from_bytes(raw[8:12], "little") == int(info.st_mtime) & 0xFFFFFFFF
                 and int.from_bytes(raw[12:16], "little") == info.st_size & 0xFFFFFFFF)
    return raw[16:] if valid else None


def _unchecked_pyc(arcname: str, data: bytes, source: Path | None = None
                   ) -> tuple[str, bytes] | None:
    """``arcname``'s bytecode for this interpreter as an unchecked hash-based pyc (PEP 552:
    used without looking at the source's time, which unpacking a wheel does not keep), and
    where it goes (``__pycache__/NAME.cpython-3X.pyc``); None when it does not compile.
    The code is the installed bytecode of ``source`` where it is valid (compiling every
    module again took most of a wheelhouse's build), else compiled here."""
    code = _installed_code(source, data) if source is not None else None
    if code is None:
        try:
            code = marshal.dumps(compile(data, arcname, "exec", dont_inherit=True))
        except (SyntaxError, ValueError):
            return None
    folder, _, name = arcname.rpartition("/")
    cached = f"__pycache__/{name[:-3]}.{sys.implementation.cache_tag}.pyc"
    pyc = (importlib.util.MAGIC_NUMBER + (0b1).to_bytes(4, "little")   # hash-based, unchecked
           + importlib.util.source_hash(data) + code)
    return (f"{folder}/{cached}" if folder else cached), pyc


class _WheelWriter:
    """A deterministic wheel: entries in the order written, fixed times, RECORD last.
    ``bytecode``: each module also as this interpreter's bytecode (a node whose Python is
    this one imports the agent without compiling it: about 2 s of CPU a node)."""

    def __init__(self, out: Path, bytecode: bool = False) -> None:
        # level 1: a third of level 6's CPU for wheels a few percent larger (they cross a LAN)
        self.zip = zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1)
        self.record: list[str] = []
        self.bytecode = bytecode

    def add(self, arcname: str, data: bytes, mode: int = 0o644,
            source: Path | None = None) -> None:
        """``data`` as ``arcname``; ``source``: the file it was read from (its installed
        bytecode is reused where valid)."""
        info = zipfile.ZipInfo(arcname, ZIP_TIME)
        info.external_attr = ((mode & 0o777) | 0o100000) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        self.record.append(_record_line(arcname, data))
        if self.bytecode and arcname.endswith(".py") and ".data/" not in arcname \
                and (compiled := _unchecked_pyc(arcname, data, source)) is not None:
            self.add(*compiled)

    def close(self, dist_info: str) -> None:
        record = f"{dist_info}/RECORD"
        self.add(record, ("\n".join([*self.record, f"{record},,"]) + "\n").encode())
        self.zip.close()


def repack(dist: md.Distribution, out: Path, bytecode: bool = False) -> None:
    """Write the installed ``dist`` as a wheel (PEP 427) to ``out`` (``bytecode``: with this
    interpreter's bytecode of each module, see :class:`_WheelWriter`)."""
    files = [f for f in dist.files or [] if "__pycache__" not in f.parts
             and not f.name.endswith(".pyc")]
    info_dirs = {f.parts[0] for f in files if f.parts[0].endswith(".dist-info")}
    if len(info_dirs) != 1:
        raise WheelhouseError(f"{dist.metadata['Name']}: no single .dist-info in its RECORD")
    dist_info = info_dirs.pop()
    data_dir = dist_info.removesuffix(".dist-info") + ".data"
    scripts = set()
    for entry in dist.entry_points:
        if entry.group in ("console_scripts", "gui_scripts"):
            scripts.add(entry.name)
    writer = _WheelWriter(out, bytecode)
    try:
        for f in sorted(files, key=lambda f: (f.parts[0] == dist_info, str(f))):
            if f.parts[0] == dist_info and f.name in _SKIP_DIST_INFO and len(f.parts) == 2:
                continue
            source = Path(str(dist.locate_file(f)))
            if f.parts[0] == "..":
                parts = Path(os.path.normpath(source)).relative_to(
                    Path(sys.prefix).resolve()).parts if _under_prefix(source) else ()
                if not parts:
                    continue
                if parts[0] == "bin":
                    if parts[-1] in scripts:  # made again from entry_points.txt
                        continue
                    data = re.sub(rb"^#![^\n]*python[^\n]*", b"#!python", source.read_bytes(),
                                  count=1)
                    writer.add(f"{data_dir}/scripts/{parts[-1]}", data, 0o755)
                else:
                    writer.add(f"{data_dir}/data/{'/'.join(parts)}", source.read_bytes())
                continue
            try:
                data = source.read_bytes()
                mode = source.stat().st_mode
            except OSError as err:
                raise WheelhouseError(f"{dist.metadata['Name']} {dist.version}: "
                                      f"{f} is missing ({err.strerror})") from err
            writer.add(str(f.as_posix()), data, mode, source)
        writer.close(dist_info)
    except BaseException:
        writer.zip.close()
        raise


def _under_prefix(path: Path) -> bool:
    try:
        Path(os.path.normpath(path)).relative_to(Path(sys.prefix).resolve())
        return True
    except ValueError:
        return False


def _project_dirs() -> list[Path]:
    return [Path(importlib.import_module(name).__file__).parent  # type: ignore[arg-type]
            for name in PROJECT_PACKAGES]


def _project_files() -> list[tuple[str, Path]]:
    found = []
    for top in _project_dirs():
        for path in top.rglob("*"):
            # compiled modules built here (troy.native: this machine's Python and
            # architecture) stay out of a py3-none-any wheel; a node runs their Python twins
            if "__pycache__" in path.parts or path.suffix in (".pyc", ".so") or \
                    not path.is_file():
                continue
            found.append((path.relative_to(top.parent).as_posix(), path))
    return sorted(found)


def project_wheel(directory: Path, bytecode: bool = False) -> tuple[Path, bool]:
    """The project's wheel, built again only when its sources changed (``bytecode``: with
    this interpreter's bytecode, for a wheelhouse of this Python)."""
    dist = md.distribution(PROJECT)
    name = f"{PROJECT}-{dist.version}-py3-none-any.whl"
    path = directory / name
    files = _project_files()
    metadata = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    digest = hashlib.sha256(metadata.encode() + (b"bytecode" if bytecode else b""))
    for arcname, source in files:
        info = source.stat()
        digest.update(f"{arcname}:{info.st_size}:{info.st_mtime_ns};".encode())
    key = digest.hexdigest()
    stamp = directory / ".project-key"
    if path.exists() and stamp.exists() and stamp.read_text() == key:
        return path, False

    def make(out: Path) -> None:
        dist_info = f"{PROJECT}-{dist.version}.dist-info"
        writer = _WheelWriter(out, bytecode)
        for arcname, source in files:
            writer.add(arcname, source.read_bytes(), source=source)
        writer.add(f"{dist_info}/METADATA", metadata.encode())
        writer.add(f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: "
                   b"elasticslice.pilots.wheelhouse\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        if dist.read_text("entry_points.txt"):
            writer.add(f"{dist_info}/entry_points.txt", dist.read_text("entry_points.txt")
                       .encode())
        writer.add(f"{dist_info}/top_level.txt", "\n".join(PROJECT_PACKAGES).encode() + b"\n")
        writer.close(dist_info)

    atomic_write(path, make)
    stamp.write_text(key)
    return path, True
