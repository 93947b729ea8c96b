"""The node's software: a wheelhouse of exactly what the control node runs.

A node booted from a stock image has its ``python3`` and nothing of ours. Its start script
(:mod:`elasticslice.pilots.bootstrap`) builds the node agent's environment from a
*wheelhouse* the control node serves: the project's own wheel (the ``elasticslice``
distribution, which holds ``troy``) and one wheel per distribution that Troy's node agent
and the node's enrolment client need (``distributed``, ``dask``, ``cryptography`` and what
they require), each at the version installed here.

How the wheels are obtained, and why:

- **Same Python (major.minor) and platform as this interpreter** (the box, CI, a control
  node of the image's release): the installed distributions are *repacked* into wheels
  (PEP 427: the files their ``RECORD`` lists, under ``site-packages``, with their
  ``.dist-info``; console scripts are left to the installer, which makes them from
  ``entry_points.txt``). That is exact (byte for byte the modules the control node runs,
  whatever index or local build they came from), needs no network (a fresh CI clone has
  just installed them; nothing is fetched again), and is fast (about 2 s for ~24
  distributions, once). pip's cache is not used: its layout is pip's private business and
  is empty when pip ran with ``--no-cache-dir``.
- **Another Python or platform** (a control node on 3.12 for an image with 3.10, say):
  compiled wheels cannot be repacked across ABIs, so ``pip download --only-binary=:all:
  --python-version X.Y --implementation cp --abi cpXY --platform TAG`` fetches them from the
  package index, with every distribution installed here pinned (``-c``) to its version;
  the closure is resolved for the *target* interpreter (markers differ between versions).
- **The project** (``troy`` and ``elasticslice``) is installed editable: its wheel is built
  here from the package folders (every file but bytecode, as setuptools would package
  them) with the installed metadata; no build backend or network is needed. The zip has
  fixed timestamps and a fixed order.
- Wheels of this Python (repacked, and the project's) also carry each module's bytecode for
  it, as unchecked hash-based pycs (PEP 552: valid whatever time the node's unpacking gives
  the sources): a node whose ``python3`` is this one imports the agent without compiling
  it. Bytecode is not byte-for-byte reproducible (marshal depends on reference counts), so
  two builds give the same files and sources, not the same bytes.

Everything is cached per (Python version, platform) under the virtualenv,
``<venv>/var/wheelhouse/cpXY-<platform>/`` (else ``~/.cache/elasticslice/wheelhouse``), and
reused: a wheel is made again only when its distribution's version changes, the project's
wheel only when its sources change. The folder holds the wheels and:

- ``index.html``: every wheel with its ``#sha256=``: ``pip install --find-links URL/index.html``;
- ``simple/``: a PEP 503 index (``simple/<name>/index.html``): ``pip --index-url URL/simple/``;
- ``wheels.txt``: ``sha256 size file`` per wheel, after a ``# python X.Y`` line: what
  :func:`~elasticslice.pilots.bootstrap.env_script` installs;
- ``requirements.txt``: the third-party pins (``name==version``), for ``env_script(...,
  index=True)``, which installs them from the package index and only the project's wheel from
  here; ``tools/pip-*.whl``: pip itself, which that mode runs as ``python pip.whl/pip``;
- ``wheelhouse.json``: Python version, platform, pins.
"""
from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import html
import importlib
import importlib.metadata as md
import importlib.util
import json
import logging
import marshal
import os
import platform as _platform
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

AGENT_REQUIREMENTS = ("distributed", "dask", "cryptography")
PROJECT = "elasticslice"
PROJECT_PACKAGES = ("troy", "elasticslice")
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?$")
_SKIP_DIST_INFO = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}


class WheelhouseError(ElasticSliceError):
    """The wheelhouse cannot be built here (one line saying why)."""


