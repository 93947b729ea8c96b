"""The node agent's environment on a stock image, built by the node's start script.

:func:`env_script` returns POSIX ``sh`` lines for ``start.sh``: with the image's ``python3``
they make a virtual environment under ``/local/pilot/env`` (``venv`` without pip: only the
standard library is needed, Debian's and Ubuntu's python3 included, which lack ensurepip)
and install into it every wheel of the wheelhouse that fits the node, which the control
node serves under one URL, its wheelhouse *root* (:mod:`elasticslice.pilots.wheelroot`),
then set the shell variable ``py`` to its Python::

    "$py" -m troy.frameworks.dask node ...

The node's software is verified: the control node serves its wheelhouse root over HTTPS
with a certificate of the cluster CA (:meth:`~elasticslice.pilots.wheelroot.WheelhouseRoot.
publish_tls`), and ``env_script(url, ca=...)`` gives the node that CA's certificate: the node
trusts it alone, and only a control node's certificate, for ``wheels.txt``, which pins each
wheel's sha256 and size. A server that fails this (an on-path attacker, a node's own
certificate) ends the script with one line naming what failed verification.

Installing is a small stdlib program (embedded in the lines:
:mod:`elasticslice.pilots.nodeinstall`, with :mod:`elasticslice.pilots.wheeltags`) that
does what PEP 427 says a wheel install is: ask the root for the wheelhouse of the node's
Python, machine and glibc (``ROOT/cp310-manylinux_2_35_aarch64/``; while the control node
builds it, it answers 503 and the node waits, up to ``wait`` seconds, with a line now and
then), fetch its ``wheels.txt`` (each wheel's sha256 and size), check that every wheel fits
the node (its platform and Python tags) before anything is fetched or unpacked, fetch the
wheels in parallel, check each digest, unzip each into ``site-packages`` (``.data/`` to its
scheme's folder, console scripts made from ``entry_points.txt``). No dependency resolution
is needed (the wheelhouse *is* the resolved set) and nothing is byte-compiled ahead (the
agent compiles what it imports, once). Measured on the box's stock image (2 cores, 25
wheels, 13 MB): this takes about 1.3 s where ``pip install --no-index --find-links``
takes about 9 s (and 5 s with ``--no-compile``) and needs pip on the image, which a stock
Ubuntu may not have (``bench/bench_join.py``).

With ``index=True`` the third-party wheels come from the package index instead, pinned to
the same versions (``requirements.txt`` of the wheelhouse; ``--only-binary=:all:
--no-deps --no-cache-dir``), installed by pip run from the wheelhouse's own pip wheel
(``python pip.whl/pip``; the image needs no pip), and only the project's wheel from the
wheelhouse.

The lines run as the experiment's user (CloudLab's startup commands do), with root's HOME:
nothing in them needs root or writes under HOME; the folder above ``target`` must be the
user's. A second run on the same node (a reboot re-runs the startup command) first looks
at the environment already there, with no network: its stamp (written last) names this
Python and its ``python3`` is there, so it is used as it is and only ``py`` is set, whatever
the control node serves now or whether it answers at all; a partial one (a build
interrupted) is removed and built again. Whatever is missing (no ``python3``, a Python
older than the agent's, a wheelhouse that cannot be had, a wheel that does not fit the node
or whose digest differs) ends the script with one line on stderr and exit status 1; the
wheelhouse's path is not printed (the publisher's URLs are unguessable), only its scheme,
host and port.

``env_script(None, python=...)`` is for an image that already has the agent (the box's
``ELASTICSLICE-PILOT``, a custom CloudLab image: ``node_python``): just ``py=...``.
"""
from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from types import ModuleType

from elasticslice.pilots import nodefetch, nodeinstall, wheeltags

DEFAULT_TARGET = "/local/pilot/env"
STAMP = nodeinstall.STAMP_NAME
#: how long a node waits for a wheelhouse the control node is building (503), by default:
#: a ``pip download`` of the agent's closure for another Python took 10-40 s here, and a
#: control node on a slow link may take minutes
DEFAULT_WAIT = 900.0
HEREDOC = "ELASTICSLICE_PILOT_ENV"


def _source(module: ModuleType) -> str:
    """A module's source without ``from __future__ import annotations`` (the node's python3
    may be older than 3.7: it must parse there to say it is too old) and without imports of
    the embedded modules."""
    text = Path(module.__file__ or "").read_text()
    text = re.sub(r"^from __future__ import annotations\n", "", text, flags=re.M)
    text = re.sub(r"^from elasticslice\.pilots\.\w+ import \([^)]*\)\n", "", text, flags=re.M)
    return re.sub(r"^from elasticslice\.pilots\.\w+ import [^(\n]*\n", "", text, flags=re.M)


@functools.lru_cache(maxsize=1)
def installer() -> str:
    """The installer program the node runs (wheeltags', nodefetch's, then nodeinstall's
    source)."""
    return "\n\n".join(_source(module) for module in (wheeltags, nodefetch, nodeinstall))


def _url_problem(value: str, relative: bool = False) -> bool:
    if any(c in value for c in "\n\r\0 '\"\\"):
        return True
    if relative and "://" not in value:
        return not re.fullmatch(r"[A-Za-z0-9._~/-]+", value) or value.startswith("/")
    return not value.startswith(("http://", "https://"))


