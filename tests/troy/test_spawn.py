"""The C runner of units' processes (troy/_spawn.c) gives what subprocess gives: the same
exit codes, errors, output tails, files, environment, working directory, walltime kill,
and hooks that can kill what it started. Each case runs both ways and compares."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO
from troy import ComputeUnitDescription as CUD
from troy import execution
from troy.capture import TAIL_BYTES
from troy.native import compiler

needs_c = pytest.mark.skipif(execution._spawn is None, reason="the C runner is not built")


def test_make_builds_the_runner() -> None:
    """A set-up with a C compiler has the runner loaded (make runs troy.native)."""
    if compiler() is None:
        pytest.skip("no C compiler here: units run through subprocess")
    assert execution.native_problem() is None


def run_both(cud: CUD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             **kwargs: Any) -> tuple[Any, Any]:
    """(C runner's result, subprocess's) for ``cud``, one after the other."""
    results = []
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(exist_ok=True)
    for runner in (execution._spawn, None):
        monkeypatch.setattr(execution, "_spawn", runner)
        results.append(execution.execute(cud, sandbox=str(sandbox), **kwargs))
    return results[0], results[1]


def facts(result: Any) -> tuple[Any, ...]:
    def tail(t: Any) -> Any:
        return None if t is None else (t.data, t.size)
    return result.exit_code, result.error, tail(result.stdout), tail(result.stderr)


CASES = {
    "exit 0 with output": CUD(executable="/bin/sh", arguments=["-c", "echo out; echo err >&2"]),
    "exit 3": CUD(executable="/bin/sh", arguments=["-c", "exit 3"]),
    "killed by a signal": CUD(executable="/bin/sh", arguments=["-c", "kill -TERM $$"]),
    "more output than the tail": CUD(
        executable="/bin/sh", arguments=["-c", f"head -c {3 * TAIL_BYTES + 17} /dev/zero |"
                                         " tr '\\0' x; echo; seq 1 20000 >&2"]),
    "found on the PATH": CUD(executable="sh", arguments=["-c", "echo $0"]),
    "not found": CUD(executable="no-such-program-anywhere"),
    "not found by path": CUD(executable="/no/such/program"),
    "not executable": CUD(executable="/etc/hostname"),
    "environment": CUD(executable="/bin/sh", arguments=["-c", "echo $TROY_X $HOME"],
                       environment={"TROY_X": "it is set", "HOME": "/elsewhere"}),
    "PATH of the unit's environment": CUD(executable="tool", environment={"PATH": "/nowhere"}),
    "SIGPIPE back to its default": CUD(executable="/bin/sh",
                                       arguments=["-c", "yes | head -n 2"], walltime=30),
    "its own session": CUD(executable="/bin/sh",
                           arguments=["-c", "test $(ps -o sid= -p $$) -eq $$ && echo leader"]),
    "stdin from a missing file": CUD(executable="/bin/cat", stdin="missing.txt"),
    "no descriptor of ours": CUD(executable="/bin/sh", arguments=["-c", "ls /proc/$$/fd"]),
    # blocked, ignored and caught signals as the program starts: none blocked, none of the
    # parent's handlers, SIGPIPE and SIGXFSZ back to their defaults
    "signals as subprocess leaves them": CUD(
        executable="/bin/grep", arguments=["-E", "^Sig(Blk|Ign|Cgt)", "/proc/self/status"]),
}


@needs_c
def test_output_still_in_the_pipe_at_the_exit_is_read(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The process fills a pipe grown to 1 MiB and exits before anything is read (the hook
    holds the reader back): what is in the pipe is read after the exit."""
    cud = CUD(executable=sys.executable, arguments=[
        "-c", "import fcntl, os; fcntl.fcntl(1, 1031, 1 << 20); os.write(1, b'x' * 500000)"])
    ours, theirs = run_both(cud, tmp_path, monkeypatch, on_start=lambda proc: time.sleep(1))
    assert facts(ours) == facts(theirs)
    assert ours.stdout.size == 500000


