"""Which wheels a node can install, from the wheels' names and the node's Python and machine.

One implementation for both ends: the control node chooses the wheelhouse that fits a node
(:mod:`elasticslice.pilots.wheelroot`), and the node's installer
(:mod:`elasticslice.pilots.bootstrap`, which embeds this module's source) refuses a wheel that
does not fit it before anything is unpacked. The rules are pip's (``packaging.tags``) for
CPython on Linux, and PEP 425/427/600:

- a node is its Python (``major.minor``), its machine (the end of ``sysconfig``'s platform,
  ``linux-x86_64`` -> ``x86_64``; the box labels an ARM64 image's Python with
  ``_PYTHON_HOST_PLATFORM=linux-aarch64``) and its glibc (``os.confstr``; None on musl);
- its wheelhouse is named ``cpXY-manylinux_2_N_MACHINE`` (``cpXY-linux_MACHINE`` without
  glibc), what :func:`node_tag` gives and :func:`parse_node_tag` reads;
- a wheel's platform tag fits when it is ``any``, ``linux_MACHINE``, or a manylinux tag of
  the machine whose glibc is not newer than the node's (``manylinux1``/``2010``/``2014``
  are 2.5/2.12/2.17); its Python tag fits when it is ``cpXY`` with the ABI ``cpXY``, ``cp3N``
  (N <= Y) with ``abi3``, or ``py3``, ``py3N`` (N <= Y), ``cpXY`` with the ABI ``none``.

The module runs on any python3 from 3.6 (the installer must say "too old" on an old image,
so it must parse there): the standard library only, ``typing`` for annotations.
"""
from __future__ import annotations

import os
import platform
import re
import sysconfig
from typing import Optional, Tuple

#: the oldest Python the node agent runs on (setup.cfg's ``python_requires``)
MIN_PYTHON = (3, 10)
#: the Python versions and machines a control node builds wheelhouses for
PYTHONS = ((3, 8), (3, 14))
MACHINES = ("x86_64", "aarch64")
#: the glibc versions (2.N) a node's wheelhouse may be named for
GLIBC_MINORS = (5, 99)

_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_NODE_TAG = re.compile(r"^cp(\d)(\d{1,2})-(?:manylinux_(\d+)_(\d+)_|linux_)([a-z0-9_]+)$")


def glibc_version() -> Optional[Tuple[int, int]]:
    """This machine's glibc (2, N), None without one. ``os.confstr`` first: before 3.8,
    ``platform.libc_ver`` gave the newest symbol version the interpreter links, not the
    system's glibc."""
    text = ""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        pass
    if text.startswith("glibc "):
        version = text.split()[1]
    else:
        libc, version = platform.libc_ver()
        if libc != "glibc":
            return None
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def machine() -> str:
    """This Python's machine as wheels name it (``x86_64``, ``aarch64``), from
    ``sysconfig.get_platform()``."""
    return sysconfig.get_platform().rsplit("-", 1)[-1].replace(".", "_")


def platform_tag(arch: str, glibc: Optional[Tuple[int, int]]) -> str:
    """``manylinux_2_N_ARCH`` (the newest manylinux a glibc 2.N machine runs), else
    ``linux_ARCH``."""
    if glibc is None:
        return "linux_%s" % arch
    return "manylinux_%d_%d_%s" % (glibc[0], glibc[1], arch)


def this_platform() -> str:
    """This machine's wheel platform: ``manylinux_2_36_x86_64`` on glibc Linux, else
    ``sysconfig``'s (``linux_x86_64`` on musl, ``macosx_14_0_arm64``...)."""
    plat = sysconfig.get_platform()
    if plat.startswith("linux-"):
        return platform_tag(machine(), glibc_version())
    return plat.replace("-", "_").replace(".", "_")


def node_tag(python: Tuple[int, int], plat: str) -> str:
    """The name of a node's wheelhouse: ``cp310-manylinux_2_35_aarch64``."""
    return "cp%d%d-%s" % (python[0], python[1], plat)


