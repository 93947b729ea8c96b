"""An image's own ``python3`` and architecture (rule R16 of docs/emulator.md).

CloudLab's standard images each have their Ubuntu release's ``python3`` (UBUNTU22-64-STD:
3.10, UBUNTU24-64-STD: 3.12), without pip or ensurepip unless the experimenter installs
python3-pip and python3-venv, and ``-ARM`` images run on ARM64 node types (Utah's m400).
The box's nodes boot this machine's system, so an image names an interpreter of this
machine instead (``emulator image add --python PATH``), and its nodes see it where Ubuntu
has it, as read-only binds of the host's files that the node's init makes at boot (never
copies: a standard library is about 190 MB):

=====================================  ===============================================
``/usr/bin/python3.X``                 the interpreter's binary
``/usr/bin/python3``                   a link to ``python3.X``
``/usr/lib/python3.X``                 its standard library (an overlay whose top layer
                                       hides its ``site-packages`` and ``ensurepip``)
``/usr/lib/<multiarch>/libpython...``  a shared build's library, where the node's loader
                                       finds it (pyenv's RUNPATH points into /root/.pyenv,
                                       out of the node's sight)
=====================================  ===============================================

This machine's own ``python3.H`` and its ``pip`` scripts are hidden (whiteouts in the
image's system layer, under its own files). ``getpath`` finds the prefix ``/usr`` from the
binary's folder (landmark ``lib/python3.X/os.py``), and a venv's python finds it from
``home = /usr/bin`` in its ``pyvenv.cfg`` the same way.

An architecture other than this machine's is a label: the image's python3 imports a
``sitecustomize`` (in its standard library, as Ubuntu has one there) that sets
``_PYTHON_HOST_PLATFORM``, so ``sysconfig.get_platform()`` says ``linux-aarch64`` and pip
and the pilots' installer refuse wheels of another architecture. The code still runs on
this machine's CPU: ``uname -m`` and ``platform.machine()`` say so.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

ARCHES = ("x86_64", "aarch64")
HOST_ARCH = os.uname().machine
VERSION = re.compile(r"^3\.\d{1,2}$")
STOCK_PYTHON = "/usr/bin/python3"
#: what python3-pip brings into a site folder under /usr, hidden from an image's python3
PIP_PACKAGES = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "wheel",
                "distutils-precedence.pth")
PROBE = r"""
import json, os, site, sys, sysconfig
var = sysconfig.get_config_var
lib = os.path.join(var("LIBDIR") or "", var("INSTSONAME") or "")
print(json.dumps({
    "implementation": sys.implementation.name,
    "version": "%d.%d" % sys.version_info[:2],
    "executable": os.path.realpath(sys.executable),
    "stdlib": os.path.realpath(sysconfig.get_path("stdlib")),
    "platstdlib": os.path.realpath(sysconfig.get_path("platstdlib")),
    "libpython": os.path.realpath(lib) if var("Py_ENABLE_SHARED") else None,
    "multiarch": var("MULTIARCH") or "",
    "site": [os.path.realpath(p) for p in site.getsitepackages([sys.base_prefix])],
}))
"""


class ImageError(ElasticSliceError):
    """A custom image cannot be added or used."""


@dataclass(frozen=True)
class Interpreter:
    """A host interpreter as an image's ``python3`` (what ``images.json`` records)."""

    version: str            # "3.10"
    path: str               # as given to ``image add --python``
    executable: str         # its binary (real path)
    stdlib: str             # its standard library folder (real path)
    libpython: str | None   # a shared build's library (None: a static build)
    libdir: str             # where the node's loader finds it ("usr/lib/x86_64-linux-gnu")
    site: tuple[str, ...] = ()  # its site folders (real paths)

    @property
    def lib(self) -> str:
        """Its standard library's place on the node, relative to /."""
        return f"usr/lib/python{self.version}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "site": list(self.site)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Interpreter:
        return cls(**{**data, "site": tuple(data.get("site") or ())})

    def files(self) -> list[tuple[str, str]]:
        """Host files bound read-only on the node: (its path, relative to /; the host's)."""
        out = []
        if self.executable != f"/usr/bin/python{self.version}":
            out.append((f"usr/bin/python{self.version}", self.executable))
        if self.libpython and self.libpython != f"/{self.libdir}/{Path(self.libpython).name}":
            out.append((f"{self.libdir}/{Path(self.libpython).name}", self.libpython))
        return out

    def stdlib_mount(self) -> bool:
        """Whether its standard library is mounted at /usr/lib/python3.X (it is elsewhere
        on the host: the node's /usr does not show it there)."""
        return self.stdlib != f"/{self.lib}"

    def missing(self) -> str | None:
        """The first of its files this machine no longer has (None: all there)."""
        for path in (self.executable, self.stdlib, self.libpython):
            if path and not os.path.exists(path):
                return path
        return None