def env_script(wheelhouse_url: str | None, *, python: str = "python3",
               target: str = DEFAULT_TARGET, index: bool = False,
               index_url: str | None = None, root: bool = True,
               wait: float = DEFAULT_WAIT, ca: bytes | str | None = None) -> str:
    """POSIX sh lines that build the node agent's environment under ``target`` with
    ``python`` (the image's) and end with ``py`` set to that environment's Python.

    ``wheelhouse_url``: a wheelhouse *root* (:class:`~elasticslice.pilots.wheelroot.
    WheelhouseRoot`; the node asks for the wheelhouse of its Python and machine under it,
    waiting up to ``wait`` seconds while the control node builds it; a URL that turns out to
    be one wheelhouse is taken as the node's), or with ``root=False`` one wheelhouse. ``index``: the third-party pins from the package index (``index_url``,
    default pip's; a relative one, e.g. ``simple/``, is the node's wheelhouse's own index).
    None: the image already has the agent (``node_python``), and the lines only set ``py``
    to ``python``. An environment already complete at ``target`` (a reboot) is used without
    fetching anything. ``ca``: the cluster CA's certificate (PEM), for an ``https``
    wheelhouse (:meth:`~elasticslice.pilots.wheelroot.WheelhouseRoot.publish_tls`): the
    node trusts that CA alone, and only a control node's certificate (OU ``control``)."""
    if any(c in python for c in "\n\r\0") or not python.strip():
        raise ValueError(f"python must be a command (e.g. python3), not {python!r}")
    if wheelhouse_url is None:
        return f"py={shlex.quote(python)}\n"
    if _url_problem(wheelhouse_url):
        raise ValueError(f"wheelhouse_url must be an http(s) URL, not {wheelhouse_url!r}")
    if index_url is not None and _url_problem(index_url, relative=True):
        raise ValueError(f"index_url must be an http(s) URL or a relative path, not "
                         f"{index_url!r}")
    if not target.startswith("/") or any(c in target for c in "\n\r\0"):
        raise ValueError(f"target must be an absolute path, not {target!r}")
    if not wait >= 0:
        raise ValueError(f"wait must be seconds (0 or more), not {wait!r}")
    pem = ca.decode() if isinstance(ca, bytes) else ca
    if pem is not None and ("-----BEGIN CERTIFICATE-----" not in pem or "\0" in pem):
        raise ValueError("ca must be a certificate (PEM)")
    if pem is not None and not wheelhouse_url.startswith("https://"):
        raise ValueError(f"a wheelhouse verified against ca must be https://, not "
                         f"{wheelhouse_url!r}")
    words = [python, "-", "root" if root else "house", "index" if index else "wheels",
             wheelhouse_url, target, f"{wait:g}"]
    if index and index_url:
        words.append(index_url)
    q = shlex.quote
    return (f"# the node agent's environment: {q(target)}, built with the image's python from "
            f"the control node's wheelhouse{' (pins from the package index)' if index else ''}"
            f"\n# (used as it is when complete: a reboot needs no network)\n"
            f"command -v {q(python)} >/dev/null 2>&1 || "
            f"{{ echo {q(f'pilot environment: no {python} on this image')} >&2; exit 1; }}\n"
            f"{'' if pem is None else nodeinstall.CA_ENV + '=' + q(pem.strip()) + ' '}"
            f"{shlex.join(words)} <<'{HEREDOC}' || exit 1\n"
            f"{installer().strip()}\n"
            f"{HEREDOC}\n"
            f"py={q(target + '/bin/python3')}\n")


#: the oldest Python the node agent runs on (setup.cfg's python_requires)
MIN_NODE_PYTHON = wheeltags.MIN_PYTHON

#: CloudLab's standard images: the ``python3`` and glibc of their Ubuntu release
STOCK_IMAGES = {"UBUNTU18-64-STD": ("3.6", "2.27"), "UBUNTU20-64-STD": ("3.8", "2.31"),
                "UBUNTU22-64-STD": ("3.10", "2.35"), "UBUNTU24-64-STD": ("3.12", "2.39")}
#: the python3 of CloudLab's standard images (their Ubuntu release's default)
STOCK_PYTHON = {name: python for name, (python, _) in STOCK_IMAGES.items()}


def _image_name(image_urn: str | None) -> str:
    return re.split(r"//|:", image_urn.rsplit("+", 1)[-1])[-1] if image_urn else ""


def image_python(image_urn: str | None, cm_local: bool) -> str | None:
    """The ``major.minor`` of the ``python3`` that nodes booted from ``image_urn`` have
    (None: unknown). The box's nodes boot this machine's system whatever the image (custom
    images are laid over it), so its ``/usr/bin/python3``; CloudLab's standard images have
    their Ubuntu release's (:data:`STOCK_PYTHON`)."""
    import shutil
    import subprocess
    if not cm_local:
        return STOCK_PYTHON.get(_image_name(image_urn))
    python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if python is None:
        return None
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def image_platform(image_urn: str | None, cm_local: bool) -> str | None:
    """The wheel platform nodes booted from ``image_urn`` most likely have, to build their
    wheelhouse ahead (None: unknown; a node asks for its own anyway): the box's, this
    machine's; a standard image's, its release's glibc on x86-64 (the same name boots ARM64
    node types too: those nodes ask for theirs)."""
    if cm_local:
        return wheeltags.this_platform()
    name = _image_name(image_urn)
    if name not in STOCK_IMAGES:
        return None
    major, minor = (int(x) for x in STOCK_IMAGES[name][1].split("."))
    return wheeltags.platform_tag("x86_64", (major, minor))
