"""The first process of an emulated node: builds its machine, runs its startup commands and
reports their status.

Run as ``python -I -S nodeinit.py SPEC`` (standard library only: it runs without the
project's site-packages), SPEC being JSON: ``root`` (the node's own ``/``, a directory on
the host), ``commands`` (``[[shell, command], ...]``), ``status_fd`` (a pipe: one exit
status per line, closed when the commands are done), ``isolate`` and, with it, what the
machine is made of (:func:`elasticslice.emulator.nodefs.machine_spec`): ``image`` (per
image folder, ``usr``... and the standard library of an image's own python3, its layers,
top first, the host's own last), ``links`` (``bin -> usr/bin``
where the host has them), ``binds`` (read-only folders and files: a custom image's own
top-level folders, its own python3's binary and libpython over the placeholders of its
system layer, the node's ``geni`` folder), ``hide`` (folders to cover if the image shows them),
``hostname`` and ``cwd``; ``lifeline_fd`` (the read end of a pipe whose write end only the
emulator's process holds: end of file when that process is gone).

With ``isolate`` it is PID 1 of fresh user, PID, mount and UTS namespaces (``unshare --user
--map-root-user --pid --fork --mount --uts``). It mounts the image read-only over the
node's root (an overlay when there are layers, a bind otherwise), a /proc of its own PID
namespace, a /dev of a few devices, then makes the node's root the root (``pivot_root``)
and detaches the host's: nothing else of the host is left in sight. It locks these mounts
by moving into one more user and mount namespace (mounts inherited from a more privileged
namespace cannot be unmounted or made writable). As PID 1 it reaps the node's orphans and
stays while any node process lives; SIGTERM is passed to every process of the node. When it
dies, the kernel kills every process of the node, daemons that called ``setsid`` too. When
its emulator's process is gone (``lifeline_fd`` at end of file: killed, crashed) it takes
the node down as a delete does: SIGTERM to every process, SIGKILL after
:data:`LIFELINE_GRACE` seconds.

Without ``isolate`` (the fallback) it only runs the commands, in the node's root folder, in
the process group it was given.
"""
from __future__ import annotations

import ctypes
import encodings.ascii  # noqa: F401  (imported before the host's files go out of sight)
import encodings.utf_8  # noqa: F401
import json
import os
import signal
import sys
import threading
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 1 << 18
MS_RELATIME, MS_NOATIME, MS_NODIRATIME, MS_STRICTATIME = 1 << 21, 0x400, 0x800, 1 << 24
ST_FLAGS = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC,
            os.ST_NOATIME: MS_NOATIME, os.ST_NODIRATIME: MS_NODIRATIME,
            os.ST_RELATIME: MS_RELATIME}
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203,
                  "s390x": 217}.get(os.uname().machine, 155)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
PRIVATE = {"tmp": 0o1777, "var": 0o755, "var/tmp": 0o1777, "root": 0o700, "local": 0o755,
           "run": 0o755}
RESET_SIGNALS = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT}

_libc = ctypes.CDLL(None, use_errno=True)
_terminating = False
LIFELINE_GRACE = 3.0  # seconds between SIGTERM and SIGKILL once the emulator is gone


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


def _dir(root: str, rel: str, mode: int = 0o755) -> str:
    """``root/rel`` as a real directory: a symlink the node left on a path the init mounts
    on is removed first (it would point into the host's tree before the pivot)."""
    path = root
    for part in rel.split("/"):
        path = os.path.join(path, part)
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            os.unlink(path)
        if not os.path.isdir(path):
            os.mkdir(path, mode)
    return path


def _file(root: str, rel: str) -> str:
    path = os.path.join(_dir(root, os.path.dirname(rel)), os.path.basename(rel))
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isfile(path)):
        os.unlink(path)
    if not os.path.exists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    return path


def _locked_flags(path: str) -> int:
    """The flags of the mount holding ``path`` that a remount must keep (a user namespace
    may not drop them)."""
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in ST_FLAGS.items() if flags & st)


def bind_readonly(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _locked_flags(source))


def _escape(path: str) -> str:
    return path.replace("\\", "\\\\").replace(":", "\\:").replace(",", "\\,")


