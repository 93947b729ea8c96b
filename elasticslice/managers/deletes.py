"""The delete commands of a CloudLab delete notice, run before the nodes are given back.

A :class:`DeleteJob` runs the helper's shell commands one after the other, each ``/bin/sh -c``
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
from typing import Any

log = logging.getLogger(__name__)

KILL_GRACE = 1.0            # SIGTERM, then SIGKILL this much later
OUTPUT_TAIL = 2000          # bytes of a delete command's output that reach the log


class DeleteJob:
    """The delete commands of some nodes, run serially; each command a child process in its
    own process group, killed (the whole group) when ``deadline`` passes or on ``cancelled``."""

    def __init__(self, node_ids: list[str], nodelist: list[dict[str, Any]],
                 commands: list[str], deadline: float) -> None:
        self.node_ids = node_ids
        self.nodelist = nodelist
        self.commands = commands
        self.deadline = deadline  # epoch seconds; the countdown may move it
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
            if self.cancelled.is_set() or time.time() >= self.deadline:
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
                left = self.deadline - time.time()
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
