"""The fork server of the ``dask`` framework's local processes (troy/frameworks/dask/
forkserver.py): a forked worker or scheduler is what a fresh one would be (its environment,
Dask's configuration and logging from it, its streams, its exit status), it answers as a
Popen, the fork server takes JSON only and leaves with its asker."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import process_alive, wait_for
from tests.troy.frameworks.nodes import running_pilot
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask import DaskFramework, forkserver
from troy.frameworks.dask.processes import AgentProcess


@pytest.fixture
def held() -> Iterator[None]:
    """The fork server, held as a framework holds it from its first local worker."""
    forkserver.hold()
    yield
    forkserver.let_go()


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_a_forked_scheduler_and_worker_serve_log_and_end_as_fresh_ones(
        tmp_path: Path, held: None) -> None:
    sched = AgentProcess(["scheduler", "1.0", "127.0.0.1", "0"], str(tmp_path / "s.log"),
                         log_level=logging.WARNING, forked=True)
    worker = None
    try:
        assert isinstance(sched.proc, forkserver.ForkedProcess)
        address = sched.read_address(60)
        assert address and address.startswith("tcp://127.0.0.1:")
        # named for ps, a child of the fork server, which is ours
        assert Path(f"/proc/{sched.pid}/comm").read_text().strip() == "troy-scheduler"
        server = parent_of(sched.pid)
        assert server != os.getpid() and parent_of(server) == os.getpid()
        assert b"troy.frameworks.dask.forkserver" in Path(f"/proc/{server}/cmdline").read_bytes()
        worker = AgentProcess(["worker", address, "p1", "1", "1", "tag"],
                              str(tmp_path / "w.log"), forked=True)
        assert worker.read_address(60)
        assert parent_of(worker.pid) == server          # one fork server for both
        assert worker.proc.poll() is None
    finally:
        if worker is not None:
            worker.stop()
        sched.stop()
    assert worker.proc.returncode == 0 and sched.proc.returncode == 0
    # Dask's logging as each one's environment said: INFO by default, WARNING when asked
    assert "INFO:distributed.worker:Stopping worker" in (tmp_path / "w.log").read_text()
    assert "INFO" not in (tmp_path / "s.log").read_text()


def test_a_forked_process_s_failure_and_its_kill_are_its_exit_status(
        tmp_path: Path, held: None) -> None:
    bad = AgentProcess(["worker", "too", "few"], str(tmp_path / "bad.log"), forked=True)
    assert isinstance(bad.proc, forkserver.ForkedProcess)
    assert bad.read_address(30) is None
    assert bad.proc.wait(30) == 1
    assert "usage: python -m troy.frameworks.dask worker" in (tmp_path / "bad.log").read_text()
    sched = AgentProcess(["scheduler", "1.0"], str(tmp_path / "s.log"), forked=True)
    assert sched.read_address(60)
    with pytest.raises(subprocess.TimeoutExpired):
        sched.proc.wait(0.2)
    os.kill(sched.pid, signal.SIGKILL)
    assert sched.proc.wait(30) == -signal.SIGKILL
    assert sched.proc.poll() == -signal.SIGKILL and not process_alive(sched.pid)


def test_the_environment_and_directory_are_the_asker_s_at_each_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: None) -> None:
    """Changed after the fork server started: a fresh process would have them, so a forked
    one has (Dask's logging from the environment, the working directory)."""
    warm = AgentProcess(["scheduler", "1.0"], str(tmp_path / "warm.log"), forked=True)
    assert warm.read_address(60)
    warm.stop()
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setenv("DASK_LOGGING__DISTRIBUTED", "error")
    sched = AgentProcess(["scheduler", "1.0"], str(tmp_path / "s.log"), forked=True)
    try:
        assert sched.read_address(60)
        assert os.readlink(f"/proc/{sched.pid}/cwd") == str(tmp_path / "here")
    finally:
        sched.stop()
    assert "INFO:distributed.scheduler" in (tmp_path / "warm.log").read_text()
    assert "INFO" not in (tmp_path / "s.log").read_text()


def test_off_or_not_held_starts_each_process_afresh(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sched = AgentProcess(["scheduler", "1.0"], str(tmp_path / "s0.log"), forked=True)
    try:   # no framework holds the fork server
        assert isinstance(sched.proc, subprocess.Popen)
    finally:
        sched.stop()
    forkserver.hold()
    try:
        monkeypatch.setenv("TROY_DASK_FORKSERVER", "0")
        sched = AgentProcess(["scheduler", "1.0"], str(tmp_path / "s.log"), forked=True)
        try:
            assert isinstance(sched.proc, subprocess.Popen)
            assert sched.read_address(60) and parent_of(sched.pid) == os.getpid()
        finally:
            sched.stop()
    finally:
        forkserver.let_go()


def test_the_fork_server_takes_json_only_and_answers_a_bad_request_with_an_error(
        tmp_path: Path) -> None:
    marker = tmp_path / "pickle-ran"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, "-m", "troy.frameworks.dask.forkserver",
                             str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], stderr=subprocess.PIPE)
    theirs.close()
    try:
        ours.settimeout(60)
        assert json.loads(ours.recv(4096)) == {"ready": True}
        import pickle

        class Boom:
            def __reduce__(self):  # noqa: ANN204
                return (Path(marker).write_text, ("ran",))

        r, w = os.pipe()
        for junk in (pickle.dumps(Boom()), b"{not json", json.dumps({"id": 7}).encode()):
            socket.send_fds(ours, [junk], [r, w, w])
            answer = json.loads(ours.recv(4096))
            assert "bad request" in answer["error"] and "pid" not in answer
        os.close(r)
        os.close(w)
        assert not marker.exists() and proc.poll() is None   # still serving
    finally:
        ours.close()                                          # the asker gone: it leaves
        assert proc.wait(30) == 0