def canonical(name: str) -> str:
    """PEP 503 name: ``PyYAML`` -> ``pyyaml``, ``lazy_importer`` -> ``lazy-importer``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def cache_root() -> Path:
    """Where wheelhouses are kept: ``<venv>/var/wheelhouse`` when there is a writable venv."""
    if sys.prefix != sys.base_prefix and os.access(sys.prefix, os.W_OK):
        return Path(sys.prefix) / "var" / "wheelhouse"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "elasticslice" / "wheelhouse"


def this_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def this_platform() -> str:
    """This machine's platform tag as the images' wheels need it: ``manylinux_2_36_x86_64``
    on glibc Linux (the newest manylinux it runs), else ``sysconfig``'s."""
    import sysconfig
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    libc, version = _platform.libc_ver()
    if plat.startswith("linux_") and libc == "glibc" and version:
        major, minor = version.split(".")[:2]
        return f"manylinux_{major}_{minor}_{plat.removeprefix('linux_')}"
    return plat


@dataclass
class Wheelhouse:
    """A folder of wheels for one Python version and platform (see the module's doc)."""

    directory: Path
    python: str
    platform: str
    pins: dict[str, str]
    wheels: list[Path] = field(default_factory=list)
    method: str = "repack"
    built: bool = False  # whether this call made or fetched any wheel

    @property
    def tag(self) -> str:
        return self.directory.name

    @classmethod
    def for_python(cls, version: str | None = None, *, platform: str | None = None,
                   root: Path | str | None = None, extra: tuple[str, ...] = ()) -> Wheelhouse:
        """The wheelhouse for Python ``version`` (``"3.11"``; default: this interpreter's)
        on ``platform`` (default: this machine's), built now unless the cache has it.
        ``extra``: installed distributions the nodes need besides the agent's (e.g.
        ``("parsl",)``): their closure too, in a wheelhouse of its own (``...-parsl``)."""
        version = version or this_python()
        match = _VERSION.match(str(version).strip())
        if not match:
            raise WheelhouseError(f"Python version {version!r}: expected MAJOR.MINOR, "
                                  "e.g. 3.11")
        version = f"{match.group(1)}.{match.group(2)}"
        platform = platform or this_platform()
        if not re.fullmatch(r"[A-Za-z0-9_]+", platform):
            raise WheelhouseError(f"platform {platform!r}: expected a wheel platform tag, "
                                  "e.g. manylinux_2_35_x86_64")
        extra = tuple(sorted({canonical(name) for name in extra}))
        if any(not re.fullmatch(r"[a-z0-9-]+", name) for name in extra):
            raise WheelhouseError(f"extra distributions {extra!r}: expected names, e.g. parsl")
        base = Path(root) if root is not None else cache_root()
        directory = base / "-".join([f"cp{version.replace('.', '')}", platform, *extra])
        same = version == this_python() and platform == this_platform()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with _locked(base / f".{directory.name}.lock"):
                return _build(directory, version, platform, same, extra)
        except OSError as err:
            raise WheelhouseError(f"cannot build the wheelhouse in {directory}: "
                                  f"{err.strerror or err}") from err

    def manifest(self) -> str:
        """``wheels.txt``'s text."""
        return (self.directory / "wheels.txt").read_text()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder per wheelhouse at a time (parallel test workers share the cache)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------- what the agent needs ------
def closure(names: tuple[str, ...] = AGENT_REQUIREMENTS) -> list[md.Distribution]:
    """The installed distributions ``names`` need (requirements without extras, markers
    evaluated for this interpreter), the project excluded."""
    from packaging.requirements import Requirement
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = canonical(todo.pop())
        if name in seen or name == PROJECT:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError as err:
            raise WheelhouseError(f"{name} is not installed here: the wheelhouse holds the "
                                  "versions this environment runs") from err
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            todo.append(req.name)
    return sorted(seen.values(), key=lambda d: canonical(d.metadata["Name"]))


def _pins(dists: list[md.Distribution]) -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version for d in dists}


# ------------------------------------------------------------------------ the build --------
FORMAT = "2"  # 2: wheels of this Python carry its bytecode; a cache of another is made again


