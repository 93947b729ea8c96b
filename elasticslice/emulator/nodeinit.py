"""The first process of an emulated node: builds its machine, runs its startup command and
reports its status.

Run as ``python -I -S nodeinit.py SPEC`` (standard library only: it runs without the
project's site-packages; its siblings :mod:`nodeexec` and :mod:`nodesudo` are loaded from
its folder), SPEC being JSON: ``root`` (the node's own ``/``, a directory on the host),
``command`` (the startup command, run as runstartup runs it: :mod:`nodeexec`; null: none),
``run_as`` (``{login, uid, gid, groups}``: who runs it; null: root), ``status_fd`` (a pipe:
``runlog PATH``, then the exit status, one a line), ``isolate`` and, with it, what the
machine is made of (:func:`elasticslice.emulator.nodefs.machine_spec`): ``image`` (per
image folder, ``usr``... and the standard library of an image's own python3, its layers,
top first, the host's own last), ``links`` (``bin -> usr/bin``
where the host has them), ``binds`` (read-only folders and files: a custom image's own
top-level folders, its own python3's binary and libpython over the placeholders of its
system layer, the node's ``geni`` folder), ``hide`` (folders to cover if the image shows them),
``hostname`` and ``cwd``; ``lifeline_fd`` (the read end of a pipe whose write end only the
emulator's process holds: end of file when that process is gone); ``id_map`` (the uid and
gid map of the node's user namespace, several lines: the node's users), ``homes``
(``[path, uid, gid]`` to make) and ``sudo`` (the uids the node's sudo service serves:
:mod:`nodesudo`).

With ``isolate`` it is PID 1 of fresh user, PID, mount and UTS namespaces: made by ``unshare
--user --map-root-user --pid --fork --mount --uts`` around it (one mapping: node root is
the emulator's user), or, with ``id_map``, by itself (:func:`enter`: only a process left in
the parent namespace may write a map of several lines, so a helper child does). It mounts
the image read-only over the node's root (an overlay when there are layers, a bind
otherwise), a /proc of its own PID namespace, a /dev of a few devices, then makes the node's
root the root (``pivot_root``) and detaches the host's: nothing else of the host is left in
sight. It locks these mounts by moving into one more user and mount namespace (mounts
inherited from a more privileged namespace cannot be unmounted or made writable), mapped
one to one onto the first. As PID 1 it reaps the node's orphans and stays while any node
process lives; SIGTERM is passed to every process of the node. When it dies, the kernel
kills every process of the node, daemons that called ``setsid`` too. When its emulator's
process is gone (``lifeline_fd`` at end of file: killed, crashed) it takes the node down as
a delete does: SIGTERM to every process, SIGKILL after :data:`LIFELINE_GRACE` seconds.

Without ``isolate`` (the fallback) it only runs the command, in the node's root folder, in
the process group it was given, as the emulator's user.
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

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # its siblings, stdlib only
import nodeexec  # type: ignore[import-not-found]  # noqa: E402

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 1 << 18
MS_RELATIME, MS_NOATIME, MS_NODIRATIME, MS_STRICTATIME = 1 << 21, 0x400, 0x800, 1 << 24
ST_FLAGS = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC,
            os.ST_NOATIME: MS_NOATIME, os.ST_NODIRATIME: MS_NODIRATIME,
            os.ST_RELATIME: MS_RELATIME}
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
CLONE_NEWUTS, CLONE_NEWPID = 0x04000000, 0x20000000
PR_SET_PDEATHSIG = 1
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
    if spec.get("id_map"):  # one to one onto the node's first namespace: its users too
        _unshare_mapped(CLONE_NEWUSER | CLONE_NEWNS, _identity(spec["id_map"]))
        return
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", "0 0 1")
    _write("/proc/self/gid_map", "0 0 1")


def _identity(id_map: str) -> str:
    """The ids of ``id_map``'s namespace mapped onto themselves, line for line (a line of a
    map must fall within one line of its parent's)."""
    return "".join(f"{a} {a} {c}\n" for a, _, c in (line.split() for line in
                                                      id_map.splitlines() if line.strip()))


