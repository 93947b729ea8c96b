"""The node's sudo service: passwordless ``sudo`` for the node's users, with no setuid binary.

CloudLab's images give the experiment's users passwordless sudo (``/etc/sudoers.d``). A box
node's image is the host's, read-only, where a setuid ``sudo`` may not exist (and setuid
files on the host's disk would be a hole), so the node's init (root of the node) serves its
users on a UNIX socket, :data:`SOCKET` (mode 0666 in a folder only root may change), one
thread per request. The box's ``/usr/bin/sudo`` (:mod:`elasticslice.emulator.sudoclient`)
is its client.

A request: 4 bytes of length, then JSON ``{argv, user, env, settings, preserve_env,
set_home}``, with the caller's stdin, stdout, stderr and working directory as descriptors
(``SCM_RIGHTS``). The caller is who the kernel says (``SO_PEERCRED``): a uid that is not one
of the node's users (nor root) is refused before anything of its request is read. The
command runs as ``user`` (``-u``; root by default) with its uid, gid and groups (``id -G``),
the caller's descriptors and directory, and sudo's environment (:func:`environment`); lines
``{"signal": N}`` from the caller (SIGINT, SIGTERM, SIGHUP, SIGQUIT) are sent to it; the
reply is one line, ``{"status": N}``, ``{"signal": N}`` (killed by it) or ``{"error": ...,
"status": 1}``.

Loaded by :mod:`elasticslice.emulator.nodeinit` before the host's files go out of sight
(standard library only).
"""
from __future__ import annotations

import array
import json
import os
import shutil
import signal
import socket
import struct
import sys
import threading

try:  # in the node's init, a sibling on sys.path; in the project, its module
    import nodeexec  # type: ignore[import-not-found]
except ImportError:
    from elasticslice.emulator import nodeexec

SOCKET_DIR = "/run/box-sudo"
SOCKET = f"{SOCKET_DIR}/socket"
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KEPT = ("TERM", "COLORTERM", "DISPLAY", "LANG", "LANGUAGE", "TZ", "XAUTHORITY")
FORWARDED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
MAX_REQUEST = 1 << 20
FDS = 4  # stdin, stdout, stderr, working directory


def serve(users: list[int], reaper: nodeexec.Reaper, path: str = SOCKET) -> socket.socket:
    """Listen at ``path`` for the node's ``users`` (uids; root may too); requests are served
    on threads of their own while the init lives."""
    os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o755)
    if os.path.lexists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)  # anyone connects; SO_PEERCRED says who may be served
    listener.listen(64)
    allowed = frozenset([0, *users])
    threading.Thread(target=_accept, args=(listener, allowed, reaper), daemon=True,
                     name="sudo").start()
    return listener


def _accept(listener: socket.socket, allowed: frozenset[int], reaper: nodeexec.Reaper) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve_one, args=(conn, allowed, reaper), daemon=True).start()


def _reply(conn: socket.socket, **answer: object) -> None:
    try:
        conn.sendall(json.dumps(answer).encode() + b"\n")
    except OSError:
        pass


