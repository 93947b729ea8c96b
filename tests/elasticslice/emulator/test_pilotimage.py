"""The pilot image's key: what it is built from is read once per process and read again
when an installation changes (a node boot used to parse every distribution's METADATA
and start the image's python3: ~50 ms of CPU per node)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from elasticslice.emulator import pilotimage


def test_the_agents_distributions_are_read_again_after_an_install(tmp_path: Path,
                                                                  monkeypatch) -> None:
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    first = pilotimage._agent_dists()
    assert {d.name.lower() for d in first} >= {"dask", "distributed"}
    assert pilotimage._agent_dists() is first  # nothing changed: not read again
    (site / "newdist-1.0.dist-info").mkdir()   # what an install does to site-packages
    os.utime(site, ns=(0, os.stat(site).st_mtime_ns + 1_000_000))
    again = pilotimage._agent_dists()
    assert again is not first
    assert [(d.name, d.version) for d in again] == [(d.name, d.version) for d in first]


def test_the_image_pythons_version_is_asked_once(monkeypatch) -> None:
    version = pilotimage.image_python_version()
    monkeypatch.setattr(pilotimage.subprocess, "run", None)  # asking again would fail
    assert pilotimage.image_python_version() == version


def test_the_image_is_built_again_when_a_source_changes_not_when_its_bytecode_does(
        tmp_path: Path, monkeypatch) -> None:
    """The image's key covers the project's files (a node must run this checkout's code)
    and nothing under __pycache__ (compiling must not make a new image)."""
    top = tmp_path / "troy"
    (top / "sub" / "__pycache__").mkdir(parents=True)
    (top / "a.py").write_text("x = 1\n")
    (top / "sub" / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(pilotimage, "_project_dirs", lambda: [top])
    version, dists = (3, 11), pilotimage._agent_dists()
    first = pilotimage._key(version, dists)
    assert pilotimage._key(version, dists) == first
    (top / "sub" / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert pilotimage._key(version, dists) == first
    (top / "sub" / "b.py").write_text("y = 22\n")   # edited: another size
    second = pilotimage._key(version, dists)
    assert second != first
    os.utime(top / "a.py", ns=(0, 1))   # same size, another mtime
    third = pilotimage._key(version, dists)
    assert third not in (first, second)
    (top / "sub" / "c.py").write_text("")   # a new file
    assert pilotimage._key(version, dists) not in (first, second, third)
