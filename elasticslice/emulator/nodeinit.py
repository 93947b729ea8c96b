"""The first process of an emulated node: runs its startup commands and reports their status.

Run as ``python -I -S nodeinit.py SPEC`` (standard library only: it runs without the
project's site-packages), SPEC being JSON: ``sandbox``, ``commands`` (``[[shell, command],
...]``), ``status_fd`` (a pipe: one exit status per line, closed when the commands are done)
and ``hide`` (the emulator directory, or null).

With ``hide`` it is PID 1 of fresh user, PID and mount namespaces (``unshare --user
--map-root-user --pid --fork --mount``): it covers the emulator directory with an empty
read-only tmpfs, binds the node's sandbox back at its own path, mounts a /proc of the node's
PID namespace (the emulator's processes, their environment, cwd and open files are out of
sight), and locks these mounts by moving into one more user and mount namespace (mounts
inherited from a more privileged namespace cannot be unmounted or separated). As PID 1 it
reaps the node's orphans and stays while any node process lives; SIGTERM is passed to every
process of the node. When it dies, the kernel kills every process of the node, daemons that
called ``setsid`` too.

Without ``hide`` (the fallback) it only runs the commands, in the process group it was given.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC = 0x20, 0x1000, 0x4000
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
O_PATH = 0o10000000
RESET_SIGNALS = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT}

_libc = ctypes.CDLL(None, use_errno=True)
_terminating = False


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags),
                       enc(data)), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)


def hide(emulator_dir: str, sandbox: str) -> None:
    """Leave only ``sandbox`` of ``emulator_dir`` in sight, and a /proc of this node only."""
    rel = os.path.relpath(sandbox, emulator_dir)
    if rel.startswith(".."):
        raise OSError(f"sandbox {sandbox} is not inside {emulator_dir}")
    keep = os.open(sandbox, O_PATH | os.O_DIRECTORY)
    _mount("tmpfs", emulator_dir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
    os.makedirs(os.path.join(emulator_dir, rel))
    _mount(f"/proc/self/fd/{keep}", os.path.join(emulator_dir, rel), None, MS_BIND | MS_REC)
    os.close(keep)
    _mount(None, emulator_dir, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # lock the mounts: in a less privileged mount namespace they cannot be undone
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", "0 0 1")
    _write("/proc/self/gid_map", "0 0 1")


def _on_term(_signum: int, _frame: object) -> None:
    global _terminating
    _terminating = True
    try:
        os.kill(-1, signal.SIGTERM)  # every process of this PID namespace but init
    except ProcessLookupError:
        pass


def _wait_for(pid: int) -> int:
    """Reap children (orphans too, as PID 1) until ``pid`` exits; its exit status."""
    while True:
        done, status = os.wait()
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def run(commands: list[list[str]], status_fd: int) -> int:
    status = 0
    report = os.fdopen(status_fd, "w", buffering=1, encoding="ascii")
    for shell, command in commands:
        if _terminating:
            break
        try:
            pid = os.posix_spawn(shell, [shell, "-c", command], dict(os.environ),
                                 file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull,
                                                os.O_RDONLY, 0)],
                                 setsigdef=RESET_SIGNALS, setsigmask=())
        except OSError as err:
            sys.stderr.write(f"cannot start {shell}: {err}\n")
            status = 127
        else:
            status = _wait_for(pid)
        try:
            report.write(f"{status}\n")
        except OSError:
            pass
        if status != 0:
            break
    try:
        report.close()
    except OSError:
        pass
    return status


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    os.set_inheritable(spec["status_fd"], False)
    if spec.get("hide"):
        try:
            hide(spec["hide"], spec["sandbox"])
        except OSError as err:
            sys.stderr.write(f"node isolation failed: {err}\n")
            return 125
        signal.signal(signal.SIGTERM, _on_term)
    os.chdir(spec["sandbox"])
    status = run(spec["commands"], spec["status_fd"])
    if spec.get("hide"):
        while True:  # the node lives while any of its processes does
            try:
                os.wait()
            except ChildProcessError:
                break
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
