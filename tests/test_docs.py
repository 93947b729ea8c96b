"""Every code block of README.md and docs/*.md runs here, so the docs stay true (how a
block runs, and the directives that change it: :mod:`tests.docblocks`)."""
from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docblocks import (DIRECTIVE, DOCS, FENCE, PARSE, RUN, TEXT, Block, blocks_of,
                             environment, parse_directives, run_block, sandbox, stop)
from tests.helpers import REPO, wait_for
from tests.test_docs_claims import claims_of

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


@pytest.fixture
def served_emulator(tmp_path: Path, emulator_pki: Path):  # noqa: ANN201 - generator fixture
    """An emulator serving ``~/emu`` for blocks that need one; stopped afterwards."""
    started: list[tuple[Path, subprocess.Popen]] = []

    def start(home: Path, env: dict[str, str]) -> Path:
        d = home / "emu"
        # what `elasticslice emulator init --dir ~/emu --port 0` writes, without its process
        # and its keys: a copy of the session's (serve rewrites the config for its folder)
        shutil.copytree(emulator_pki, d)
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


# a block that runs is a subprocess of ours (often serving an emulator): the slow tier
@pytest.mark.parametrize("block", [
    pytest.param(b, id=b.id, marks=[pytest.mark.slow] if b.lang in RUN else [])
    for b in ALL if b.lang in RUN | PARSE])
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
    for check in claims_of(block):   # what its comments say it prints (test_docs_claims)
        check(block.code, done.stdout)


def test_directives_are_checked(tmp_path: Path) -> None:
    """A typo in a directive, or a skip without a reason, is an error, not a silent pass."""
    with pytest.raises(ValueError, match="unknown doc-test directive 'skp'"):
        parse_directives("skp nothing", "x.md:1")
    with pytest.raises(ValueError, match="needs a reason"):
        parse_directives("skip", "x.md:1")
    assert parse_directives("emulator; timeout=30", "x.md:1") == {"emulator": "",
                                                                  "timeout": "30"}


@pytest.mark.slow
def test_a_failing_block_fails(tmp_path: Path) -> None:
    """The runner reports a block's exit status (a runner that always passed would hide
    every broken example)."""
    home = sandbox(tmp_path)
    bad = Block(REPO / "README.md", 1, "sh", "elasticslice rspec validate nosuch.xml\n")
    assert run_block(bad, home, environment(home)).returncode != 0
    good = Block(REPO / "README.md", 1, "sh", "elasticslice rspec validate request.xml\n")
    assert run_block(good, home, environment(home)).returncode == 0