def parse_node_tag(tag: str) -> Tuple[Tuple[int, int], str, Optional[Tuple[int, int]]]:
    """(python, machine, glibc) of a wheelhouse name that a control node builds; ValueError
    with one line saying why for any other."""
    match = _NODE_TAG.match(tag)
    if not match:
        raise ValueError("%r is not a wheelhouse name (cpXY-manylinux_2_N_MACHINE)" % tag[:80])
    python = (int(match.group(1)), int(match.group(2)))
    arch = match.group(5)
    glibc = (int(match.group(3)), int(match.group(4))) if match.group(3) else None
    if not PYTHONS[0] <= python <= PYTHONS[1]:
        raise ValueError("Python %d.%d: this control node builds wheelhouses for Python "
                         "%d.%d to %d.%d" % (python + PYTHONS[0] + PYTHONS[1]))
    if arch not in MACHINES:
        raise ValueError("machine %s: this control node builds wheelhouses for %s"
                         % (arch, " and ".join(MACHINES)))
    if glibc is None:
        raise ValueError("a node without glibc (linux_%s): this control node builds "
                         "manylinux wheelhouses only" % arch)
    if glibc[0] != 2 or not GLIBC_MINORS[0] <= glibc[1] <= GLIBC_MINORS[1]:
        raise ValueError("glibc %d.%d is not one a manylinux wheel names" % glibc)
    return python, arch, glibc


def describe(python: Tuple[int, int], arch: str, glibc: Optional[Tuple[int, int]]) -> str:
    """``Python 3.10 on linux-aarch64, glibc 2.35``: a node as the refusals name it."""
    libc = ("glibc %d.%d" % glibc) if glibc else "no glibc"
    return "Python %d.%d on linux-%s, %s" % (python[0], python[1], arch, libc)


def _platform_fits(tag: str, arch: str, glibc: Optional[Tuple[int, int]]) -> bool:
    if tag in ("any", "linux_" + arch):
        return True
    match = re.match(r"^manylinux_(\d+)_(\d+)_(\w+)$", tag)
    if match:
        need = (int(match.group(1)), int(match.group(2)))
        return match.group(3) == arch and glibc is not None and need <= glibc
    legacy, _, rest = tag.partition("_")
    if legacy in _LEGACY:
        return rest == arch and glibc is not None and _LEGACY[legacy] <= glibc
    return False


def _python_fits(py: str, abi: str, python: Tuple[int, int]) -> bool:
    major, minor = python
    exact = "cp%d%d" % (major, minor)
    if abi == "none":
        return py == exact or py == "py%d" % major or any(
            py == "py%d%d" % (major, n) for n in range(minor + 1))
    if abi == "abi3":
        return any(py == "cp%d%d" % (major, n) for n in range(2, minor + 1))
    return py == exact and abi in (exact, exact + "m")


def wheel_problem(filename: str, python: Tuple[int, int], arch: str,
                  glibc: Optional[Tuple[int, int]]) -> Optional[str]:
    """None when the wheel ``filename`` fits a node of ``python`` on ``arch`` with
    ``glibc``, else why not, in a few words (its platform tag first)."""
    parts = filename[:-4].split("-") if filename.endswith(".whl") else []
    if len(parts) not in (5, 6):
        return "its name is not a wheel's (NAME-VERSION-PY-ABI-PLATFORM.whl)"
    pys, abis, plats = (part.split(".") for part in parts[-3:])
    if not any(_platform_fits(p, arch, glibc) for p in plats):
        if any(p.endswith("_" + arch) for p in plats):
            return "its platform tag %s needs a newer glibc than %s" % (
                parts[-1], ("the node's %d.%d" % glibc) if glibc else "none")
        return "its platform tag %s is not for linux-%s" % (parts[-1], arch)
    if not any(_python_fits(py, abi, python) for py in pys for abi in abis):
        return "its Python tag %s-%s is not for Python %d.%d" % (parts[-3], parts[-2],
                                                                 python[0], python[1])
    return None
