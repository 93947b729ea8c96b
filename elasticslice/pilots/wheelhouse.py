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
  (:mod:`elasticslice.pilots.wheelpack`; PEP 427: the files their ``RECORD`` lists, under
  ``site-packages``, with their ``.dist-info``; console scripts are left to the installer,
  which makes them from ``entry_points.txt``). That is exact (byte for byte the modules the
  control node runs, whatever index or local build they came from), needs no network (a
  fresh CI clone has just installed them; nothing is fetched again), and is fast (about 2 s
  for ~24 distributions, once). pip's cache is not used: its layout is pip's private
  business and is empty when pip ran with ``--no-cache-dir``.
- **Another Python or platform** (a control node on 3.11 for an image with 3.10, an ARM64
  node): compiled wheels cannot be repacked across ABIs, so ``pip download
  --only-binary=:all: --python-version X.Y --implementation cp --abi cpXY --platform TAG``
  fetches them from the package index, with every distribution installed here pinned to its
  version, or, where the index has no wheel of that version for the target, only what the
  scheduler and its workers must share pinned and the rest at most this environment's
  version (:mod:`elasticslice.pilots.wheeldownload`); the closure is resolved for the
  *target* interpreter (markers differ between versions).
- **The project** (``troy`` and ``elasticslice``) is installed editable: its wheel is built
  here from the package folders (every file but bytecode, as setuptools would package
  them) with the installed metadata; no build backend or network is needed. The zip has
  fixed timestamps and a fixed order.
- Wheels of this Python (repacked, and the project's) also carry each module's bytecode for
  it, as unchecked hash-based pycs (PEP 552: valid whatever time the node's unpacking gives
  the sources): a node whose ``python3`` is this one imports the agent without compiling
  it. Bytecode is not byte-for-byte reproducible (marshal depends on reference counts), so
  two builds give the same files and sources, not the same bytes.

Which wheelhouse a node gets is the wheelhouse root's business
(:mod:`elasticslice.pilots.wheelroot`: one URL, each node asks for its Python, machine and
glibc, the control node builds what it lacks in the background).

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

import contextlib
import fcntl
import hashlib
import html
import importlib.metadata as md
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from elasticslice.pilots import wheeltags
from elasticslice.pilots.wheeldownload import compatible_platforms, download
from elasticslice.pilots.wheelpack import (PROJECT, WheelhouseError, atomic_write, project_wheel,
                                           repack, wheel_name)

__all__ = ["AGENT_REQUIREMENTS", "PROJECT", "Wheelhouse", "WheelhouseError", "cache_root",
           "canonical", "closure", "compatible_platforms", "this_platform", "this_python"]

log = logging.getLogger(__name__)

AGENT_REQUIREMENTS = ("distributed", "dask", "cryptography")
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?$")


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
    on glibc Linux (the newest manylinux it runs), else ``sysconfig``'s
    (:func:`elasticslice.pilots.wheeltags.this_platform`, which nodes run too)."""
    return wheeltags.this_platform()


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
                atomic_write(path, lambda out, d=dist: repack(d, out, bytecode=True))
                built = True
            wanted[canonical(dist.metadata["Name"])] = path
        pins = _pins(dists)
        method = "repack"
    else:
        wanted, built = download(directory, version, platform, _pins(dists),
                                 (*AGENT_REQUIREMENTS, *extra), exact=extra)
        pins = {name: _version_of(path) for name, path in wanted.items()}
        method = "download"
    project, made = project_wheel(directory, bytecode=same)
    built = built or made
    pins[PROJECT] = md.version(PROJECT)
    wheels = sorted([*wanted.values(), project], key=lambda p: p.name.lower())
    tools = directory / "tools"
    tools.mkdir(exist_ok=True)
    pip = md.distribution("pip")
    pip_wheel = tools / wheel_name(pip)
    if not pip_wheel.exists():
        atomic_write(pip_wheel, lambda out: repack(pip, out))
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


def _version_of(wheel: Path) -> str:
    return wheel.name.split("-")[1]



# ------------------------------------------------------------------------ the indexes ------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _known_sums(directory: Path) -> dict[str, tuple[str, int]]:
    """``wheels.txt``'s digests by wheel path (relative), with the size each was taken at:
    what a wheelhouse built before says of the wheels it still holds."""
    try:
        text = (directory / "wheels.txt").read_text()
    except OSError:
        return {}
    known = {}
    for line in text.splitlines():
        parts = line.removeprefix("#tool ").split()
        if len(parts) == 3 and not line.startswith("# ") and parts[1].isdigit():
            known[parts[2]] = (parts[0], int(parts[1]))
    return known


def _sums(directory: Path, paths: list[Path]) -> dict[Path, str]:
    """Each wheel's sha256: taken again only for a wheel that is new, or changed since
    ``wheels.txt`` was written (size or time), not at every use of the wheelhouse (a
    cluster's start, ``doctor``: hashing its ~25 MB cost ~0.07 s of CPU each time)."""
    known = _known_sums(directory)
    try:
        written = (directory / "wheels.txt").stat().st_mtime_ns
    except OSError:
        written = 0
    sums = {}
    for path in paths:
        info = path.stat()
        old = known.get(path.relative_to(directory).as_posix())
        fresh = old is not None and old[1] == info.st_size and info.st_mtime_ns < written
        sums[path] = old[0] if fresh else _sha256(path)  # type: ignore[index]
    return sums


def _write_indexes(directory: Path, version: str, platform: str, wheels: list[Path],
                   pins: dict[str, str], tools: list[Path]) -> None:
    sums = _sums(directory, [*wheels, *tools])

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
            f"#tool {sums[t]} {t.stat().st_size} tools/{t.name}\n" for t in tools),
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
            atomic_write(path, lambda out, t=text: out.write_text(t))


CLI_EPILOG = """\
The wheelhouse is cached (one folder per Python, platform and extras) under
  %(cache)s
and reused; a node gets the one that fits it from the control node's wheelhouse root, which
builds missing ones itself: this only builds one ahead. For this machine's Python and
platform the installed distributions are repacked (no network); for another Python or an
ARM64 node the wheels come from the package index (pip download). Examples:
  --python 3.10 --platform manylinux_2_35_x86_64     Ubuntu 22.04 (UBUNTU22-64-STD)
  --python 3.12 --platform manylinux_2_39_aarch64    Ubuntu 24.04 on an ARM64 node type
"""


def main(argv: list[str] | None = None) -> int:
    """``python -m elasticslice.pilots.wheelhouse [--python X.Y] [--platform TAG] [--extra
    NAME]``: build (or find in the cache) the wheelhouse and print where it is, what it holds
    and how it was made; one line and exit status 1 when it cannot be built."""
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m elasticslice.pilots.wheelhouse",
        description="Build the nodes' wheelhouse (the agent's wheels at this environment's\n"
                    "versions) for a Python and platform, and say where it is.",
        epilog=CLI_EPILOG % {"cache": cache_root()},
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=None, metavar="X.Y",
                        help="the nodes' Python version (default: this one's, "
                             f"{this_python()})")
    parser.add_argument("--platform", default=None, metavar="TAG",
                        help=f"the nodes' wheel platform (default: {this_platform()})")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME",
                        help="an installed distribution the nodes need too, with what it "
                             "requires (e.g. parsl; repeatable)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        house = Wheelhouse.for_python(args.python, platform=args.platform,
                                      extra=tuple(args.extra))
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