def test_the_fork_server_and_its_children_leave_with_a_sigkilled_asker(tmp_path: Path
                                                                       ) -> None:
    script = textwrap.dedent(f"""
        import json, os, sys, time
        from troy.frameworks.dask import forkserver
        from troy.frameworks.dask.processes import AgentProcess
        forkserver.hold()
        s = AgentProcess(["scheduler", "1.0"], {str(tmp_path / 's.log')!r}, forked=True)
        s.read_address(60)
        print(json.dumps({{"scheduler": s.pid}}), flush=True)
        time.sleep(600)
    """)
    asker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = asker.stdout.readline()
        scheduler = json.loads(line)["scheduler"]
        server = parent_of(scheduler)
        assert parent_of(server) == asker.pid
        asker.kill()
        asker.wait()
        wait_for(lambda: not process_alive(server) and not process_alive(scheduler), 30,
                 what="the fork server and its scheduler gone")
    finally:
        asker.kill()


def test_a_framework_s_workers_are_forked_and_its_close_ends_the_fork_server(
        tmp_path: Path) -> None:
    forkserver.keep(False)   # as by default (the suite keeps it: tests/conftest.py)
    try:
        framework_forks_and_closes(tmp_path)
    finally:
        forkserver.keep()


def framework_forks_and_closes(tmp_path: Path) -> None:
    fw = DaskFramework("forked", sandbox=str(tmp_path / "sb"))
    fw.start()
    try:
        pilot = running_pilot(fw, 1)
        worker = fw._workers[pilot.id].proc.pid
        server = parent_of(worker)
        assert server != os.getpid() and parent_of(server) == os.getpid()
        assert Path(f"/proc/{worker}/comm").read_text().strip() == "troy-worker"
        unit = fw.submit_unit(CUD(executable="/bin/sh", arguments=["-c", "echo $PPID"]))
        assert unit.wait(30) is State.DONE
    finally:
        fw.close()
    assert not process_alive(worker) and not process_alive(server)


def test_a_kept_fork_server_serves_the_next_framework_and_forks_only_for_holders(
        tmp_path: Path) -> None:
    forkserver.keep()
    servers = []
    for name in ("first", "second"):
        fw = DaskFramework(name, sandbox=str(tmp_path / name))
        fw.start()
        try:
            pilot = running_pilot(fw, 1)
            servers.append(parent_of(fw._workers[pilot.id].proc.pid))
        finally:
            fw.close()
    assert servers[0] == servers[1] and process_alive(servers[0])   # one Dask import for both
    sched = AgentProcess(["scheduler", "1.0"], str(tmp_path / "s.log"), forked=True)
    try:   # kept, but no framework holds it: afresh
        assert isinstance(sched.proc, subprocess.Popen)
    finally:
        sched.stop()


def _sockets(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def test_a_task_on_a_forked_worker_cannot_ask_the_fork_server(tmp_path: Path,
                                                              held: None) -> None:
    """Only the framework's process holds the other end of the fork server's socket: a
    worker (and so a task it runs) has none of the fork server's sockets open, and nothing
    in the environment /proc shows for it names one."""
    sched = AgentProcess(["scheduler", "1.0"], str(tmp_path / "s.log"), forked=True)
    try:
        assert sched.read_address(60)
        server = parent_of(sched.pid)
        assert _sockets(server)                       # its end of the pair
        assert not _sockets(server) & _sockets(sched.pid)
        assert b"FORKSERVER" not in Path(f"/proc/{sched.pid}/environ").read_bytes()
    finally:
        sched.stop()