def check_arch(arch: str | None) -> str:
    """``--arch``: one of :data:`ARCHES` (default this machine's)."""
    if arch is None:
        return HOST_ARCH
    if arch not in ARCHES:
        raise ImageError(f"--arch {arch}: unknown architecture (one of {', '.join(ARCHES)})")
    return arch


def probe(path: str) -> Interpreter:
    """What the interpreter at ``path`` is, as ``--python`` names it; ImageError (one line
    naming the option) when it is no usable CPython 3."""
    where = f"--python {path}"
    if not os.path.isfile(path):
        raise ImageError(f"{where}: no such file")
    if not os.access(path, os.X_OK):
        raise ImageError(f"{where}: not executable, so not a Python interpreter")
    try:
        done = subprocess.run([path, "-I", "-S", "-c", PROBE], capture_output=True, text=True,
                              timeout=30, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    except (OSError, subprocess.SubprocessError) as err:
        raise ImageError(f"{where}: not a Python interpreter ({err})") from err
    try:
        data = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}, "
                                                      "no answer a Python 3 gives"])[-1]
        raise ImageError(f"{where}: not a Python 3 interpreter ({said[:200]})")
    if data.get("implementation") != "cpython" or not VERSION.fullmatch(data["version"]):
        raise ImageError(f"{where}: {data.get('implementation')} {data.get('version')}, "
                         "not CPython 3 (the images' python3 is CPython)")
    stdlib = data["stdlib"]
    if not os.path.isfile(os.path.join(stdlib, "os.py")):
        raise ImageError(f"{where}: its standard library {stdlib} has no os.py")
    if data["platstdlib"] != stdlib:
        raise ImageError(f"{where}: its platform library {data['platstdlib']} is apart from "
                         f"its standard library {stdlib} (not supported)")
    lib = data["libpython"]
    if lib is not None and not os.path.isfile(lib):
        raise ImageError(f"{where}: a shared build whose library {lib} is missing")
    multiarch = data["multiarch"]
    libdir = f"usr/lib/{multiarch}" if multiarch and os.path.isdir(f"/usr/lib/{multiarch}") \
        else "usr/lib"
    return Interpreter(data["version"], path, data["executable"], stdlib, lib, libdir,
                       tuple(data["site"]))


@functools.lru_cache(maxsize=None)
def stock_version() -> str:
    """The stock image's ``python3`` version: this machine's /usr/bin/python3 ("" if none)."""
    try:
        return probe(STOCK_PYTHON).version
    except ImageError as err:
        log.warning("the stock image has no usable python3: %s", err)
        return ""