@needs_c
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_gives_what_subprocess_gives(case: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    inherited = os.open(os.devnull, os.O_RDONLY)   # an inheritable descriptor of the parent
    os.set_inheritable(inherited, True)
    try:
        ours, theirs = run_both(CASES[case], tmp_path, monkeypatch)
    finally:
        os.close(inherited)
    assert facts(ours) == facts(theirs)


@needs_c
def test_files_and_the_working_directory_are_the_ones_subprocess_uses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.txt").write_text("from the file\n")
    script = work / "run.sh"
    script.write_text("#!/bin/sh\npwd\ncat\necho to-err >&2\n")
    script.chmod(0o755)
    cud = CUD(executable="./run.sh", working_directory=str(work), stdin="in.txt",
              stdout="out.txt", stderr="err.txt")
    ours, theirs = run_both(cud, tmp_path, monkeypatch)
    assert facts(ours) == facts(theirs) == (0, None, None, None)
    assert (work / "out.txt").read_text() == f"{work}\nfrom the file\n" * 2   # appended
    assert (work / "err.txt").read_text() == "to-err\n" * 2


@needs_c
def test_a_walltime_kills_the_whole_group_and_a_left_writer_does_not_hold_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "grandchild-lived"
    slow = CUD(executable="/bin/sh", walltime=1, arguments=[
        "-c", f"(sleep 3; touch {marker}) & echo started; sleep 30"])
    ours, theirs = run_both(slow, tmp_path, monkeypatch)
    assert facts(ours) == facts(theirs) == (
        -signal.SIGKILL, "walltime of 1s exceeded", (b"started\n", 8), None)
    # a unit that ends while a process it left behind still holds its stdout
    quick = CUD(executable="/bin/sh", arguments=["-c", "sleep 20 & echo done"])
    ours, theirs = run_both(quick, tmp_path, monkeypatch)
    assert facts(ours) == facts(theirs) == (0, None, (b"done\n", 5), None)
    time.sleep(3.5)
    assert not marker.exists()   # the walltime's kill reached the background process too


@needs_c
def test_a_hook_gets_a_process_it_can_kill(tmp_path: Path) -> None:
    """on_start gets the runner's process (its pid); the framework's kill ends the unit."""
    seen: list[Any] = []

    def on_start(proc: Any) -> None:
        seen.append(proc)
        threading.Timer(0.2, execution.kill, [proc]).start()

    result = execution.execute(CUD(executable="/bin/sleep", arguments=["30"]),
                               sandbox=str(tmp_path), on_start=on_start)
    assert isinstance(seen[0], execution.Spawned) and seen[0].pid > 0
    assert (result.exit_code, result.error) == (-9, "killed by signal 9")


@needs_c
def test_a_hook_that_fails_leaves_no_process_behind(tmp_path: Path) -> None:
    pids: list[int] = []

    def on_start(proc: Any) -> None:
        pids.append(proc.pid)
        raise RuntimeError("the framework could not record it")

    with pytest.raises(RuntimeError):
        execution.execute(CUD(executable="/bin/sleep", arguments=["30"]),
                          sandbox=str(tmp_path), on_start=on_start)
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)   # killed and reaped


