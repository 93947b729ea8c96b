"""Every code block of README.md and docs/*.md runs here, so the docs stay true.

How a block runs depends on its fence's language:

- ``python``: a fresh interpreter (this venv's), in a sandbox directory;
- ``sh``: ``bash -e`` in the same kind of sandbox, with this checkout's commands first on PATH;
- ``json`` and ``ini``: parsed;
- ``text``: not code (output, synopses, layouts); never run. An untagged fence is an error:
  say ``text`` or the language.

The sandbox is a fresh directory that is also ``$HOME`` and the working directory, holding
this checkout's ``rspecs/``, ``examples/`` and ``etc/``, a ``manifest.xml`` and a
``request.xml``. Before a block runs, ``/tmp/`` in it becomes the sandbox (parallel runs never
share a directory) and ``--port 12369`` becomes ``--port 0``. In ``sh`` blocks,
``elasticslice emulator serve`` is started in the background (the docs say "Ctrl-C to stop")
and the next line runs once it serves, unless it says ``--background`` itself; whatever a
block started is stopped afterwards.

A directive, an HTML comment on the line before the fence (invisible on GitHub), changes that:

- ``<!-- doc-test: skip REASON -->``: not run; the reason is required (e.g. ``make demo``,
  which tests/test_demo.py runs);
- ``<!-- doc-test: continues -->``: a ``python`` block that goes on from the previous
  ``python`` block of the same file (they run together, in order);
- ``<!-- doc-test: emulator -->``: an emulator serves ``~/emu`` (``/tmp/emu`` in the docs)
  while the block runs, with ``ELASTICSLICE_CONFIG`` pointing at its client config;
- ``<!-- doc-test: timeout=SECONDS -->`` (default 120).

Several directives may share one comment, separated by ``;``.
"""
from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED, wait_for

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = {"python", "sh"}
PARSE = {"json", "ini"}
TEXT = {"text"}
DIRECTIVE = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```\s*([\w-]*)\s*$")
DEFAULT_TIMEOUT = 120.0


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    code: str
    directives: dict[str, str] = field(default_factory=dict)
    before: list[Block] = field(default_factory=list)  # `continues`: the blocks it goes on from

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def parse_directives(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, _, value = part.partition(" ") if not re.match(r"^\w+=", part) \
            else part.partition("=")
        if key not in ("skip", "continues", "emulator", "timeout"):
            raise ValueError(f"{where}: unknown doc-test directive {key!r}")
        if key == "skip" and not value.strip():
            raise ValueError(f"{where}: doc-test skip needs a reason")
        out[key] = value.strip()
    return out


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    last_python: Block | None = None
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        code = "\n".join(x[len(indent):] if x.startswith(indent) else x
                         for x in lines[i + 1:end]) + "\n"
        where = f"{path.relative_to(REPO)}:{i + 1}"
        d = DIRECTIVE.match(lines[i - 1].strip()) if i else None
        block = Block(path, i + 1, lang, code,
                      parse_directives(d.group(1), where) if d else {})
        if "continues" in block.directives:
            if last_python is None:
                raise ValueError(f"{where}: 'continues' but no python block before it")
            block.before = [*last_python.before, last_python]
        if lang == "python":
            last_python = block
        found.append(block)
        i = end + 1
    return found


ALL = [b for p in DOCS for b in blocks_of(p)]


def test_every_block_says_what_it_is() -> None:
    """An untagged or unknown fence would silently escape the tests."""
    bad = [f"{b.id}: ```{b.lang}" for b in ALL if b.lang not in RUN | PARSE | TEXT]
    assert not bad, "say the language, or text for output and synopses:\n" + "\n".join(bad)


def test_every_fence_and_directive_is_seen() -> None:
    """A fence the pattern does not take (```python title=..., ~~~, an info string) would be
    skipped without a word, as would a directive not right above a fence."""
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        fences = sum(bool(re.match(r"^\s*(```|~~~)", x)) for x in lines)
        assert fences == 2 * len(blocks_of(path)), f"{path.name}: a fence the tests do not parse"
        for i, line in enumerate(lines):
            if DIRECTIVE.match(line.strip()):
                assert i + 1 < len(lines) and FENCE.match(lines[i + 1]), \
                    f"{path.name}:{i + 1}: a doc-test directive must be right above a fence"


def test_skips_are_few_and_point_at_the_test_that_runs_them_instead() -> None:
    skipped = [b for b in ALL if "skip" in b.directives]
    assert len(skipped) <= 6, [b.id for b in skipped]
    for b in skipped:
        for named in re.findall(r"tests/[\w/]+\.py", b.directives["skip"]):
            assert (REPO / named).is_file(), f"{b.id}: the skip reason names {named}"


def test_docs_have_blocks() -> None:
    """The parser finds the blocks (a broken fence pattern would pass everything)."""
    assert sum(b.lang in RUN for b in ALL) >= 20
    assert any(b.path.name == "README.md" and b.lang == "python" for b in ALL)


# ---------------------------------------------------------------- the sandbox ---------------
def sandbox(tmp: Path) -> Path:
    home = tmp / "home"
    home.mkdir()
    for name in ("rspecs", "examples", "etc"):
        (home / name).symlink_to(REPO / name)
    shutil.copy(SHARED / "protogeni" / "rspec-schemas" / "ext" / "user" / "1" / "examples"
                / "manifest.xml", home / "manifest.xml")
    shutil.copy(REPO / "rspecs" / "lan-4.xml", home / "request.xml")
    return home


def environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ELASTICSLICE_", "PROTOGENI_"))}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), TMPDIR=str(home),
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
               # blocks that serve an emulator boot nodes fast unless they say otherwise
               ELASTICSLICE_EMULATOR_SERVE_BOOT_DELAY="0.2",
               ELASTICSLICE_RETRY_DELAY="0.5", PYTHONUNBUFFERED="1")
    return env


def rewrite(code: str, home: Path) -> str:
    code = code.replace("/tmp/", f"{home}/")
    return re.sub(r"--port 12369\b", "--port 0", code)


SH_PRELUDE = r"""
__doc_dirs=()
elasticslice() {
  if [ "${1-}" = emulator ] && [ "${2-}" = serve ] && [[ " $* " != *" --background "* ]] \
      && [[ " $* " != *" --daemon "* ]]; then
    local dir="" prev=""
    for a in "$@"; do [ "$prev" = --dir ] && dir="$a"; prev="$a"; done
    rm -f "$dir/server.json"
    command elasticslice "$@" >>"$HOME/.serve.log" 2>&1 &
    __doc_dirs+=("$dir")
    for _ in $(seq 600); do [ -s "$dir/server.json" ] && return 0; sleep 0.05; done
    echo "doc-test: emulator on $dir did not start" >&2; cat "$HOME/.serve.log" >&2; return 1
  fi
  command elasticslice "$@"
}
"""


def sh_script(code: str) -> str:
    # a serve line runs in the background by itself: drop a trailing '&'
    code = re.sub(r"^(\s*elasticslice emulator serve\b[^\n#]*?)\s*&(\s*(#.*)?)$", r"\1\2",
                  code, flags=re.M)
    return SH_PRELUDE + "set -e\n" + code


@pytest.fixture
def served_emulator(tmp_path: Path):  # noqa: ANN201 - generator fixture
    """An emulator serving ``~/emu`` for blocks that need one; stopped afterwards."""
    started: list[tuple[Path, subprocess.Popen]] = []

    def start(home: Path, env: dict[str, str]) -> Path:
        d = home / "emu"
        subprocess.run([sys.executable, "-m", "elasticslice.cli", "emulator", "init",
                        "--dir", str(d), "--port", "0"], env=env, check=True,
                       capture_output=True)
        log = open(home / ".serve.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "elasticslice.cli", "emulator", "serve",
                                 "--dir", str(d), "--boot-delay", "0.2"], env=env,
                                stdout=log, stderr=log, start_new_session=True)
        started.append((d, proc))
        wait_for(lambda: (d / "server.json").exists() or proc.poll() is not None, 60,
                 what="the emulator to serve")
        assert proc.poll() is None, (home / ".serve.log").read_text()
        return d / "elasticslice.conf"

    yield start
    for _, proc in started:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def stop_emulators(home: Path, env: dict[str, str]) -> None:
    """Whatever emulator a block started in its sandbox (they record their pid)."""
    for info in home.rglob("server.json"):
        try:
            pid = json.loads(info.read_text())["pid"]
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        wait_for(lambda: not Path(f"/proc/{pid}").exists()
                 or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z",
                 30, what=f"emulator {pid} to stop")


def run_block(block: Block, home: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    timeout = float(block.directives.get("timeout", DEFAULT_TIMEOUT))
    if block.lang == "python":
        code = "".join(rewrite(b.code, home) for b in [*block.before, block])
        argv = [sys.executable, "-c", code]
    else:
        argv = ["bash", "-c", sh_script(rewrite(block.code, home))]
    proc = subprocess.Popen(argv, cwd=home, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{block.id}: still running after {timeout:g}s\n{out}\n{err}")
    finally:
        stop_emulators(home, env)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the block left in the background
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("block", [b for b in ALL if b.lang in RUN | PARSE],
                         ids=lambda b: b.id)
def test_block_runs(block: Block, tmp_path: Path, served_emulator) -> None:  # noqa: ANN001
    if "skip" in block.directives:
        pytest.skip(block.directives["skip"])
    if block.lang == "json":
        json.loads(block.code)
        return
    if block.lang == "ini":
        configparser.ConfigParser(inline_comment_prefixes=(";", "#")).read_string(block.code)
        return
    home = sandbox(tmp_path)
    env = environment(home)
    if "emulator" in block.directives:
        env["ELASTICSLICE_CONFIG"] = str(served_emulator(home, env))
    done = run_block(block, home, env)
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
        f"\n--- stderr\n{done.stderr[-3000:]}")
    assert "Traceback" not in done.stderr, f"{block.id}\n{done.stderr[-3000:]}"


def test_directives_are_checked(tmp_path: Path) -> None:
    """A typo in a directive, or a skip without a reason, is an error, not a silent pass."""
    with pytest.raises(ValueError, match="unknown doc-test directive 'skp'"):
        parse_directives("skp nothing", "x.md:1")
    with pytest.raises(ValueError, match="needs a reason"):
        parse_directives("skip", "x.md:1")
    assert parse_directives("emulator; timeout=30", "x.md:1") == {"emulator": "",
                                                                  "timeout": "30"}


def test_a_failing_block_fails(tmp_path: Path) -> None:
    """The runner reports a block's exit status (a runner that always passed would hide
    every broken example)."""
    home = sandbox(tmp_path)
    bad = Block(REPO / "README.md", 1, "sh", "elasticslice rspec validate nosuch.xml\n")
    assert run_block(bad, home, environment(home)).returncode != 0
    good = Block(REPO / "README.md", 1, "sh", "elasticslice rspec validate request.xml\n")
    assert run_block(good, home, environment(home)).returncode == 0
