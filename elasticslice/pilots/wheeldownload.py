"""Wheels for another Python or platform, from the package index, with this environment's pins.

Compiled wheels cannot be repacked across ABIs, so for a node whose Python or machine is not
this control node's, ``pip download --only-binary=:all: --python-version X.Y
--implementation cp --abi cpXY --abi abi3 --abi none --platform TAG...`` (the platform's
manylinux tags, newest first: pip takes ``--platform`` literally) fetches the closure the
agent needs, resolved for the *target* interpreter (markers differ between versions).

The pins: first every distribution at the version installed here (``-c``). When the index
has no wheel of one of them for the target (a release that dropped that Python: tornado
6.6 has only ``cp311-abi3`` wheels, for instance), again with only what the scheduler and
its workers must share pinned (Dask's own version check: dask, distributed, msgpack,
cloudpickle, toolz; and the extras asked for, e.g. parsl) and every other distribution at
most its version here (``<=``): the newest release the target runs. What differs is logged,
one line, and is in the wheelhouse's ``wheelhouse.json`` pins.

A failure is one line for the node: :func:`pip_reason` ("pip download: no wheel of
tornado==6.6.1 for this Python and platform", "... (offline?)" when pip could not reach the
index).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path

from elasticslice.pilots.wheelpack import WheelhouseError

log = logging.getLogger(__name__)

#: what a Dask scheduler and its workers must run at the same version (distributed's
#: ``versions.required_packages``, tornado aside: it talks only to its own process)
WIRE = ("dask", "distributed", "msgpack", "cloudpickle", "toolz")
TIMEOUT = 900.0  # seconds for one pip download
_OFFLINE = ("NewConnectionError", "Failed to establish a new connection",
            "Temporary failure in name resolution", "Name or service not known",
            "Network is unreachable", "ConnectTimeout", "ReadTimeout", "ProxyError",
            "Connection refused")


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


def pip_reason(output: str) -> str:
    """One line from what ``pip download`` wrote (stdout, then stderr) when it failed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    offline = any(mark in line for line in lines for mark in _OFFLINE)
    pinned = {}
    for line in lines:
        if "(constraint)" in line:
            spec = line.split("(constraint)", 1)[1].strip()
            pinned[re.split(r"[=<>!~ ]", spec, maxsplit=1)[0].lower()] = spec
    missing, grab = [], False
    for raw in output.splitlines():
        if "no matching distributions available for your environment" in raw:
            grab = True
        elif grab and raw[:1] in (" ", "\t") and raw.strip():
            name = raw.strip()
            missing.append(pinned.get(name.lower(), name))
        else:
            grab = False
    errors = [line[len("ERROR: "):] for line in lines
              if line.startswith("ERROR: ") and "for help visit" not in line]
    if missing:
        text = f"no wheel of {', '.join(missing)} for this Python and platform"
    elif errors:
        text = errors[-1]
    else:
        text = lines[-1] if lines else "it failed"
    return f"pip download: {text}{' (offline?)' if offline else ''}"


def _pip_download(staging: Path, version: str, platform: str, constraints: list[str],
                  requirements: Iterable[str]) -> subprocess.CompletedProcess[str]:
    (staging / "constraints.txt").write_text("".join(f"{c}\n" for c in constraints))
    abi = f"cp{version.replace('.', '')}"
    # not --quiet: what a failed resolution was caused by is on stdout only
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off", "--python-version", version,
           "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none",
           *(word for tag in compatible_platforms(platform) for word in ("--platform", tag)),
           "-c", str(staging / "constraints.txt"), "-d", str(staging), *requirements]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as err:
        raise WheelhouseError(f"pip download: no answer within {TIMEOUT:.0f} s "
                              "(offline?)") from err


def download(directory: Path, version: str, platform: str, pins: dict[str, str],
             requirements: Iterable[str], exact: Iterable[str] = ()
             ) -> tuple[dict[str, Path], bool]:
    """Wheels of ``requirements`` for Python ``version`` on ``platform`` into ``directory``
    (name -> wheel), with ``pins`` as the module's doc says (``exact``: more names pinned
    exactly); whether anything was fetched (False: the last download's, still valid)."""
    requirements = tuple(requirements)
    request = {"python": version, "platform": platform, "pins": pins,
               "requirements": sorted(requirements)}
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
    staging.mkdir()
    try:
        strict = [f"{n}=={v}" for n, v in sorted(pins.items())]
        done = _pip_download(staging, version, platform, strict, requirements)
        if done.returncode != 0 and "(offline?)" not in pip_reason(done.stdout + done.stderr):
            keep = {*WIRE, *exact}
            relaxed = [f"{n}{'==' if n in keep else '<='}{v}" for n, v in sorted(pins.items())]
            first = pip_reason(done.stdout + done.stderr)
            for partial in staging.glob("*.whl"):
                partial.unlink()
            done = _pip_download(staging, version, platform, relaxed, requirements)
            if done.returncode == 0:
                log.info("Python %s on %s: %s; with only %s pinned exactly, the rest at most "
                         "this environment's versions", version, platform, first,
                         ", ".join(sorted(keep)))
        if done.returncode != 0:
            raise WheelhouseError(pip_reason(done.stdout + done.stderr))
        wheels: dict[str, str] = {}
        for wheel in sorted(staging.glob("*.whl")):
            os.replace(wheel, directory / wheel.name)
            wheels[re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()] = wheel.name
        differ = {n: f.split("-")[1] for n, f in wheels.items() if n in pins
                  and f.split("-")[1] != pins[n]}
        if differ:
            log.warning("the wheelhouse for Python %s on %s has %s (this environment: %s)",
                        version, platform, ", ".join(f"{n} {v}" for n, v in differ.items()),
                        ", ".join(f"{n} {pins[n]}" for n in differ))
        stamp.write_text(json.dumps({"request": request, "wheels": wheels}))
        return {n: directory / f for n, f in wheels.items()}, True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
