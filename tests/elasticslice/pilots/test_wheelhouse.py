"""The wheelhouse: exactly the versions this environment runs, wheels pip accepts, built once
per (Python, platform) and reused."""
from __future__ import annotations

import base64
import csv
import importlib.util
import hashlib
import importlib.metadata as md
import io
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from elasticslice.pilots.wheelhouse import (PROJECT, Wheelhouse, WheelhouseError, canonical,
                                            compatible_platforms, this_python)
from tests.elasticslice.pilots.helpers import serve_directory


@pytest.fixture(scope="module")
def house() -> Wheelhouse:
    """The wheelhouse of this environment, in its cache (built once for every test process
    and run, as ElasticCluster uses it); tests that change one work on a copy."""
    return Wheelhouse.for_python()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_it_pins_what_this_environment_runs(house: Wheelhouse) -> None:
    for name in ("dask", "distributed", "cryptography", "cffi", "tornado", PROJECT):
        assert house.pins[name] == md.version(name), name
    assert house.python == this_python() and house.method == "repack"
    by_name = {canonical(w.name.split("-")[0]): w for w in house.wheels}
    assert set(by_name) == set(house.pins)
    for name, wheel in by_name.items():
        assert wheel.name.split("-")[1] == house.pins[name]
        assert wheel.parent == house.directory


def test_its_indexes_name_every_wheel_with_its_digest(house: Wheelhouse) -> None:
    d = house.directory
    lines = (d / "wheels.txt").read_text().splitlines()
    assert lines[0] == f"# python {house.python} platform {house.platform}"
    listed = {name: (sha, int(size)) for sha, size, name in
              (x.split() for x in lines[1:] if not x.startswith("#"))}
    assert listed == {w.name: (_sha(w), w.stat().st_size) for w in house.wheels}
    find_links = (d / "index.html").read_text()
    for wheel in house.wheels:
        assert f'href="{wheel.name}#sha256={_sha(wheel)}"' in find_links
        project = canonical(wheel.name.split("-")[0])
        assert f'href="../../{wheel.name}#sha256={_sha(wheel)}"' in \
            (d / "simple" / project / "index.html").read_text()
        assert f'href="{project}/"' in (d / "simple" / "index.html").read_text()
    pins = dict(x.split("==") for x in (d / "requirements.txt").read_text().split())
    assert pins == {n: v for n, v in house.pins.items() if n != PROJECT}


def test_a_repacked_wheel_is_a_wheel(house: Wheelhouse) -> None:
    """RECORD lists every member with its digest, one .dist-info named as the file."""
    for wheel in house.wheels:
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            infos = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
            assert len(infos) == 1, wheel.name
            info = infos.pop()
            assert canonical(info.removesuffix(".dist-info").rsplit("-", 1)[0]) == canonical(wheel.name.split("-")[0])
            assert {f"{info}/METADATA", f"{info}/WHEEL"} <= names
            assert not any("/INSTALLER" in n for n in names)
            # each module's bytecode for this Python, an unchecked hash-based pyc (PEP 552)
            # of the very source beside it (a node of this Python compiles nothing)
            for pyc in (n for n in names if n.endswith(".pyc")):
                folder, _, name = pyc.rpartition("__pycache__/")
                source = f"{folder}{name.split('.')[0]}.py"
                assert source in names and name.endswith(f".{sys.implementation.cache_tag}.pyc")
                head = z.read(pyc)[:16]
                assert head[:4] == importlib.util.MAGIC_NUMBER
                assert int.from_bytes(head[4:8], "little") == 0b01   # hash-based, unchecked
                assert head[8:16] == importlib.util.source_hash(z.read(source)), pyc
            rows = list(csv.reader(io.StringIO(z.read(f"{info}/RECORD").decode())))
            assert {r[0] for r in rows} == names, wheel.name
            for path, digest, size in rows:
                if path.endswith("/RECORD"):
                    continue
                data = z.read(path)
                want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert (digest, int(size)) == (f"sha256={want.decode()}", len(data)), path