@needs_c
def test_a_bundle_runs_through_the_runner_member_by_member(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    members = [CUD(executable="/bin/sh", arguments=["-c", f"echo {i}; exit {i % 2}"])
               for i in range(6)]
    ours, theirs = run_both(CUD(bundle=members), tmp_path, monkeypatch)
    assert [facts(m) for m in ours.members] == [facts(m) for m in theirs.members]
    assert ours.error == theirs.error == "3 of 6 bundled tasks failed"


BATCHABLE = ["exit 0 with output", "exit 3", "killed by a signal", "more output than the tail",
             "found on the PATH", "not found by path", "not executable", "environment",
             "SIGPIPE back to its default", "its own session", "no descriptor of ours"]


@needs_c
def test_a_bundle_of_plain_members_is_one_batch_giving_what_subprocess_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members that are processes with nothing to stage run in one call of the C runner
    (no Python between them), each with what subprocess gives it: exit codes, signals,
    output tails, the environment, a start that fails, a walltime that kills."""
    batches = []
    real = execution._spawn.run_batch

    def counting(specs: Any, *rest: Any) -> Any:
        batches.append(len(specs))
        return real(specs, *rest)

    monkeypatch.setattr(execution._spawn, "run_batch", counting)
    members = [CASES[name] for name in BATCHABLE] + [
        CUD(executable="/bin/sleep", arguments=["5"], walltime=0.3)]
    started: list[Any] = []
    ours, theirs = run_both(CUD(bundle=members), tmp_path, monkeypatch,
                            on_start=started.append)
    assert batches == [len(members)]
    assert [facts(m) for m in ours.members] == [facts(m) for m in theirs.members]
    assert ours.members[-1].error == "walltime of 0.3s exceeded"
    assert ours.error == theirs.error and ours.exit_code == theirs.exit_code == 1
    # the hook saw each process the batch started, with its own arguments
    ours_started = started[:len(started) // 2]
    spawned = [m for m in members if m.executable not in ("/no/such/program", "/etc/hostname")]
    assert [p.args for p in ours_started] == [[m.executable, *m.arguments] for m in spawned]
    assert len({p.pid for p in ours_started}) == len(spawned)
    assert all(m.start <= m.end for m in ours.members)


@needs_c
def test_a_batch_stops_at_a_cancel_before_its_next_member(tmp_path: Path) -> None:
    started: list[Any] = []
    bundle = CUD(bundle=[CUD(executable="/bin/true")] * 6)
    result = execution.execute(bundle, sandbox=str(tmp_path), on_start=started.append,
                               canceled=lambda: len(started) >= 2)
    assert len(started) == 2
    assert [m.error for m in result.members] == [None, None] + ["canceled"] * 4
    assert result.error == "4 of 6 bundled tasks failed"


@needs_c
def test_a_batch_whose_hook_fails_kills_what_it_started(tmp_path: Path) -> None:
    pids = []

    def on_start(proc: Any) -> None:
        pids.append(proc.pid)
        raise RuntimeError("the framework could not record it")

    with pytest.raises(RuntimeError):
        execution.execute(CUD(bundle=[CUD(executable="/bin/sleep", arguments=["30"])] * 2),
                          sandbox=str(tmp_path), on_start=on_start)
    assert len(pids) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)   # killed and reaped


def test_subprocess_is_used_when_the_runner_is_turned_off(tmp_path: Path) -> None:
    env = {**os.environ, "TROY_SPAWN": "python"}
    out = subprocess.run(
        [sys.executable, "-c", "from troy import execution; print(execution._spawn, "
         "execution.native_problem())"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith("None not built or not loadable (turned off")


@needs_c
def test_a_process_without_its_stdio_gives_its_units_theirs(tmp_path: Path) -> None:
    """An agent started with stdin, stdout and stderr closed: a unit's output file then
    opens as descriptor 0, its stderr pipe as 1 and 2, and each still ends where it belongs
    (the file is not overwritten by the unit's stdin on its way to 0)."""
    program = (
        "import json, os, sys\n"
        "from troy import ComputeUnitDescription as CUD, execution\n"
        "execution._null_input()\n"
        "out = os.dup(1)\n"
        "for fd in (0, 1, 2): os.close(fd)\n"
        "facts = []\n"
        "for i, runner in enumerate((execution._spawn, None)):\n"
        "    execution._spawn = runner\n"
        "    cud = CUD(executable='/bin/sh', stdout=f'out-{i}.txt', arguments=['-c', "
        "'echo out; echo err >&2; read x || echo no-input; ls /proc/$$/fd'])\n"
        "    r = execution.execute(cud, sandbox=sys.argv[1])\n"
        "    with open(os.path.join(sys.argv[1], f'out-{i}.txt')) as f:\n"
        "        facts.append([r.exit_code, r.error, f.read(), r.stderr.data.decode()])\n"
        "os.write(out, json.dumps(facts).encode())\n")
    proc = subprocess.run([sys.executable, "-c", program, str(tmp_path)], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    ours, theirs = json.loads(proc.stdout)
    assert ours == theirs
    assert ours == [0, None, "out\nno-input\n0\n1\n2\n", "err\n"]
