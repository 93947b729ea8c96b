"""A fork server for the framework's own local processes (its workers and its scheduler).

``python -m troy.frameworks.dask worker|scheduler ...`` spends most of its start importing
Dask (about half a second of CPU each, :func:`~.agent.import_dask_for_an_agent`). The fork
server is one such process, started by the first of them a framework's process asks for:
it imports Dask once, then forks each worker or scheduler from itself, which starts with
Dask already imported. Dask's own ``forkserver`` method (``distributed.worker.
multiprocessing-method``) does the same for its nannies.

What a process is asked with is what a fresh one would get: its arguments, the asker's
environment as it is then (Dask's configuration is read again from it; what Python reads at
its own start, ``PYTHONPATH`` and the like, is the fork server's), its working directory,
and its standard streams (passed as descriptors: stdin and stdout are pipes to
the asker, stderr its log). The request is JSON on a socket pair the asker made: nothing
else can ask, and nothing is unpickled. The fork server reaps its children and says how each
ended; the asker sees them as :class:`ForkedProcess`, which answers as a ``Popen`` does
(``pid``, ``stdin``, ``stdout``, ``poll``, ``wait``, ``kill``). In ``ps`` they are named
``troy-worker`` and ``troy-scheduler`` (their command line is the fork server's).

The fork server leaves when the last framework that held it closes (unless :func:`keep`
keeps it) or when its asker's end of the socket closes (its process ended, even by
SIGKILL); its children then leave as they always do, when their stdin closes.
``TROY_DASK_FORKSERVER=0`` starts each process afresh instead.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

ENV = "TROY_DASK_FORKSERVER"
READY_TIMEOUT = 60.0     # seconds the first request waits for the fork server's imports
_MAX_MESSAGE = 1 << 20


# ------------------------------------------------------------------ the asker's side -------
class ForkedProcess:
    """A process the fork server forked for us, answering as ``subprocess.Popen``."""

    def __init__(self, server: _Server, pid: int, stdin: Any, stdout: Any,
                 args: list[str]) -> None:
        self.server, self.pid, self.stdin, self.stdout, self.args = \
            server, pid, stdin, stdout, args
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        if not self._ended.is_set() and self.server.lost and not _alive(self.pid):
            self._end(-signal.SIGKILL)   # the fork server died first: how it ended is lost
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            # wakes at least each half second: if the fork server dies, poll() finds out
            self._ended.wait(0.5 if left is None else min(left, 0.5))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class _Server:
    """The asker's end: the fork server's process, its socket, and a thread that reads what
    it says (started children, ended children)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # its socket's descriptor as an argument: its environment (which /proc shows for
        # each child it forks) is the asker's as it is
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "troy.frameworks.dask.forkserver", str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=[theirs.fileno()], close_fds=True)
        theirs.close()
        self.sock = ours
        self.lost = False
        self.owner = os.getpid()
        self._lock = threading.Lock()             # one request at a time
        self._ready = threading.Event()
        self._started: dict[int, Any] = {}        # request id -> pid or error
        self._answer = threading.Condition()
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}          # exits heard before their start was read
        self._next = 0
        threading.Thread(target=self._read, name="troy-forkserver", daemon=True).start()
        atexit.register(self.close)

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(_MAX_MESSAGE)
                if not data:
                    break
                msg = json.loads(data)
                if "ready" in msg:
                    self._ready.set()
                elif "exit" in msg:
                    with self._answer:
                        child = self._children.pop(msg["exit"], None)
                        if child is None:
                            self._early[msg["exit"]] = msg["code"]
                    if child is not None:
                        child._end(msg["code"])
                else:
                    with self._answer:
                        self._started[msg["id"]] = msg.get("pid") or msg.get("error")
                        self._answer.notify_all()
        except (OSError, ValueError):
            pass
        self.lost = True
        self._ready.set()
        with self._answer:
            self._answer.notify_all()
        self.proc.poll()   # reaped, if it has ended

    def close(self) -> None:
        """When the last holder lets go, or at the asker's exit: the fork server leaves
        (its children leave as their stdin closes), and is waited for, so that nothing of
        ours outlives the asker."""
        atexit.unregister(self.close)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)   # its end reads EOF (a close would wait
        except OSError:                             # for our reader's recv to return)
            pass
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()

    def start(self, args: list[str], env: dict[str, str], cwd: str, stdin: int, stdout: int,
              stderr: int) -> ForkedProcess | None:
        if not self._ready.wait(READY_TIMEOUT) or self.lost:
            return None
        with self._lock:
            self._next += 1
            ident = self._next
            request = json.dumps({"id": ident, "args": args, "env": env, "cwd": cwd}).encode()
            try:
                socket.send_fds(self.sock, [request], [stdin, stdout, stderr])
            except OSError:
                return None
            with self._answer:
                if not self._answer.wait_for(lambda: ident in self._started or self.lost,
                                             READY_TIMEOUT):
                    return None
                answer = self._started.pop(ident, None)
        if not isinstance(answer, int):
            log.debug("fork server: %s", answer or "gone")
            return None
        return self._adopt(answer, args)

    def _adopt(self, pid: int, args: list[str]) -> ForkedProcess:
        child = ForkedProcess(self, pid, None, None, args)
        with self._answer:
            code = self._early.pop(pid, None)
            if code is None:
                self._children[pid] = child
        if code is not None:
            child._end(code)
        return child