def test_the_project_wheel_holds_troy_and_its_sources(house: Wheelhouse) -> None:
    wheel = next(w for w in house.wheels if w.name.startswith(f"{PROJECT}-"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert "troy/frameworks/dask/__main__.py" in names
        assert "elasticslice/pilots/bootstrap.py" in names
        assert any(n.endswith(".xsd") for n in names)  # package data, as setup.cfg says
        import troy.frameworks.dask.agent as agent
        assert z.read("troy/frameworks/dask/agent.py") == Path(agent.__file__).read_bytes()


def test_a_second_build_reuses_the_cache(house: Wheelhouse) -> None:
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in house.directory.rglob("*")
              if p.is_file()}
    again = Wheelhouse.for_python(house.python, root=house.directory.parent)
    assert not again.built and again.pins == house.pins and again.wheels == house.wheels
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in house.directory.rglob("*")
            if p.is_file()} == before


def test_a_lost_wheel_is_made_again_the_same_and_alone(house: Wheelhouse, tmp_path: Path
                                                       ) -> None:
    """A copy of the cache with one wheel gone gets the same wheel back (the same files,
    the same sources; bytecode is not byte-for-byte reproducible: marshal's output depends
    on reference counts), and nothing else is made again."""
    root = tmp_path / "copy"
    shutil.copytree(house.directory.parent, root)
    d = root / house.directory.name
    lost = d / next(w.name for w in house.wheels if w.name.startswith("dask-"))

    def sources() -> dict[str, bytes]:
        with zipfile.ZipFile(lost) as z:
            return {n: (b"" if n.endswith(".pyc") or n.endswith("/RECORD") else z.read(n))
                    for n in z.namelist()}
    before = sources()
    lost.unlink()
    others = {p: p.stat().st_mtime_ns for p in d.glob("*.whl")}
    again = Wheelhouse.for_python(root=root)
    assert again.built and sources() == before
    assert {p: p.stat().st_mtime_ns for p in others} == others


def test_a_version_or_platform_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WheelhouseError, match=r"Python version 'three': expected MAJOR\.MINOR"):
        Wheelhouse.for_python("three", root=tmp_path)
    with pytest.raises(WheelhouseError, match="platform 'linux x86'"):
        Wheelhouse.for_python("3.11", platform="linux x86", root=tmp_path)


def test_older_manylinux_tags_are_compatible() -> None:
    tags = compatible_platforms("manylinux_2_35_x86_64")
    assert tags[0] == "manylinux_2_35_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux1_x86_64" in tags
    assert compatible_platforms("macosx_11_0_arm64") == ["macosx_11_0_arm64"]


@pytest.mark.slow
def test_pip_installs_from_it_over_http(house: Wheelhouse, tmp_path: Path) -> None:
    """The wheelhouse is an index pip accepts: ``--index-url URL/simple/`` and
    ``--find-links URL/index.html`` (nothing else: no other index, no pip config)."""
    with serve_directory(house.directory) as url:
        for option, where in (("--index-url", f"{url}/simple/"),
                              ("--find-links", f"{url}/index.html")):
            out = tmp_path / option.strip("-")
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(out),
                 *(["--no-index"] if option == "--find-links" else []), option, where,
                 f"dask=={house.pins['dask']}", f"{PROJECT}=={house.pins[PROJECT]}"],
                capture_output=True, text=True, env={"PIP_CONFIG_FILE": "/dev/null",
                                                     "PATH": "/usr/bin:/bin"})
            assert done.returncode == 0, done.stderr
            got = sorted(p.name for p in out.glob("*.whl"))
            assert got == sorted(w.name for w in house.wheels
                                 if re.match(rf"(dask|{PROJECT})-", w.name)), option


