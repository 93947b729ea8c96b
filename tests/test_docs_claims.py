"""What the docs say a command prints is what it prints (test_docs.py runs the blocks; these
check the claims in their comments and the example output blocks)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.docblocks import blocks_of

pytestmark = pytest.mark.slow


def block_with(doc: str, text: str, lang: str) -> str:
    found = [b for b in blocks_of(REPO / "docs" / doc) if b.lang == lang and text in b.code]
    assert len(found) == 1, f"docs/{doc}: {len(found)} {lang} blocks with {text!r}"
    return found[0]


def client_quick_start_claims(code: str, stdout: str) -> None:
    """Its comment said add-nodes 2 after lan-4.xml adds node-0 and node-1 (they are
    node-4 and node-5), so the next line deleted one of the original nodes. Checked on the
    output of the block's one run (tests/test_docs.py, :data:`CLAIMS`)."""
    named = re.search(r"add-nodes 2 .*# new nodes (\S+), (\S+)", code)
    deleted = re.search(r"^elasticslice delete-nodes (\S+)", code, flags=re.M)
    assert named and deleted, code
    assert f"added 2 node(s): {named[1]} {named[2]}\n" in stdout
    assert deleted[1] in (named[1], named[2])
    assert f"deleted 1 node(s): {deleted[1]}\n" in stdout


#: claims checked on a block's output when test_docs runs it: (doc, a text of the block)
#: -> check(code, stdout); each must find exactly one block
CLAIMS = {("client.md", "elasticslice add-nodes 2 --hardware-type m400"):
          client_quick_start_claims}


def claims_of(block) -> list:  # noqa: ANN001 - a tests.docblocks.Block
    return [check for (doc, text), check in CLAIMS.items()
            if block.path.name == doc and text in block.code]


def test_every_claim_finds_its_block() -> None:
    for doc, text in CLAIMS:
        block_with(doc, text, "sh")


def test_a_false_claim_fails(tmp_path: Path) -> None:
    """The check fails on output that does not say what the comment claims (a check that
    always passed would hide a wrong comment)."""
    block = block_with("client.md", "elasticslice add-nodes 2", "sh")
    with pytest.raises(AssertionError):
        client_quick_start_claims(block.code, "added 2 node(s): node-0 node-1\n"
                                              "deleted 1 node(s): node-0\n")
    client_quick_start_claims(block.code, "added 2 node(s): node-4 node-5\n"
                                          "deleted 1 node(s): node-4\n")


def demo(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICSLICE_")}
    return subprocess.run([sys.executable, "-m", "elasticslice.cli", "demo", *args], cwd=cwd,
                          env={**env, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args", [["--nodes", "3"], ["--time-scale", "0"]])
def test_demo_docs_bad_option_lines_are_what_it_prints(tmp_path: Path, args: list[str]) -> None:
    shown = block_with("demo.md", "demo: --nodes: only with --static", "text").code
    done = demo(tmp_path, *args)
    assert done.returncode == 2
    assert done.stderr.strip() in shown.splitlines(), done.stderr


def test_demo_docs_setup_failure_is_what_it_prints(tmp_path: Path) -> None:
    """An example error in docs/demo.md once said "9 d430 nodes wanted" where the program
    said 11; the examples are now checked against the program."""
    shown = block_with("demo.md", "demo: failed in setup:", "text").code
    line = next(x for x in shown.splitlines() if x.startswith("demo: failed in setup:"))
    workload = re.search(r"setup: (\S+\.json):", line)[1]
    (tmp_path / workload).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / workload).write_text("{x\n")  # line 1 column 2: not JSON
    done = demo(tmp_path, "--workload", workload)
    assert done.returncode == 1
    pattern = ".*".join(re.escape(part) for part in line.split("..."))
    assert re.fullmatch(pattern, done.stderr.strip()), (line, done.stderr)