_server: _Server | None = None
_holds = 0
_keep = False
_server_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "no", "false", "off") \
        and hasattr(socket, "send_fds") and sys.platform.startswith("linux")


def hold() -> None:
    """A framework that will start processes: the fork server starts now (its imports go on
    while the framework's other work does) and serves until every holder let it go."""
    global _holds, _server
    with _server_lock:
        _holds += 1
        if _server is not None and (_server.lost or _server.owner != os.getpid()):
            _server = None
        if _server is None and enabled():
            try:
                _server = _Server()
            except OSError as err:
                log.debug("fork server: cannot start: %s", err)


def let_go() -> None:
    """A holder is done (its processes ended): the last one stops the fork server, unless
    it is kept (:func:`keep`)."""
    global _holds, _server
    with _server_lock:
        _holds = max(0, _holds - 1)
        server, _server = (_server, None) if _holds == 0 and not _keep else (None, _server)
    if server is not None:
        server.close()


def keep(on: bool = True) -> None:
    """Keep the fork server, once a framework started it, until this process exits: for a
    program that opens and closes many ``dask`` frameworks (a notebook, a test suite), which
    then imports Dask for them once. Processes are still forked only while a framework
    holds it. ``keep(False)``: stopped again when the last holder lets go."""
    global _keep, _server
    with _server_lock:
        _keep = on
        server, _server = (_server, None) if not on and _holds == 0 else (None, _server)
    if server is not None:
        server.close()


def start(args: list[str], env: dict[str, str] | None, stderr: int) -> ForkedProcess | None:
    """``python -m troy.frameworks.dask ARGS`` forked by the fork server, with pipes as its
    stdin and stdout (``stdin``/``stdout`` of the result, as Popen's) and ``stderr`` (a
    descriptor) as its stderr; None when no framework holds it (:func:`hold`), it is off or
    it cannot serve (start the process afresh then)."""
    with _server_lock:
        server = _server if _holds and enabled() else None
    if server is None or server.lost or server.owner != os.getpid():
        return None
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        child = server.start(args, dict(os.environ if env is None else env), os.getcwd(),
                             in_r, out_w, stderr)
    finally:
        os.close(in_r)
        os.close(out_w)
    if child is None:
        os.close(in_w)
        os.close(out_r)
        return None
    child.stdin = os.fdopen(in_w, "wb")
    child.stdout = os.fdopen(out_r, "rb")
    return child


# ------------------------------------------------------------------ the fork server -------
def _child(args: list[str], env: dict[str, str], cwd: str, fds: list[int]) -> None:
    """In the forked child: become ``python -m troy.frameworks.dask ARGS``; never returns."""
    code: Any = 1
    try:
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = [sys.argv[0], *args]
        import random
        random.seed()
        try:
            with open("/proc/self/comm", "w") as f:
                f.write(f"troy-{args[0]}"[:15] if args else "troy-dask")
        except OSError:
            pass
        logging.basicConfig(level=logging.WARNING)   # as main() does, before Dask's own
        _configure_dask_again()
        from troy.frameworks.dask.agent import main
        main(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
        if isinstance(code, str):
            sys.stderr.write(code + "\n")
            code = 1
        elif code is None:
            code = 0
    except BaseException:   # as a fresh interpreter would: the traceback to the log
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code if isinstance(code, int) else 1)


def _configure_dask_again() -> None:
    """Dask's configuration and its loggers' levels as this child's environment says (the
    fork server read them from its own at import)."""
    import dask.config
    from distributed.config import initialize_logging
    dask.config.refresh()
    for name in list(logging.root.manager.loggerDict):
        if name in ("distributed", "bokeh", "tornado") or \
                name.startswith(("distributed.", "tornado.")):
            logger = logging.getLogger(name)   # as before Dask's import added its handler
            logger.handlers.clear()
            logger.propagate = True
    initialize_logging(dask.config.config)


def _serve(sock: socket.socket) -> None:
    from troy.frameworks.dask.agent import import_dask_for_an_agent
    import_dask_for_an_agent()
    import troy.frameworks.dask.agent  # noqa: F401 - what every child runs
    import troy.frameworks.dask.schedproc  # noqa: F401
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a terminal's Ctrl-C is for the asker
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    sock.send(b'{"ready": true}')
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
                except OSError:
                    os._exit(0)
                if not data:
                    os._exit(0)   # the asker is gone
                _fork(sock, data, fds, (selector, wake_r, wake_w))
            else:
                os.read(wake_r, 4096)
        _reap(sock)


def _fork(sock: socket.socket, data: bytes, fds: list[int], own: tuple[Any, ...]) -> None:
    request: Any = None
    try:
        request = json.loads(data)
        ident, args, env, cwd = request["id"], request["args"], request["env"], request["cwd"]
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} descriptors, not 3")
    except (ValueError, KeyError, TypeError) as err:
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"id": request.get("id") if isinstance(request, dict) else 0,
                              "error": f"bad request: {err}"}).encode())
        return
    pid = os.fork()
    if pid == 0:
        selector, wake_r, wake_w = own
        selector.close()
        sock.close()
        os.close(wake_r)
        os.close(wake_w)
        _child(args, env, cwd, fds)
    for fd in fds:
        os.close(fd)
    sock.send(json.dumps({"id": ident, "pid": pid}).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        try:
            sock.send(json.dumps({"exit": pid,
                                  "code": os.waitstatus_to_exitcode(status)}).encode())
        except OSError:
            os._exit(0)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
