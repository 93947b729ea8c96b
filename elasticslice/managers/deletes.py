"""The delete commands of a CloudLab delete notice, run before the nodes are given back.

:class:`CommandReleaser` is how a manager without pilots releases revoked nodes: the
helper's commands for them, in a job bounded by the revocation's deadline (carried from the
notice, never recomputed), on a small pool of threads; when the job ends the nodes are
released (the next answer says ``max_wait_time`` 0). A :class:`DeleteJob` runs the helper's shell commands one after the other, each ``/bin/sh -c``
in its own process group with the nodes in its environment, and kills the group when the
deadline passes (the countdown may move it earlier) or the job is cancelled. Output goes to a
temporary file, not a pipe, so a command that leaves a child behind cannot hold the job open;
its tail is logged, the command line is not.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from elasticslice.managers.records import PendingDelete

log = logging.getLogger(__name__)

KILL_GRACE = 1.0            # SIGTERM, then SIGKILL this much later
OUTPUT_TAIL = 2000          # bytes of a delete command's output that reach the log
MAX_PARALLEL_DELETES = 4    # delete jobs running at once; more wait their turn


class DeleteJob:
    """The delete commands of some nodes, run serially; each command a child process in its
    own process group, killed (the whole group) when ``deadline`` passes or on ``cancelled``."""

    def __init__(self, node_ids: list[str], nodelist: list[dict[str, Any]],
                 commands: list[str], deadline: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.node_ids = node_ids
        self.nodelist = nodelist
        self.commands = commands
        self.deadline = deadline  # the clock's seconds; the countdown may move it earlier
        self.clock = clock
        self.cancelled = threading.Event()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["ELASTICSLICE_DELETE_NODES"] = " ".join(self.node_ids)
        env["ELASTICSLICE_DELETE_CLIENT_IDS"] = " ".join(
            str(n.get("client_id") or "") for n in self.nodelist)
        return env

    def run(self) -> str:
        """``done`` (every command exited 0), ``failed`` (one did not) or ``killed``."""
        outcome = "done"
        for index, command in enumerate(self.commands, 1):
            if self.cancelled.is_set() or self.clock() >= self.deadline:
                return "killed"
            code = self._run_one(index, command)
            if code is None:
                return "killed"
            if code != 0:
                outcome = "failed"
        return outcome

    def _run_one(self, index: int, command: str) -> int | None:
        what = f"delete command {index}/{len(self.commands)} for {' '.join(self.node_ids)}"
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                                        start_new_session=True)
            except OSError as err:
                log.warning("%s could not start: %s", what, err.strerror or err)
                return 127
            code: int | None = None
            while code is None:
                left = self.deadline - self.clock()
                if left <= 0 or self.cancelled.is_set():
                    _kill_group(proc)
                    why = "cancelled" if self.cancelled.is_set() else "deadline passed"
                    log.warning("%s killed (%s)", what, why)
                    _log_output(what, out, logging.WARNING)
                    return None
                try:
                    code = proc.wait(timeout=min(left, 0.25))
                except subprocess.TimeoutExpired:
                    pass
            level = logging.INFO if code == 0 else logging.WARNING
            log.log(level, "%s exited %d", what, code)
            _log_output(what, out, level)
            return code


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _log_output(what: str, out: Any, level: int) -> None:
    out.seek(0, os.SEEK_END)
    size = out.tell()
    out.seek(max(0, size - OUTPUT_TAIL))
    text = out.read().decode("utf-8", "replace").strip()
    if text:
        cut = "..." if size > OUTPUT_TAIL else ""
        log.log(level, "%s output: %s%s", what, cut, " | ".join(text.splitlines()))


Commands = Callable[[list[dict[str, Any]]], list[str]]
Finished = Callable[[list[str], str], None]


class CommandReleaser:
    """Releases revoked nodes by running ``commands(nodelist)`` (the helper's delete
    commands) in :class:`DeleteJob` s; ``finished(node_ids, outcome)`` is called when a
    job ends (done, failed, killed) or could not start (no-time, done when there is nothing
    to run). ``delete_in_group``: one job for the fresh nodes of a notice (bounded by the
    earliest deadline), else one job per node. ``start`` returns at once."""

    def __init__(self, commands: Commands, finished: Finished, *, delete_in_group: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        self.commands = commands
        self.finished = finished
        self.delete_in_group = delete_in_group
        self.clock = clock
        self._lock = threading.Lock()
        self._jobs: set[DeleteJob] = set()
        self._deadlines: dict[str, float] = {}   # a countdown that came before the job
        self._gone: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None

    def start(self, revocations: Sequence[PendingDelete]) -> None:
        groups = [list(revocations)] if self.delete_in_group else [[r] for r in revocations]
        for group in groups:
            if group:
                self._start(group)

    def _start(self, group: list[PendingDelete]) -> None:
        now = self.clock()
        node_ids = [r.node_id for r in group]
        deadline = min(r.deadline for r in group)
        nodelist = [{"node_id": r.node_id, "client_id": r.client_id,
                     "max_wait_time": max(0, int(r.deadline - now))} for r in group]
        if deadline <= now:
            log.info("no time to run delete commands for %s: CloudLab may have them already",
                     " ".join(node_ids))
            self.finished(node_ids, "no-time")
            return
        try:
            commands = self.commands(nodelist)
        except Exception:
            log.exception("get_delete_commands failed for %s", " ".join(node_ids))
            self.finished(node_ids, "failed")
            return
        if not commands:
            self.finished(node_ids, "done")
            return
        job = DeleteJob(node_ids, nodelist, commands, deadline, self.clock)
        with self._lock:
            job.deadline = min([deadline] + [self._deadlines.pop(i) for i in node_ids
                                             if i in self._deadlines])
            self._jobs.add(job)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(MAX_PARALLEL_DELETES,
                                                thread_name_prefix="delete")
            self._pool.submit(self._run, job)

    def _run(self, job: DeleteJob) -> None:
        try:
            outcome = job.run()
        except Exception:
            log.exception("delete job for %s failed", " ".join(job.node_ids))
            outcome = "failed"
        finally:
            with self._lock:
                self._jobs.discard(job)
        self.finished(job.node_ids, outcome)

    def hurry(self, revocation: PendingDelete) -> None:
        """The countdown brought a deadline earlier: its job is killed by then."""
        with self._lock:
            jobs = [j for j in self._jobs if revocation.node_id in j.node_ids]
            for job in jobs:
                job.deadline = min(job.deadline, revocation.deadline)
            if not jobs:
                self._deadlines[revocation.node_id] = revocation.deadline

    def gone(self, revocations: Sequence[PendingDelete], *, now: bool = False) -> None:
        """CloudLab took (or takes ``now``) these nodes: a job all of whose nodes are gone
        stops."""
        with self._lock:
            self._gone.update(r.node_id for r in revocations)
            for job in self._jobs:
                if all(i in self._gone for i in job.node_ids):
                    job.cancelled.set()

    def running(self) -> int:
        with self._lock:
            return len(self._jobs)

    def close(self) -> None:
        """Kill running commands and stop the pool."""
        with self._lock:
            for job in self._jobs:
                job.cancelled.set()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