def _homes() -> list[Path]:
    homes = [Path(os.path.expanduser("~"))]
    try:
        homes.append(Path(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    return list(dict.fromkeys(homes))


def _candidates(version: str) -> list[Path]:
    """Where an interpreter of ``version`` may be: pyenv's versions, the system's, uv's."""
    name = f"python{version}"
    patch = re.compile(rf"^{re.escape(version)}\.(\d+)$")
    out: list[Path] = []
    pyenvs = [Path(p) for p in (os.environ.get("PYENV_ROOT"),) if p]
    pyenvs += [home / ".pyenv" for home in _homes()]
    for root in dict.fromkeys(pyenvs):
        found = [(int(m.group(1)), d) for d in (root / "versions").glob(f"{version}.*")
                 if (m := patch.fullmatch(d.name))]
        out += [d / "bin" / name for _, d in sorted(found, reverse=True)]
    out += [Path("/usr/bin") / name, Path("/usr/local/bin") / name]
    uvs = [Path(p) for p in (os.environ.get("UV_PYTHON_INSTALL_DIR"),) if p]
    data = os.environ.get("XDG_DATA_HOME")
    uvs += [Path(data) / "uv" / "python"] if data else []
    uvs += [home / ".local" / "share" / "uv" / "python" for home in _homes()]
    for root in dict.fromkeys(uvs):
        out += sorted(root.glob(f"cpython-{version}.*-linux-*/bin/{name}"), reverse=True)
    which = shutil.which(name)
    if which:
        out.append(Path(which))
    return list(dict.fromkeys(out))


@functools.lru_cache(maxsize=None)
def host_python(version: str) -> Path | None:
    """An interpreter of ``version`` (``major.minor``) on this machine that an image can
    name (``image add --python``): pyenv's versions, /usr/bin/pythonX.Y, /usr/local/bin,
    uv's, then PATH; None when there is none."""
    if not VERSION.fullmatch(version):
        raise ValueError(f"version {version!r}: major.minor, e.g. 3.10")
    for candidate in _candidates(version):
        if not candidate.is_file():
            continue
        try:
            if probe(str(candidate)).version == version:
                return candidate
        except ImageError as err:
            log.debug("%s", err)
    return None


def interpreter(value: str) -> Interpreter:
    """``--python``: a path, or a version (``3.10``) found with :func:`host_python`."""
    if VERSION.fullmatch(value) and not os.path.exists(value):
        found = host_python(value)
        if found is None:
            raise ImageError(f"--python {value}: no Python {value} on this machine (looked "
                             "in pyenv's versions, /usr/bin, /usr/local/bin, uv's, PATH)")
        return probe(str(found))
    return probe(value)


# ---- the image's system layer ----------------------------------------------------------
def _masks(python: Interpreter) -> list[str]:
    """What the node must not see, relative to /: the interpreter's site-packages and
    ensurepip, pip in site folders under /usr, this machine's own python3.H and pip."""
    out = []
    stdlib = Path(python.stdlib)
    inside = {Path(s).relative_to(stdlib).parts[0] for s in python.site
              if Path(s).is_relative_to(stdlib) and Path(s) != stdlib}
    for name in sorted({*inside, "ensurepip"}):
        if os.path.lexists(stdlib / name):
            out.append(f"{python.lib}/{name}")
    for folder in python.site:
        if Path(folder).is_relative_to("/usr") and not Path(folder).is_relative_to(stdlib):
            out += [f"{folder.lstrip('/')}/{n}" for n in PIP_PACKAGES
                    if os.path.lexists(Path(folder) / n)]
    host = stock_version()
    names = ["pip", "pip3", f"pip{python.version}", f"pip{host}"]
    if host and host != python.version:
        names.append(f"python{host}")
        if os.path.isdir(f"/usr/lib/python{host}"):
            out.append(f"usr/lib/python{host}")
    out += [f"usr/bin/{n}" for n in dict.fromkeys(names) if os.path.lexists(f"/usr/bin/{n}")]
    return out


def _whiteout(path: Path) -> None:
    """An overlay whiteout: the entry of that name in the layers below is not there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def _placeholder(path: Path, mode: int) -> None:
    """An empty file the node's init binds a host file over (a bind needs a target)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode)
    path.chmod(mode)


def sitecustomize(arch: str, original: Path | None) -> str:
    """The label of an image of another architecture, then what the image's python3 had as
    its own ``sitecustomize`` (Debian's, kept where the node sees it)."""
    text = ("# the box's label (docs/emulator.md, \"Custom images\"): this image is for "
            f"{arch}; sysconfig, pip and\n# the pilots' installer take it so, though its "
            "code runs on the host's CPU\nimport os\n"
            f"os.environ['_PYTHON_HOST_PLATFORM'] = 'linux-{arch}'\n")
    if original is not None and original.exists():
        real = original.resolve()
        if real.parent != original.parent and real.is_relative_to("/etc"):
            text += (f"with open({str(real)!r}) as _f:\n"
                     f"    exec(compile(_f.read(), {str(real)!r}, 'exec'))\ndel _f\n")
        else:
            text += real.read_text(encoding="utf-8")
    return text


def build_layer(target: Path, python: Interpreter | None, arch: str) -> None:
    """The image's system layer at ``target`` (under its own files on /usr): the python3
    link, placeholders for the init's binds, whiteouts, the architecture label."""
    staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    version = python.version if python is not None else stock_version()
    lib = staging / "usr" / "lib" / f"python{version}"
    try:
        lib.mkdir(parents=True)
        if python is not None:
            (staging / "usr" / "bin").mkdir()
            (staging / "usr" / "bin" / "python3").symlink_to(f"python{version}")
            for rel, source in python.files():
                _placeholder(staging / rel, os.stat(source).st_mode & 0o777)
            for rel in _masks(python):
                _whiteout(staging / rel)
        if arch != HOST_ARCH:
            stdlib = Path(python.stdlib if python else f"/usr/lib/python{version}")
            (lib / "sitecustomize.py").write_text(
                sitecustomize(arch, stdlib / "sitecustomize.py"), encoding="utf-8")
        for folder, dirs, _ in os.walk(staging):
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o755)
        staging.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except OSError as err:
        raise ImageError(f"cannot make the image's system layer in {target}: {err}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