def _unshare_mapped(flags: int, id_map: str) -> None:
    """``unshare(flags)`` into a new user namespace mapped by ``id_map`` (uids and gids
    alike). A process may only write a one-line map of itself: a helper child, left in the
    parent namespace with its privileges there, writes this one."""
    go_read, go_write = os.pipe()
    helper = os.fork()
    if helper == 0:  # the helper: nothing here may return into the caller's code
        code = 1
        try:
            os.close(go_write)
            if os.read(go_read, 1) == b"x":
                for name in ("uid_map", "gid_map"):
                    _write(f"/proc/{os.getppid()}/{name}", id_map)
                code = 0
        except BaseException as err:  # noqa: BLE001 - reported, then the helper ends
            sys.stderr.write(f"cannot write the node's id map: {err}\n")
        finally:
            os._exit(code)
    os.close(go_read)
    try:
        done = _libc.unshare(flags) == 0
        error = ctypes.get_errno()
        os.write(go_write, b"x" if done else b"-")
    finally:
        os.close(go_write)
        _, status = os.waitpid(helper, 0)
    if not done:
        raise OSError(error, f"unshare: {os.strerror(error)}")
    if status != 0:
        raise OSError(1, "the node's id map could not be written")


def enter(id_map: str, keep: tuple[int, ...]) -> None:
    """Root of the host: make the node's user (mapped by ``id_map``), PID, mount and UTS
    namespaces, as ``unshare --pid --fork --kill-child`` would; returns in the node's PID 1.
    This process stays outside, deaf to SIGTERM and SIGINT (its PID 1 gets them), waits for
    it and exits with its status; PID 1 is killed if it dies."""
    _unshare_mapped(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS, id_map)
    child = os.fork()
    if child == 0:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    for fd in keep:  # the node's, not this process's: its end of file is the node's end
        os.close(fd)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


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


class Report:
    """The status pipe: ``runlog PATH`` once the runlog exists, then the exit status."""

    def __init__(self, fd: int) -> None:
        os.set_inheritable(fd, False)
        self._file = os.fdopen(fd, "w", buffering=1, encoding="ascii")

    def line(self, text: str) -> None:
        try:
            self._file.write(text + "\n")
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass


def _homes(homes: list[list]) -> None:
    """The users' homes on the node's disk (kept at a reboot, as the node left them)."""
    for path, uid, gid in homes:
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        if not os.path.lexists(path):
            os.mkdir(path, 0o755)
            os.chown(path, uid, gid)


def run(spec: dict, report: Report, reaper: nodeexec.Reaper, root: str, cwd: str) -> int:
    """Start the startup command as runstartup does (its runlog under ``root``, the node's
    ``/`` as this process sees it); report the runlog and, once it ends, its status; reap
    until no process of the node is left. The startup's status (0: none ran)."""
    command = spec.get("command")
    if command is None or _terminating:
        report.close()
        reaper.run()
        return 0
    startup = nodeexec.Startup(command, spec.get("run_as"),
                               root.rstrip("/") + nodeexec.RUNLOG_DIR, cwd)
    status = [startup.start(reaper)]
    report.line("runlog " + startup.log_path[len(root.rstrip("/")):])

    def finish() -> None:
        if status[0] is None:
            status[0] = startup.finish(reaper)
        report.line(str(status[0]))
        report.close()
        startup.close()

    waiter = threading.Thread(target=finish, daemon=True)
    waiter.start()
    reaper.run()
    waiter.join(timeout=5.0)
    return status[0] or 0


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    report = Report(spec["status_fd"])
    reaper = nodeexec.Reaper()
    lifeline = spec.get("lifeline_fd")
    if spec.get("isolate"):
        try:
            if spec.get("id_map"):
                enter(spec["id_map"], (spec["status_fd"], *(
                    [lifeline] if lifeline is not None else [])))
            if spec.get("sudo") is not None:
                import nodesudo  # type: ignore[import-not-found]  # before the host goes
            build(spec)
            signal.signal(signal.SIGTERM, _on_term)
            if lifeline is not None:
                os.set_inheritable(lifeline, False)
                threading.Thread(target=_watch_lifeline, args=(lifeline,),
                                 daemon=True).start()
            os.chdir(spec.get("cwd") or "/")
            _homes(spec.get("homes") or [])
            if spec.get("sudo") is not None:
                nodesudo.serve(spec["sudo"], reaper)
        except OSError as err:
            sys.stderr.write(f"node isolation failed: {err}\n")
            return 125
        return run(spec, report, reaper, "/", "/")
    os.chdir(spec["root"])
    return run(spec, report, reaper, spec["root"], spec["root"])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
