"""How a node's init runs its startup command, as CloudLab's boot scripts run it.

Loaded by :mod:`elasticslice.emulator.nodeinit` before the host's files go out of sight
(standard library only). The source is ``clientside/tmcc/common/runstartup``:

- ``background()``: the output goes to a new file ``/var/emulab/logs/runlog.XXXXXX``
  (``mktemp``, ``chmod 0644``), on the node's own disk, stdin ``/dev/null``;
- the command runs as the login tmcd names (``UID=<swapper>``): ``getpwnam`` for its uid and
  gid, the runlog ``chown``-ed to them, the groups of ``id -G``, then Perl's
  ``exec($runcmd)`` of one string: ``/bin/sh -c COMMAND``; the environment, and so HOME
  (``/root``), PATH and the working directory (``/``), are the boot scripts';
- its status is ``$? >> 8`` (a command killed by a signal reports 0), appended to the runlog
  as ``<command> returned <status>`` and sent to tmcd (``startcmdstatus``); a login without
  an account is ``fatal``: "Could not determine UID for <login>" and status 666.

:class:`Reaper`: as PID 1 the init reaps every process of the node (orphans too); whoever
started a process waits for it here.
"""
from __future__ import annotations

import os
import secrets
import string
import subprocess
import threading

RUNLOG_DIR = "/var/emulab/logs"
FATAL = 666  # runstartup's status when it cannot run the command at all
_LETTERS = string.ascii_letters + string.digits


class Reaper:
    """The init's children: :meth:`run` reaps them all (PID 1 must), :meth:`wait` gives
    the status of one that :meth:`spawn` started."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watched: set[int] = set()
        self._status: dict[int, int] = {}

    def spawn(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start a child whose status :meth:`wait` will give (even when it ends at once)."""
        with self._cond:
            proc = subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
            self._watched.add(proc.pid)
        return proc

    def wait(self, proc: subprocess.Popen[bytes]) -> int:
        """The raw wait status of a child started by :meth:`spawn`."""
        with self._cond:
            while proc.pid not in self._status:
                self._cond.wait()
            status = self._status.pop(proc.pid)
            self._watched.discard(proc.pid)
        proc.returncode = os.waitstatus_to_exitcode(status)  # nothing left for Popen to do
        return status

    def run(self) -> None:
        """Reap until the node has no process left."""
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            with self._cond:
                if pid in self._watched:
                    self._status[pid] = status
                    self._cond.notify_all()


def runlog(directory: str, owner: tuple[int, int] | None) -> tuple[int, str]:
    """``mktemp runlog.XXXXXX`` in ``directory``, mode 0644, owned by ``owner``."""
    os.makedirs(directory, 0o755, exist_ok=True)
    while True:
        path = os.path.join(directory,
                            "runlog." + "".join(secrets.choice(_LETTERS) for _ in range(6)))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except FileExistsError:
            continue
        os.fchmod(fd, 0o644)
        if owner is not None:
            os.fchown(fd, *owner)
        return fd, path


def startup_argv(command: str) -> list[str]:
    """Perl's ``exec`` of one string (runstartup's ``exec($runcmd)``)."""
    return ["/bin/sh", "-c", command]


class Startup:
    """One run of runstartup: its runlog, its process, its status."""

    def __init__(self, command: str, run_as: dict | None, logs: str, cwd: str) -> None:
        self.command = command
        self.run_as = run_as or {}
        self.logs = logs
        self.cwd = cwd
        self.log_fd = -1
        self.log_path = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, reaper: Reaper) -> int | None:
        """Open the runlog and start the command; the status at once when it cannot run."""
        uid = self.run_as.get("uid")
        owner = (uid, self.run_as["gid"]) if uid is not None else None
        self.log_fd, self.log_path = runlog(self.logs, owner)
        if self.run_as.get("login") and uid is None:
            os.write(self.log_fd, f"Could not determine UID for {self.run_as['login']}\n"
                     .encode())
            return FATAL
        switch: dict[str, object] = {}
        if uid is not None and (uid, self.run_as["gid"]) != (os.geteuid(), os.getegid()):
            switch = {"user": uid, "group": self.run_as["gid"],
                      "extra_groups": list(self.run_as.get("groups") or [])}
        try:
            self.proc = reaper.spawn(startup_argv(self.command), stdin=subprocess.DEVNULL,
                                     stdout=self.log_fd, stderr=self.log_fd, cwd=self.cwd,
                                     env=dict(os.environ), close_fds=True, **switch)
        except OSError as err:
            os.write(self.log_fd, f"cannot run {self.command}: {err}\n".encode())
            return FATAL
        return None

    def finish(self, reaper: Reaper) -> int:
        """Wait for the command: its status, ``$? >> 8``, appended to the runlog."""
        assert self.proc is not None
        status = reaper.wait(self.proc) >> 8
        try:
            os.write(self.log_fd, f"{self.command} returned {status}\n".encode())
        except OSError:
            pass
        return status

    def close(self) -> None:
        if self.log_fd >= 0:
            os.close(self.log_fd)
            self.log_fd = -1


def passwd(login: str) -> tuple[int, int, str, str] | None:
    """``getpwnam`` from the node's ``/etc/passwd``: uid, gid, home, shell."""
    for fields in _entries("/etc/passwd"):
        if len(fields) >= 7 and fields[0] == login and fields[2].isdigit() and \
                fields[3].isdigit():
            return int(fields[2]), int(fields[3]), fields[5], fields[6]
    return None


def login_of(uid: int) -> str | None:
    """``getpwuid`` from the node's ``/etc/passwd``."""
    for fields in _entries("/etc/passwd"):
        if len(fields) >= 3 and fields[2] == str(uid):
            return fields[0]
    return None


def groups_of(login: str, gid: int) -> list[int]:
    """``id -G login``: the primary group, then every group of ``/etc/group`` listing it."""
    found = [gid]
    for fields in _entries("/etc/group"):
        if len(fields) >= 4 and fields[2].isdigit() and login in fields[3].split(",") and \
                int(fields[2]) not in found:
            found.append(int(fields[2]))
    return found


def _entries(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return [line.rstrip("\n").split(":") for line in handle
                    if line.strip() and not line.startswith("#")]
    except OSError:
        return []
