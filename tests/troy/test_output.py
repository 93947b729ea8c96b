"""Task output kept: ``troy run --output-dir``, the report's ``stdout``/``stderr`` files, the
stderr tail of a failed task, bounded output (a huge one, a bundle member, a remote worker's
result on the wire)."""
from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

import troy
from troy.cli import cli
from troy.execution import TAIL_BYTES, execute
from troy.frameworks.dask.agent import as_data, result_from_wire, result_to_wire
from troy.output import OutputKeeper, default_output_dir, file_stem
from troy.report import ENTRY_KEYS


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def sh(tid: str, script: str, **extra) -> dict:
    return {"id": tid, "executable": "/bin/sh", "arguments": ["-c", script], **extra}


def run(tmp_path: Path, tasks: list[dict], *args: str) -> tuple[object, dict | None]:
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"tasks": tasks}))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["run", str(f), "--report", str(out), *args])
    return result, json.loads(out.read_text()) if out.exists() else None


def test_a_failed_tasks_stderr_tail_is_shown_under_its_error(tmp_path):
    # broke: a failing task showed only "task c FAILED: exit status 3", even with --debug
    result, _ = run(tmp_path, [sh("c", "for i in 1 2 3 4 5 6 7 8; do echo why-$i >&2; done; "
                                       "exit 3")])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    at = lines.index("task c FAILED: exit status 3")
    assert lines[at + 1:at + 6] == [f"  | why-{i}" for i in range(4, 9)]
    assert "why-3" not in result.output


@pytest.mark.parametrize("framework", ["local", pytest.param("dask", marks=pytest.mark.slow)])
def test_output_files_are_kept_and_named_in_the_report(tmp_path, framework):
    result, report = run(tmp_path, [sh("talk", "echo hello; echo oops >&2"),
                                    sh("quiet", "true", parents=["talk"])],
                         "--framework", framework, "--pilots", "1x1")
    assert result.exit_code == 0, result.output
    entries = {e["task"]: e for e in report["tasks"]}
    assert all(tuple(e) == ENTRY_KEYS for e in report["tasks"])
    talk = entries["talk"]
    assert talk["stdout"] == "r-output/talk.stdout" and talk["stderr"] == "r-output/talk.stderr"
    assert (tmp_path / talk["stdout"]).read_text() == "hello\n"
    assert (tmp_path / talk["stderr"]).read_text() == "oops\n"
    # nothing written: no file
    assert entries["quiet"]["stdout"] is None and entries["quiet"]["stderr"] is None
    assert sorted(p.name for p in (tmp_path / "r-output").iterdir()) == \
        ["talk.stderr", "talk.stdout"]


def test_output_dir_option_and_the_default_without_a_report(tmp_path):
    f = tmp_path / "hello.json"
    f.write_text(json.dumps({"tasks": [sh("a", "echo hi")]}))
    assert CliRunner().invoke(cli, ["run", str(f)]).exit_code == 0
    assert (tmp_path / "troy-out" / "hello" / "a.stdout").read_text() == "hi\n"
    assert default_output_dir("x/hello.json", None) == Path("troy-out/hello")
    mine = tmp_path / "mine"
    assert CliRunner().invoke(cli, ["run", str(f), "--output-dir", str(mine)]).exit_code == 0
    assert (mine / "a.stdout").read_text() == "hi\n"
    # a file where the directory should be: one line, nothing run
    (tmp_path / "afile").write_text("")
    inside = tmp_path / "afile" / "out"
    bad = CliRunner().invoke(cli, ["run", str(f), "--output-dir", str(inside)])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert bad.output == f"Error: --output-dir {inside}: cannot make it: Not a directory\n"


def test_bundled_members_keep_their_own_output(tmp_path):
    tasks = [sh(f"t{i}", f"echo out-{i}; echo err-{i} >&2", runtime=0.01) for i in range(16)]
    result, report = run(tmp_path, tasks, "--pilots", "1x1")
    assert result.exit_code == 0, result.output
    assert report["units_total"] < 16  # they were bundled
    for e in report["tasks"]:
        i = e["task"][1:]
        assert (tmp_path / e["stdout"]).read_text() == f"out-{i}\n"
        assert (tmp_path / e["stderr"]).read_text() == f"err-{i}\n"


@pytest.mark.parametrize("framework", ["local", pytest.param("dask", marks=pytest.mark.slow)])
def test_a_huge_output_stays_bounded(tmp_path, framework):
    size = 8 * 1024 * 1024
    result, report = run(tmp_path, [sh("big", f"head -c {size} /dev/zero | tr '\\0' x; "
                                              f"echo END")], "--framework", framework)
    assert result.exit_code == 0, result.output
    kept = (tmp_path / report["tasks"][0]["stdout"]).read_bytes()
    header, _, data = kept.partition(b"\n")
    assert header.decode() == (f"[troy: {size + 4 - TAIL_BYTES} of {size + 4} bytes dropped; "
                               f"the last {TAIL_BYTES} follow]")
    assert len(data) == TAIL_BYTES and data.endswith(b"xxEND\n")


def test_a_task_naming_its_own_stdout_keeps_writing_there(tmp_path):
    work = tmp_path / "work"
    result, report = run(tmp_path, [sh("own", "echo mine; echo err >&2", stdout="mine.txt",
                                       working_directory=str(work))])
    assert result.exit_code == 0, result.output
    assert (work / "mine.txt").read_text() == "mine\n"
    entry = report["tasks"][0]
    assert entry["stdout"] is None and (tmp_path / entry["stderr"]).read_text() == "err\n"