def _serve_one(conn: socket.socket, allowed: frozenset[int], reaper: nodeexec.Reaper) -> None:
    fds: list[int] = []
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, gid = struct.unpack("3i", creds)
        if uid not in allowed:  # nothing of a stranger's request is read, its fds neither
            _reply(conn, status=1, error=f"sudo: uid {uid} is not a user of this node: the "
                   "box's sudo serves the node's users only")
            return
        request, fds = _receive(conn)
        _run(conn, request, fds, uid, gid, reaper)
    except (OSError, ValueError, KeyError, TypeError) as err:
        _reply(conn, status=1, error=f"sudo: bad request: {err}")
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        conn.close()


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(FDS * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    if len(data) < 4:
        raise ValueError("short request")
    (size,) = struct.unpack("!I", data[:4])
    if size > MAX_REQUEST:
        raise ValueError("request too large")
    body = data[4:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("request cut short")
        body += chunk
    if len(received) != FDS:
        raise ValueError(f"{len(received)} descriptors, not {FDS}")
    request = json.loads(body.decode("utf-8"))
    if not isinstance(request, dict) or not isinstance(request.get("argv"), list) or \
            not request["argv"] or not all(isinstance(a, str) for a in request["argv"]):
        raise ValueError("no command")
    return request, received


def environment(request: dict, target: str, home: str, shell: str, caller: str, uid: int,
                gid: int, command: str) -> dict[str, str]:
    """sudo's environment: ``env_reset`` (a few of the caller's variables kept) or, with
    ``-E``, the caller's; PATH the secure path; HOME the target's unless ``-E`` without
    ``-H``; the target's USER, LOGNAME, SHELL; SUDO_USER, SUDO_UID, SUDO_GID, SUDO_COMMAND."""
    given = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
    if request.get("preserve_env"):
        env = dict(given)
        if request.get("set_home") or "HOME" not in env:
            env["HOME"] = home
    else:
        env = {k: v for k, v in given.items() if k in KEPT or k.startswith("LC_")}
        env["HOME"] = home
    env.update({"PATH": SECURE_PATH, "USER": target, "LOGNAME": target, "SHELL": shell,
                "MAIL": f"/var/mail/{target}", "SUDO_USER": caller, "SUDO_UID": str(uid),
                "SUDO_GID": str(gid), "SUDO_COMMAND": command})
    env.update({str(k): str(v) for k, v in (request.get("settings") or {}).items()})
    return env


def _run(conn: socket.socket, request: dict, fds: list[int], uid: int, gid: int,
         reaper: nodeexec.Reaper) -> None:
    target = str(request.get("user") or "root")
    if target.startswith("#") and target[1:].isdigit():
        target = nodeexec.login_of(int(target[1:])) or target
    account = nodeexec.passwd(target)
    if account is None:
        _reply(conn, status=1, error=f"sudo: unknown user {target}")
        return
    t_uid, t_gid, home, shell = account
    argv = list(request["argv"])
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=SECURE_PATH)
    if program is None:
        _reply(conn, status=1, error=f"sudo: {argv[0]}: command not found")
        return
    caller = nodeexec.login_of(uid) or f"#{uid}"
    env = environment(request, target, home, shell or "/bin/sh", caller, uid, gid,
                      " ".join([program, *argv[1:]]))
    switch: dict[str, object] = {}
    if (t_uid, t_gid) != (os.geteuid(), os.getegid()):
        switch = {"user": t_uid, "group": t_gid,
                  "extra_groups": nodeexec.groups_of(target, t_gid)}
    try:
        cwd = os.readlink(f"/proc/self/fd/{fds[3]}")
        if not os.path.isdir(cwd):
            cwd = "/"
        proc = reaper.spawn(argv, executable=program, stdin=fds[0], stdout=fds[1],
                            stderr=fds[2], cwd=cwd, env=env, close_fds=True, **switch)
    except OSError as err:
        _reply(conn, status=1, error=f"sudo: unable to execute {program}: "
                                     f"{err.strerror or err}")
        return
    for fd in fds:  # the command holds them now: a caller's pipe closes when it ends
        os.close(fd)
    fds.clear()
    threading.Thread(target=_relay, args=(conn, proc.pid), daemon=True).start()
    status = reaper.wait(proc)
    if os.WIFSIGNALED(status):
        _reply(conn, signal=os.WTERMSIG(status))
    else:
        _reply(conn, status=os.WEXITSTATUS(status))


def _relay(conn: socket.socket, pid: int) -> None:
    """The caller's signals, one JSON line each, to the command."""
    buffer = b""
    while True:
        try:
            chunk = conn.recv(4096)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                signum = int(json.loads(line.decode())["signal"])
            except (ValueError, KeyError, TypeError):
                continue
            if signum in FORWARDED:
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass


if __name__ == "__main__":  # pragma: no cover - a module of the init, not a program
    sys.exit("nodesudo is loaded by the node's init")
