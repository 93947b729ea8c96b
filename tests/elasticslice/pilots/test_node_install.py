"""The node's installer against a wheelhouse root served on this machine, run by this
machine's other Pythons as a node's python3 would be: a node of another Python gets its
wheelhouse once the control node has built it; an ARM64 node refuses x86-64 wheels and gets
its own; a reboot uses the environment it has without the network; a partial one is built
again; the experiment's user, with root's HOME, builds it."""
from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticslice.pilots import wheeltags
from elasticslice.pilots.bootstrap import STAMP, env_script
from elasticslice.pilots.publish import TarballPublisher
from elasticslice.pilots.wheelhouse import Wheelhouse, this_python
from elasticslice.pilots.wheelroot import WheelhouseRoot
from tests.elasticslice.pilots.helpers import serve_directory

pytestmark = pytest.mark.slow

AGENT = ('"$py" -c "import sys, troy.frameworks.dask.agent, distributed; '
         'print(*sys.version_info[:2], distributed.__version__)"\n')
ELF_AARCH64, ELF_X86_64 = 183, 62  # e_machine


def interpreter(version: str) -> str | None:
    """A Python ``version`` of this machine (pyenv's, else on PATH)."""
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    return str(found[-1]) if found else shutil.which(f"python{version}")


def run_node(script: str, folder: Path, env: dict[str, str] | None = None,
             user: int | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` run by sh as a node's startup command runs: a bare environment, HOME
    root's (``/root``) unless ``env`` says otherwise, as ``user`` when given."""
    path = folder / "start.sh"
    path.write_text(script)
    path.chmod(0o755)
    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    ids = {} if user is None else {"user": user, "group": user, "extra_groups": []}
    return subprocess.run(["sh", str(path)], capture_output=True, text=True, timeout=600,
                          env={**base, **(env or {})}, cwd="/", **ids)


@pytest.fixture
def served() -> Iterator[tuple[WheelhouseRoot, TarballPublisher, str]]:
    """A fresh root (nothing built: the first ask is answered 503) on a publisher, with the
    wheelhouses cached where the clusters keep them (the venv's)."""
    root = WheelhouseRoot()
    publisher = TarballPublisher().start()
    try:
        yield root, publisher, root.publish(publisher)
    finally:
        publisher.stop()
        root.close()


def machine_of(elf: Path) -> int:
    return int.from_bytes(elf.read_bytes()[18:20], "little")


@pytest.mark.parametrize("version", ["3.12"])  # 3.10: test_first_run.py, a pilot on the box
def test_a_node_of_another_python_gets_its_wheelhouse_once_built(version, served, tmp_path):
    """The control node (this Python) builds the node's wheelhouse when the node asks for it
    (pip download for that Python: the package index); the node waits, then imports the
    agent. Where the index cannot be had here, the node's one line names its Python,
    machine and pip's reason."""
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    _, _, url = served
    done = run_node(env_script(url, python=python, target=str(tmp_path / "env")) + AGENT,
                    tmp_path)
    lines = done.stdout.splitlines()
    if done.returncode != 0:
        assert done.stderr.count("\n") == 1 and done.stderr.startswith(
            f"pilot environment: the control node has no wheelhouse for Python {version} on "
            f"{wheeltags.machine()}: pip download: "), done.stderr
        return
    assert lines[0].startswith(f"pilot environment: waiting for the control node's wheelhouse "
                               f"for Python {version} on {wheeltags.machine()} ("), lines
    assert lines[-2].startswith(f"pilot environment: built in {tmp_path / 'env'} in ")
    assert lines[-1] == f"{version.replace('.', ' ')} {md.version('distributed')}"


def test_an_arm64_node_refuses_an_x86_64_wheel(tmp_path: Path) -> None:
    """A control node that gives every node its own wheelhouse (as before the root: an ARM
    node got x86 wheels): the node (its Python labelled linux-aarch64, as the box labels an
    ARM64 image) names the first wheel that does not fit and its platform, and unpacks
    nothing."""
    house = Wheelhouse.for_python()
    node = ((sys.version_info[0], sys.version_info[1]), "aarch64", wheeltags.glibc_version())
    wrong = next(w for w in house.manifest().split()
                 if w.endswith(".whl") and wheeltags.wheel_problem(w, *node))
    ours = tmp_path / "root"
    ours.mkdir()
    tag = wheeltags.node_tag(node[0], wheeltags.platform_tag("aarch64", node[2]))
    (ours / tag).symlink_to(house.directory)
    with serve_directory(ours) as url:
        # its root, the one wheelhouse (root=False), and the one wheelhouse where a root is
        # expected (a control node that publishes only one: the node takes it)
        for where, root in ((url, True), (f"{url}/{tag}", False), (f"{url}/{tag}", True)):
            done = run_node(env_script(where, python=sys.executable, root=root,
                                       target=str(tmp_path / "env")) + AGENT,
                            tmp_path, env={"_PYTHON_HOST_PLATFORM": "linux-aarch64"})
            assert (done.returncode, done.stdout) == (1, ""), done.stdout
            assert done.stderr == (f"pilot environment: {wrong} does not fit this node "
                                   f"({wheeltags.describe(*node)}): "
                                   f"{wheeltags.wheel_problem(wrong, *node)}\n")
            assert "is not for linux-aarch64" in done.stderr
            assert not (tmp_path / "env").exists()


def test_an_arm64_node_gets_arm64_wheels(served, tmp_path: Path) -> None:
    """From the root, the same node gets a wheelhouse built for it (pip download for
    aarch64): its compiled modules are ARM64 code (this x86 machine cannot import them)."""
    _, _, url = served
    done = run_node(env_script(url, python=sys.executable, target=str(tmp_path / "env")),
                    tmp_path, env={"_PYTHON_HOST_PLATFORM": "linux-aarch64"})
    if done.returncode != 0:
        assert done.stderr.startswith(f"pilot environment: the control node has no wheelhouse "
                                      f"for Python {this_python()} on aarch64: pip download: ")
        return
    compiled = sorted((tmp_path / "env").glob("lib/python*/site-packages/**/*.so"))
    assert compiled and {machine_of(so) for so in compiled} == {ELF_AARCH64}
    if os.uname().machine == "x86_64":
        own = sorted(Path(sys.prefix).glob("lib/python*/site-packages/psutil/*.so"))
        assert not own or machine_of(own[0]) == ELF_X86_64


def test_a_partial_environment_is_built_again_and_a_complete_one_used_offline(
        served, tmp_path: Path) -> None:
    """What a build interrupted leaves (no stamp, a package half there), and an environment
    of another Python (the image's python3 upgraded) are built again; a complete one is used
    as it is with the control node unreachable (a reboot runs the startup command again, and
    the control node may be down): nothing is fetched. (The experiment's user with root's
    HOME builds it on the box's nodes: test_bootstrap.py, both modes.)"""
    root, publisher, url = served
    root.wheelhouse()  # built ahead, as a cluster does: the node is not kept waiting
    env = tmp_path / "env"
    script = env_script(url, python=sys.executable, target=str(env)) + AGENT
    assert run_node(script, tmp_path).returncode == 0
    site = next(env.glob("lib/python*/site-packages"))
    (env / STAMP).unlink()
    shutil.rmtree(site / "distributed")
    rebuilt = run_node(script, tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert rebuilt.stdout.splitlines()[0].startswith(f"pilot environment: built in {env} in ")
    stamp = (env / STAMP).read_text()
    (env / STAMP).write_text('{"python": "3.99"}\n')
    again = run_node(script, tmp_path)
    assert again.returncode == 0 and "built in" in again.stdout, again.stderr
    assert (env / STAMP).read_text() != '{"python": "3.99"}\n' and stamp
    publisher.stop()  # the control node is unreachable now
    offline = run_node(script, tmp_path)
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.splitlines() == [
        f"pilot environment: {env} is complete",
        f"{this_python().replace('.', ' ')} {md.version('distributed')}"]
    assert offline.stderr == ""