def test_hostile_task_ids_stay_inside_the_output_dir(tmp_path):
    keeper = OutputKeeper(tmp_path / "out").open()
    names = ["../escape", "/etc/passwd", "a/b", "..", "x" * 1000, "a_b", "a/b "]
    stems = {file_stem(n) for n in names}
    assert len(stems) == len(names)  # no two ids share files
    for n in names:
        r = execute(troy.ComputeUnitDescription(executable="/bin/echo", arguments=[n]))
        files = keeper.keep(n, r)
        assert Path(files.stdout).parent == tmp_path / "out"
        assert Path(files.stdout).read_text() == f"{n}\n"
        assert r.stdout is None  # written out, dropped from the result
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_rerun_into_the_same_dir_leaves_no_stale_file(tmp_path):
    run(tmp_path, [sh("a", "echo first")])
    assert (tmp_path / "r-output" / "a.stdout").exists()
    result, report = run(tmp_path, [sh("a", "true")])
    assert result.exit_code == 0 and report["tasks"][0]["stdout"] is None
    assert not (tmp_path / "r-output" / "a.stdout").exists()


def test_output_comes_back_from_a_worker_on_the_wire():
    """A node agent's result (a member's too) carries the tails, whatever its output's
    size (TAIL_BYTES a stream); a value that is not data fails the unit with a line."""
    small = execute(troy.ComputeUnitDescription(bundle=[
        troy.ComputeUnitDescription(executable="/bin/sh", arguments=["-c", "echo a; echo b >&2"])
    ]))
    back = result_from_wire(result_to_wire(small))
    assert back.members[0].stdout.data == b"a\n" and back.members[0].stderr.size == 2
    assert as_data(small) is small
    big = execute(troy.ComputeUnitDescription(executable="/bin/sh",
                                              arguments=["-c", "head -c 100000 /dev/zero"]))
    assert big.stdout.size == 100000 and len(big.stdout.data) == TAIL_BYTES
    back = result_from_wire(result_to_wire(as_data(big)))
    assert back.stdout.data == big.stdout.data and back.ok
    odd = as_data(troy.UnitResult(value=object()))
    assert not odd.ok and odd.value is None and "its value is a object" in odd.error
    assert "malformed" in result_from_wire([1, 2, 3]).error   # what a hostile node sends


def test_a_background_process_holding_the_pipes_does_not_hold_the_unit():
    """The task exits, leaving a child that keeps its stdout open: the unit ends anyway."""
    box: dict = {}
    cud = troy.ComputeUnitDescription(executable="/bin/sh",
                                      arguments=["-c", "sleep 120 & echo $$"])
    runner = threading.Thread(target=lambda: box.update(r=execute(cud)), daemon=True)
    runner.start()
    runner.join(60)
    try:
        assert not runner.is_alive(), "the unit waited for its background child"
        assert box["r"].ok and box["r"].stdout.data.strip().isdigit()
    finally:
        if "r" in box:
            os.killpg(int(box["r"].stdout.data), signal.SIGKILL)


def test_output_written_before_a_walltime_kill_is_kept():
    r = execute(troy.ComputeUnitDescription(executable="/bin/sh", walltime=0.5,
                                            arguments=["-c", "echo before >&2; sleep 60"]))
    assert r.error == "walltime of 0.5s exceeded" and r.stderr.data == b"before\n"


def test_kept_output_is_dropped_from_the_results_as_tasks_end(tmp_path):
    """Memory stays bounded by the units in flight: once a task's files are written, no
    result (a bundle member's neither) holds its output."""
    w = troy.Workload()
    w.add_task([{"executable": "/bin/sh", "arguments": ["-c", "head -c 3000 /dev/zero"],
                 "runtime": 0.001}] * 200)
    keeper = OutputKeeper(tmp_path / "out").open()
    keeper.watch(w)
    with troy.Session(store_path=tmp_path / "s.sqlite") as session:
        session.add_framework("local", name="local")
        state = troy.execute_workload(session, w, troy.Overlay([{"size": 2,
                                                                 "framework": "local"}]),
                                      timeout=120)
    assert state is troy.State.DONE
    units = {u.id: u for t in w.tasks.values() for u in t.units}
    assert len(units) < 200  # bundled
    results = [r for u in units.values() for r in (u.result, *u.result.members)]
    assert all(r.stdout is None and r.stderr is None for r in results)
    assert len(list((tmp_path / "out").iterdir())) == 200
    assert all(p.stat().st_size == 3000 for p in (tmp_path / "out").iterdir())


def test_a_task_that_ended_in_an_earlier_run_keeps_its_files(tmp_path):
    """Resuming (a store): tasks already final are not run again; their files stay named."""
    w = troy.Workload()
    task = w.tasks[w.add_task({"executable": "/bin/true"}, uid="old")]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.stdout").write_text("from the first run\n")
    task._set_state(troy.State.DONE)
    keeper = OutputKeeper(tmp_path / "out").open()
    keeper.watch(w)
    files = keeper.files("old")
    assert files.stdout == str(tmp_path / "out" / "old.stdout") and files.stderr is None


def test_units_without_stdin_read_an_empty_one_and_leak_no_descriptor():
    cud = troy.ComputeUnitDescription(executable="/bin/sh", arguments=[
        "-c", "cat; ls -l /proc/self/fd/0"])
    before = len(os.listdir("/proc/self/fd"))
    results = [execute(cud) for _ in range(20)]
    assert all(r.ok for r in results), results[0]
    assert results[0].stdout.data.decode().rstrip().endswith("/dev/null")  # cat saw EOF
    assert len(os.listdir("/proc/self/fd")) <= before + 1   # one /dev/null, kept