def _build(directory: Path, version: str, platform: str, same: bool,
           extra: tuple[str, ...] = ()) -> Wheelhouse:
    started = time.monotonic()
    stamp = directory / ".format"
    if not stamp.exists() or stamp.read_text().strip() != FORMAT:
        for old in [*directory.glob("*.whl"), *directory.glob("tools/*.whl"),
                    directory / ".project-key"]:
            old.unlink(missing_ok=True)
        stamp.write_text(FORMAT + "\n")
    dists = closure((*AGENT_REQUIREMENTS, *extra))
    built = False
    if same:
        wanted: dict[str, Path] = {}
        for dist in dists:
            path = directory / wheel_name(dist)
            if not path.exists():
                _atomic_write(path, lambda out, d=dist: repack(d, out, bytecode=True))
                built = True
            wanted[canonical(dist.metadata["Name"])] = path
        pins = _pins(dists)
        method = "repack"
    else:
        wanted, built = _download(directory, version, platform, _pins(dists))
        pins = {name: _version_of(path) for name, path in wanted.items()}
        method = "download"
    project, made = _project_wheel(directory, bytecode=same)
    built = built or made
    pins[PROJECT] = md.version(PROJECT)
    wheels = sorted([*wanted.values(), project], key=lambda p: p.name.lower())
    tools = directory / "tools"
    tools.mkdir(exist_ok=True)
    pip = md.distribution("pip")
    pip_wheel = tools / wheel_name(pip)
    if not pip_wheel.exists():
        _atomic_write(pip_wheel, lambda out: repack(pip, out))
        built = True
    for stale in [*directory.glob("*.whl"), *tools.glob("*.whl")]:
        if stale not in wheels and stale != pip_wheel:
            stale.unlink(missing_ok=True)
    _write_indexes(directory, version, platform, wheels, pins, [pip_wheel])
    house = Wheelhouse(directory, version, platform, pins, wheels, method, built)
    if built:
        log.info("built the wheelhouse %s (%d wheels, %s) in %.1f s", directory,
                 len(wheels), method, time.monotonic() - started)
    return house


def _atomic_write(path: Path, make) -> None:  # noqa: ANN001 - make(out: Path)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        make(temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _version_of(wheel: Path) -> str:
    return wheel.name.split("-")[1]


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
            if "__pycache__" in path.parts or path.suffix == ".pyc" or not path.is_file():
                continue
            found.append((path.relative_to(top.parent).as_posix(), path))
    return sorted(found)


def _project_wheel(directory: Path, bytecode: bool = False) -> tuple[Path, bool]:
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

    _atomic_write(path, make)
    stamp.write_text(key)
    return path, True


def compatible_platforms(platform: str) -> list[str]:
    """``platform`` and the older manylinux tags a machine of it runs (pip download takes
    ``--platform`` literally)."""
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if not match:
        return [platform]
    major, minor, arch = int(match.group(1)), int(match.group(2)), match.group(3)
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for m in range(minor, 4, -1):
        tags.append(f"manylinux_{major}_{m}_{arch}")
        if major == 2 and m in legacy:
            tags.append(f"{legacy[m]}_{arch}")
    return tags


