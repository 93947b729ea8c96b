"""Slices users can trust: a manager or a run works only on a slice its state directory
created (or adopted with --adopt), and a run against a CM it cannot reach gives up with
one line, leaving nothing behind.

Before, `elasticslice run` with the config's slice name took over a slice that `elasticslice
manage` was running (it waited for agents that never existed, then deleted the slice at
the end), and a run against an unreachable CM never gave up (102 warnings in 150 s)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from elasticslice.managers.ownership import SliceNotOurs, owns_slice
from tests.elasticslice.managers.helpers import cm_nodes, manager_config
from tests.helpers import REPO, WORKFLOWS

WORKFLOW = WORKFLOWS / "helloworld-forkjoin-10-chameleon.json"


def test_a_manager_refuses_a_slice_another_state_directory_created(
        emulator, make_manager, tmp_path: Path) -> None:
    first = make_manager(emulator, maxthreshold=2, state_dir=tmp_path / "a")
    assert not any(first.manage_once().values())
    held = sorted(cm_nodes(emulator, tmp_path))
    second = make_manager(emulator, maxthreshold=4, state_dir=tmp_path / "b")
    with pytest.raises(SliceNotOurs) as err:
        second.manage_once()
    assert "was not created from the state directory" in str(err.value)
    assert str(tmp_path / "b") in str(err.value) and "--adopt" in str(err.value)
    with pytest.raises(SliceNotOurs):
        second.start()
    assert sorted(cm_nodes(emulator, tmp_path)) == held   # nothing was done to it
    assert owns_slice(first.state, first.server.slice_urn())
    # --adopt: on purpose, recorded, so the next start needs no --adopt
    adopter = make_manager(emulator, maxthreshold=3, state_dir=tmp_path / "c", adopt=True)
    assert not any(adopter.manage_once().values())
    assert len(cm_nodes(emulator, tmp_path)) == 3
    adopter.close()
    again = make_manager(emulator, maxthreshold=3, state_dir=tmp_path / "c")
    assert not any(again.manage_once().values())


def test_a_slice_that_holds_no_sliver_is_reused_without_adopt(
        emulator, make_manager, tmp_path: Path) -> None:
    """What broke: a slice given back (no sliver left at the CM) but still registered at the
    SA was refused to every other state directory, as if a manager held it."""
    first = make_manager(emulator, maxthreshold=2, state_dir=tmp_path / "a")
    assert not any(first.manage_once().values())
    first.close()
    first.server.delete_slice(cancel=True, blocking=True)   # what a run does at its end
    second = make_manager(emulator, maxthreshold=2, state_dir=tmp_path / "b")
    assert not any(second.manage_once().values())
    assert len(cm_nodes(emulator, tmp_path)) == 2
    assert json.loads(second.state.get_meta("slice_owner"))["how"] == "reused"
    # now it holds second's sliver: a third state directory is refused, naming the CM
    third = make_manager(emulator, maxthreshold=4, state_dir=tmp_path / "c")
    with pytest.raises(SliceNotOurs) as err:
        third.manage_once()
    assert "holds a sliver at 127.0.0.1:" in str(err.value) and "--adopt" in str(err.value)


@pytest.mark.slow
def test_manage_refuses_a_slice_it_did_not_create_with_one_line_unless_adopt(
        emulator, tmp_path: Path) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    mine = manager_config(emulator, tmp_path / "one")
    assert elasticslice(mine, "manage", "--once").returncode == 0
    theirs = manager_config(emulator, tmp_path / "two")
    result = elasticslice(theirs, "manage", "--once")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "was not created from the state directory" in lines[0], lines
    adopted = elasticslice(theirs, "manage", "--once", "--adopt")
    assert adopted.returncode == 0, adopted.stderr


def elasticslice(config: Path, *args: str) -> subprocess.CompletedProcess:
    """A real `elasticslice -c CONFIG ARGS...` (a process of its own, as a user runs it)."""
    env = {k: v for k, v in os.environ.items() if k != "PROTOGENI_PASSPHRASE"}
    env.update(PYTHONPATH=str(REPO),
               ELASTICSLICE_CREDENTIAL_CACHE_DIR=str(config.parent / "cred-cache"))
    return subprocess.run([sys.executable, "-m", "elasticslice.cli", "-c", str(config), *args],
                          env=env, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, cwd=str(REPO))


def elasticslice_run(config: Path, state_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return elasticslice(config, "run", str(WORKFLOW), "--state-dir", str(state_dir), *extra)


@pytest.mark.slow
def test_run_refuses_the_slice_manage_is_running_and_makes_nothing(
        emulator, tmp_path: Path) -> None:
    conf = manager_config(emulator, tmp_path)
    assert elasticslice(conf, "manage", "--once").returncode == 0
    held = sorted(cm_nodes(emulator, tmp_path))
    result = elasticslice_run(conf, tmp_path / "run")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "was not created from the state directory" in lines[0], lines
    assert "--adopt" in lines[0]
    assert not (tmp_path / "run").exists()   # nothing made, nothing to resume
    assert sorted(cm_nodes(emulator, tmp_path)) == held


@pytest.mark.slow
def test_run_against_a_cm_it_cannot_reach_fails_with_one_line_and_leaves_nothing(
        emulator, tmp_path: Path) -> None:
    conf = emulator.config_path
    emulator.server.stop()   # nothing listens there any more
    result = elasticslice_run(conf, tmp_path / "run", "--connect-timeout", "1")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "cannot reach 127.0.0.1:" in lines[0] and "within 1 s (--connect-timeout)" in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "run").exists()