def mount_image_dir(layers: list[str], target: str) -> None:
    """One image folder: the host's alone (a read-only bind), or layers over it (a
    read-only overlay, top layer first)."""
    if len(layers) == 1:
        bind_readonly(layers[0], target)
        return
    lower = ":".join(_escape(layer) for layer in layers)
    _mount("overlay", target, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
           f"lowerdir={lower}")


def _dev(root: str) -> None:
    dev = _dir(root, "dev")
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _mount(f"/dev/{name}", _file(root, f"dev/{name}"), None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                         ("ptmx", "pts/ptmx")):
        os.symlink(target, os.path.join(dev, name))
    _mount("tmpfs", _dir(root, "dev/shm", 0o1777), "tmpfs", MS_NOSUID | MS_NODEV,
           "mode=1777,size=64m")
    try:
        _mount("devpts", _dir(root, "dev/pts"), "devpts", MS_NOSUID | MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=0620")
    except OSError:
        pass  # no terminals: startup commands have none anyway


def _proc(root: str) -> None:
    proc = _dir(root, "proc", 0o555)
    _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # what containers keep from their root too: kernel tunables and the sysrq trigger
    bind_readonly(os.path.join(proc, "sys"), os.path.join(proc, "sys"))
    trigger = os.path.join(proc, "sysrq-trigger")
    if os.path.exists(trigger):
        bind_readonly(os.path.join(root, "dev/null"), trigger)


def build(spec: dict) -> None:
    """Make the node's machine (see the module docstring) and enter it."""
    root = os.path.realpath(spec["root"])
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(root, root, None, MS_BIND | MS_REC)
    for rel, mode in PRIVATE.items():
        os.chmod(_dir(root, rel, mode), mode)
    for name, layers in spec.get("image", []):
        mount_image_dir(layers, _dir(root, name))
    for name, target in spec.get("links", {}).items():
        path = os.path.join(root, name)
        if not os.path.islink(path):
            if os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)
            if not os.path.lexists(path):
                os.symlink(target, path)
    for rel, source in spec.get("binds", []):
        rel = rel.strip("/")
        bind_readonly(source, _dir(root, rel) if os.path.isdir(source) else _file(root, rel))
    _dev(root)
    _proc(root)
    if spec.get("hostname"):
        name = spec["hostname"].encode()
        _check(_libc.sethostname(name, ctypes.c_size_t(len(name))), "sethostname")
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")
    for path in spec.get("hide", []):  # a state folder inside the image: covered
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
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


def _watch_lifeline(fd: int) -> None:
    """Block until the emulator's process is gone, then take the node down."""
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    _on_term(signal.SIGTERM, None)
    time.sleep(LIFELINE_GRACE)
    try:
        os.kill(-1, signal.SIGKILL)  # every process of this PID namespace but init
    except ProcessLookupError:
        pass


def _wait_for(pid: int) -> int:
    """Reap children (orphans too, as PID 1) until ``pid`` exits; its exit status."""
    while True:
        done, status = os.wait()
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def run(commands: list[list[str]], report: object) -> int:
    status = 0
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
            report.write(f"{status}\n")  # type: ignore[attr-defined]
        except OSError:
            pass
        if status != 0:
            break
    try:
        report.close()  # type: ignore[attr-defined]
    except OSError:
        pass
    return status


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    os.set_inheritable(spec["status_fd"], False)
    report = os.fdopen(spec["status_fd"], "w", buffering=1, encoding="ascii")
    if spec.get("isolate"):
        try:
            build(spec)
        except OSError as err:
            sys.stderr.write(f"node isolation failed: {err}\n")
            return 125
        signal.signal(signal.SIGTERM, _on_term)
        lifeline = spec.get("lifeline_fd")
        if lifeline is not None:
            os.set_inheritable(lifeline, False)
            threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
        os.chdir(spec.get("cwd") or "/")
    else:
        os.chdir(spec["root"])
    status = run(spec["commands"], report)
    if spec.get("isolate"):
        while True:  # the node lives while any of its processes does
            try:
                os.wait()
            except ChildProcessError:
                break
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
