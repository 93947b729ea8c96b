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

from tests.helpers import REPO, SHARED, wait_for

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