def test_make_wheelhouse_says_where_it_is_or_why_not(house: Wheelhouse, monkeypatch,
                                                     capsys) -> None:
    """``python -m elasticslice.pilots.wheelhouse`` (``make wheelhouse``)."""
    from elasticslice.pilots import wheelhouse
    done = subprocess.run([sys.executable, "-m", "elasticslice.pilots.wheelhouse", "--python",
                           "3.x"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "Error: Python version '3.x': expected MAJOR.MINOR, e.g. 3.11\n"
    monkeypatch.setattr(wheelhouse, "cache_root", lambda: house.directory.parent)
    assert wheelhouse.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{house.directory}: {len(house.wheels)} wheels, ")
    assert "from the cache in" in out
    with pytest.raises(SystemExit):
        wheelhouse.main(["--help"])
    shown = capsys.readouterr().out
    for words in ("--extra NAME", "--python 3.10 --platform manylinux_2_35_x86_64",
                  "--python 3.12 --platform manylinux_2_39_aarch64",
                  str(house.directory.parent)):
        assert words in shown, words


CONFLICT = """\
Collecting tornado>=6.2.0 (from distributed)
The conflict is caused by:
    distributed 2026.8.0 depends on tornado>=6.2.0
    The user requested (constraint) tornado==6.6.1

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    tornado

ERROR: Cannot install distributed==2026.8.0 because these package versions have conflicting dependencies.
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""
OFFLINE = """\
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError("HTTPConnection(host='127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection refused")': /simple/psutil/
ERROR: Could not find a version that satisfies the requirement psutil==5.9.8 (from versions: none)
ERROR: No matching distribution found for psutil==5.9.8
"""


def test_what_pip_download_said_is_one_line() -> None:
    """What the node is told when its wheelhouse cannot be had (pip's output as pip 25 and
    26 write it, stdout then stderr)."""
    from elasticslice.pilots.wheeldownload import pip_reason
    assert pip_reason(CONFLICT) == ("pip download: no wheel of tornado==6.6.1 for this Python "
                                    "and platform")
    assert pip_reason(OFFLINE) == ("pip download: No matching distribution found for "
                                   "psutil==5.9.8 (offline?)")
    assert pip_reason("") == "pip download: it failed"


def test_a_digest_is_taken_again_only_for_a_wheel_changed_since_wheels_txt(tmp_path: Path
                                                                             ) -> None:
    """A wheelhouse used again (every cluster start, every ``doctor``) reuses the digests of
    ``wheels.txt`` for the wheels it still holds unchanged; a wheel whose size or time
    changed since is hashed again, so the manifest a node checks never names old bytes."""
    import os

    from elasticslice.pilots.wheelhouse import _sums
    same, grown, touched = (tmp_path / f"{n}-1.0-py3-none-any.whl" for n in "abc")
    tool = tmp_path / "tools" / "pip-1-py3-none-any.whl"
    tool.parent.mkdir()
    for path in (same, grown, touched, tool):
        path.write_bytes(b"wheel " + path.name.encode())
    (tmp_path / "wheels.txt").write_text(
        "# python 3.11 platform any\n" + "".join(
            f"{'0' * 63}{i} {p.stat().st_size} {p.relative_to(tmp_path).as_posix()}\n"
            for i, p in enumerate((same, grown, touched)))
        + f"#tool {'0' * 63}9 {tool.stat().st_size} tools/{tool.name}\n")
    later = (tmp_path / "wheels.txt").stat().st_mtime_ns + 10**9
    for path in (same, tool):
        os.utime(path, ns=(later - 2 * 10**9, later - 2 * 10**9))
    grown.write_bytes(b"a bigger wheel than it was")
    os.utime(touched, ns=(later, later))   # same size, rewritten after wheels.txt
    sums = _sums(tmp_path, [same, grown, touched, tool])
    assert sums[same] == "0" * 63 + "0" and sums[tool] == "0" * 63 + "9"   # reused
    for path in (grown, touched):
        assert sums[path] == hashlib.sha256(path.read_bytes()).hexdigest()
