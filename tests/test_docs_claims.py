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
from tests.docblocks import blocks_of, environment, run_block, sandbox

pytestmark = pytest.mark.slow


def block_with(doc: str, text: str, lang: str) -> str:
    found = [b for b in blocks_of(REPO / "docs" / doc) if b.lang == lang and text in b.code]
    assert len(found) == 1, f"docs/{doc}: {len(found)} {lang} blocks with {text!r}"
    return found[0]


def test_client_quick_start_names_the_nodes_add_nodes_adds(tmp_path: Path) -> None:
    """Its comment said add-nodes 2 after lan-4.xml adds node-0 and node-1 (they are
    node-4 and node-5), so the next line deleted one of the original nodes."""
    block = block_with("client.md", "elasticslice add-nodes 2", "sh")
    named = re.search(r"add-nodes 2 .*# new nodes (\S+), (\S+)", block.code)
    deleted = re.search(r"^elasticslice delete-nodes (\S+)", block.code, flags=re.M)
    assert named and deleted, block.code
    home = sandbox(tmp_path)
    done = run_block(block, home, environment(home))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"added 2 node(s): {named[1]} {named[2]}\n" in done.stdout
    assert deleted[1] in (named[1], named[2])
    assert f"deleted 1 node(s): {deleted[1]}\n" in done.stdout


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