def _download(directory: Path, version: str, platform: str, pins: dict[str, str]
              ) -> tuple[dict[str, Path], bool]:
    """Wheels for another interpreter, from the package index, pinned to the versions here."""
    request = {"python": version, "platform": platform, "pins": pins}
    stamp = directory / ".download.json"
    if stamp.exists():
        try:
            done = json.loads(stamp.read_text())
            if done.get("request") == request and all(
                    (directory / f).exists() for f in done["wheels"].values()):
                return {n: directory / f for n, f in done["wheels"].items()}, False
        except (ValueError, KeyError, TypeError):
            pass
    staging = directory / f".download-{uuid.uuid4().hex}"
    constraints = staging / "constraints.txt"
    staging.mkdir()
    try:
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        abi = f"cp{version.replace('.', '')}"
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
               "--python-version", version, "--implementation", "cp", "--abi", abi,
               "--abi", "abi3", "--abi", "none",
               *(word for tag in compatible_platforms(platform) for word in ("--platform", tag)),
               "-c", str(constraints), "-d", str(staging), *AGENT_REQUIREMENTS]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            lines = [x for x in done.stderr.splitlines() if x.strip()]
            raise WheelhouseError(f"pip download for Python {version} on {platform} failed: "
                                  f"{lines[-1] if lines else done.returncode}")
        wheels: dict[str, str] = {}
        for wheel in sorted(staging.glob("*.whl")):
            os.replace(wheel, directory / wheel.name)
            wheels[canonical(wheel.name.split("-")[0])] = wheel.name
        stamp.write_text(json.dumps({"request": request, "wheels": wheels}))
        return {n: directory / f for n, f in wheels.items()}, True
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ------------------------------------------------------------------------ the indexes ------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_indexes(directory: Path, version: str, platform: str, wheels: list[Path],
                   pins: dict[str, str], tools: list[Path]) -> None:
    sums = {w: _sha256(w) for w in wheels}

    def page(title: str, links: list[tuple[str, str]]) -> str:
        body = "\n".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a><br>'
                         for href, text in links)
        return (f"<!DOCTYPE html>\n<html><head><title>{html.escape(title)}</title></head>"
                f"<body>\n{body}\n</body></html>\n")

    files: dict[str, str] = {
        "index.html": page("wheelhouse", [(f"{w.name}#sha256={sums[w]}", w.name)
                                          for w in wheels]),
        "wheels.txt": f"# python {version} platform {platform}\n" + "".join(
            f"{sums[w]} {w.stat().st_size} {w.name}\n" for w in wheels) + "".join(
            f"#tool {_sha256(t)} {t.stat().st_size} tools/{t.name}\n" for t in tools),
        "requirements.txt": "".join(f"{n}=={v}\n" for n, v in sorted(pins.items())
                                    if n != PROJECT),
        "wheelhouse.json": json.dumps({"python": version, "platform": platform,
                                       "pins": dict(sorted(pins.items())),
                                       "project": next(w.name for w in wheels if
                                                       canonical(w.name.split("-")[0])
                                                       == PROJECT)}, indent=1) + "\n",
        "simple/index.html": page("simple", [(f"{canonical(w.name.split('-')[0])}/",
                                              canonical(w.name.split("-")[0]))
                                             for w in wheels]),
    }
    for w in wheels:
        files[f"simple/{canonical(w.name.split('-')[0])}/index.html"] = page(
            w.name, [(f"../../{w.name}#sha256={sums[w]}", w.name)])
    names = {canonical(w.name.split("-")[0]) for w in wheels}
    simple = directory / "simple"
    for entry in simple.iterdir() if simple.is_dir() else ():
        if entry.is_dir() and entry.name not in names:
            shutil.rmtree(entry, ignore_errors=True)
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            _atomic_write(path, lambda out, t=text: out.write_text(t))


def main(argv: list[str] | None = None) -> int:
    """``python -m elasticslice.pilots.wheelhouse [--python X.Y] [--platform TAG]``: build (or
    find in the cache) the wheelhouse and print where it is, what it holds and how it was
    made; one line and exit status 1 when it cannot be built."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m elasticslice.pilots.wheelhouse",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("--python", default=None, metavar="X.Y",
                        help="the nodes' Python version (default: this one's, "
                             f"{this_python()})")
    parser.add_argument("--platform", default=None, metavar="TAG",
                        help=f"the nodes' wheel platform (default: {this_platform()})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        house = Wheelhouse.for_python(args.python, platform=args.platform)
    except WheelhouseError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    size = sum(w.stat().st_size for w in house.wheels) / 1e6
    print(f"{house.directory}: {len(house.wheels)} wheels, {size:.1f} MB, Python "
          f"{house.python} on {house.platform}, "
          f"{('built (' + house.method + ')') if house.built else 'from the cache'} in "
          f"{time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
