"""Running one compute unit for real: a process (or a Python callable), with staging.

This is the one place that turns a ``ComputeUnitDescription`` into work. Every framework
calls ``execute`` where the unit lands (the local framework in its own process pool thread,
the Dask framework inside a worker), so a unit behaves the same whichever framework runs it.
It is a plain module-level function so that it pickles to Dask workers.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from troy.descriptions import ComputeUnitDescription
from troy.capture import TAIL_BYTES, Tail, pump
from troy.unit import OutputTail, UnitResult

ProcessHook = Callable[[subprocess.Popen], None]

# A process's stdout and stderr go to pipes read where the unit runs (troy.capture); the last
# TAIL_BYTES of each come back in the result (from a node on another machine too), so a
# unit's output costs a bounded amount of memory whatever it prints.
__all__ = ["TAIL_BYTES", "execute", "kill", "stage_in", "stage_out"]


def _split_directive(directive: str) -> tuple[str, str]:
    if ">" in directive:
        src, dst = (p.strip() for p in directive.split(">", 1))
        return src, dst
    path = directive.strip()
    return path, os.path.basename(path)


def stage_in(cud: ComputeUnitDescription, workdir: str) -> None:
    for d in cud.inputs:
        src, dst = _split_directive(d)
        target = dst if os.path.isabs(dst) else os.path.join(workdir, dst)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        shutil.copy2(src, target)


def stage_out(cud: ComputeUnitDescription, workdir: str) -> None:
    for d in cud.outputs:
        src, dst = _split_directive(d)
        source = src if os.path.isabs(src) else os.path.join(workdir, src)
        os.makedirs(os.path.dirname(os.path.abspath(dst)) or ".", exist_ok=True)
        shutil.copy2(source, dst)


_devnull: list[int] = []
_devnull_lock = threading.Lock()


def _null_input() -> int:
    """One read-only ``/dev/null`` of this process, the stdin of every unit without one
    (``subprocess.DEVNULL`` opens and closes it at every start)."""
    if not _devnull:
        with _devnull_lock:
            if not _devnull:
                _devnull.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    return _devnull[0]


def _open(path: str | None, workdir: str, mode: str):
    if path is None:
        return _null_input()
    full = path if os.path.isabs(path) else os.path.join(workdir, path)
    return open(full, mode)


def _output(path: str | None, workdir: str,
            tails: dict[int, Tail]) -> tuple[Any, Tail | None]:
    """Where a stream goes: the description's own file, else a pipe we read (its read end
    and ``Tail`` go into ``tails``)."""
    if path is not None:
        return _open(path, workdir, "ab"), None
    r, w = os.pipe()
    tails[r] = tail = Tail()
    return w, tail


def _close(f: Any) -> None:
    if isinstance(f, int):
        if f >= 0:
            os.close(f)
    elif f is not None:
        f.close()


def _run_process(cud: ComputeUnitDescription, workdir: str,
                 on_start: ProcessHook | None) -> UnitResult:
    env = None
    if cud.environment:
        env = dict(os.environ)
        env.update(cud.environment)
    if _spawn is not None:
        path = _spawn_path(cud.executable, env)
        if path is not None:
            return _run_spawned(cud, path, workdir, env, on_start)
    result = UnitResult()
    tails: dict[int, Tail] = {}
    stdin = stdout = stderr = out = err = None
    try:
        stdin = _open(cud.stdin, workdir, "rb")
        stdout, out = _output(cud.stdout, workdir, tails)
        stderr, err = _output(cud.stderr, workdir, tails)
    except OSError as e:
        result.error = f"cannot open {e.filename or 'an output file'}: {e.strerror or e}"
    else:
        try:
            proc = subprocess.Popen([cud.executable, *cud.arguments], cwd=workdir, env=env,
                                    stdin=stdin, stdout=stdout, stderr=stderr,
                                    start_new_session=True)
        except OSError as e:
            result.error = f"cannot start {cud.executable}: {e.strerror or e}"
    finally:
        for f in (stdin, stdout, stderr):  # the child has its copies (or never started)
            _close(None if f in _devnull else f)
    if result.error is not None:
        for fd in tails:
            os.close(fd)
        return result
    if on_start is not None:
        on_start(proc)
    deadline = None if cud.walltime is None else time.monotonic() + cud.walltime
    try:
        timed_out = pump(proc, tails, deadline)
        if not timed_out:
            proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out:
        _kill_group(proc)
        proc.wait()
    _ended(result, cud, proc.returncode, timed_out)
    result.stdout = out.result() if out is not None else None
    result.stderr = err.result() if err is not None else None
    return result


# -- the C runner (troy/_spawn.c, built by troy.native): the same process, the GIL free ----
try:
    if os.environ.get("TROY_SPAWN") == "python":
        raise ImportError("turned off (TROY_SPAWN=python)")
    from troy import _spawn  # type: ignore[attr-defined]
    _spawn_problem: str | None = None
except ImportError as _err:
    _spawn = None
    _spawn_problem = f"not built or not loadable ({_err}): make, or python -m troy.native"


def native_problem() -> str | None:
    """Why units' processes are not run by the C runner (None: they are)."""
    return _spawn_problem


class Spawned:
    """A unit's process the C runner started, as ``on_start`` hooks see it: its ``pid``
    (the leader of its own session: :func:`kill` kills the group)."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def __repr__(self) -> str:
        return f"Spawned(pid={self.pid}, args={self.args!r})"


def _spawn_path(executable: str | None, env: dict[str, str] | None) -> str | None:
    """The file ``subprocess`` would run for ``executable`` (searched on the unit's
    ``PATH`` as it does), or None: let ``subprocess`` try and say what is wrong (not found,
    a relative ``PATH`` entry, a search it would read differently)."""
    if not executable:
        return None
    if os.path.dirname(executable):
        return executable
    for folder in os.get_exec_path(env):
        if not os.path.isabs(folder):
            return None
        candidate = os.path.join(folder, executable)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _run_spawned(cud: ComputeUnitDescription, path: str, workdir: str,
                 env: dict[str, str] | None, on_start: ProcessHook | None) -> UnitResult:
    """:func:`_run_process` by the C runner: the same files, limits, errors and result."""
    result = UnitResult()
    files: list[Any] = []
    try:
        stdin = _open(cud.stdin, workdir, "rb")
        files.append(stdin)
        stdout = -1 if cud.stdout is None else _open(cud.stdout, workdir, "ab")
        files.append(stdout)
        stderr = -1 if cud.stderr is None else _open(cud.stderr, workdir, "ab")
        files.append(stderr)
    except OSError as e:
        for f in files:
            _close(None if f in _devnull or f == -1 else f)
        result.error = f"cannot open {e.filename or 'an output file'}: {e.strerror or e}"
        return result
    argv = [cud.executable, *cud.arguments]
    started = None
    if on_start is not None:
        def started(pid: int) -> None:
            on_start(Spawned(pid, argv))  # type: ignore[arg-type]
    fds = [f if isinstance(f, int) else f.fileno() for f in (stdin, stdout, stderr)]
    try:
        code, timed_out, out, out_size, err, err_size = _spawn.run(  # type: ignore[union-attr]
            os.fsencode(path), [os.fsencode(a) for a in argv],
            None if env is None else [os.fsencode(f"{k}={v}") for k, v in env.items()],
            os.fsencode(workdir), *fds,
            -1.0 if cud.walltime is None else float(cud.walltime), TAIL_BYTES, started)
    except OSError as e:
        result.error = f"cannot start {cud.executable}: {e.strerror or e}"
        return result
    finally:
        for f in files:
            _close(None if f in _devnull or f == -1 else f)
    _ended(result, cud, code, timed_out)
    result.stdout = None if out is None else OutputTail(data=out, size=out_size)
    result.stderr = None if err is None else OutputTail(data=err, size=err_size)
    return result


def _plain(m: ComputeUnitDescription) -> bool:
    """A member the C runner can run in a batch: a process, its streams read as usual, no
    staging, the bundle's working directory."""
    return m.function is None and bool(m.executable) and not m.bundle and m.stdin is None \
        and m.stdout is None and m.stderr is None and not m.inputs and not m.outputs \
        and m.working_directory is None


def _run_batch(cud: ComputeUnitDescription, sandbox: str | None,
               on_start: ProcessHook | None, canceled: Callable[[], bool] | None,
               start: float) -> UnitResult | None:
    """A bundle of plain members (:func:`_plain`) run by the C runner in one call (no
    Python between members but the hooks), with the results the member-by-member loop of
    :func:`execute` gives; None where that loop must run them (a member that is not plain
    or whose executable the runner cannot find, no C runner)."""
    members = cud.bundle
    if _spawn is None or not all(_plain(m) for m in members):
        return None
    specs = []
    for m in members:
        env = None
        if m.environment:
            env = dict(os.environ)
            env.update(m.environment)
        path = _spawn_path(m.executable, env)
        if path is None:
            return None
        specs.append((os.fsencode(path), [os.fsencode(a) for a in (m.executable, *m.arguments)],
                      None if env is None else [os.fsencode(f"{k}={v}") for k, v in env.items()],
                      -1.0 if m.walltime is None else float(m.walltime)))
    workdir = sandbox or os.getcwd()
    try:
        if not os.path.isdir(workdir):
            os.makedirs(workdir, exist_ok=True)
    except OSError:
        return None   # each member says so, as it would have
    started = None
    if on_start is not None:
        def started(index: int, pid: int) -> None:
            m = members[index]
            on_start(Spawned(pid, [m.executable, *m.arguments]))  # type: ignore[arg-type]
    ran = _spawn.run_batch(specs, os.fsencode(workdir), _null_input(), TAIL_BYTES,  # type: ignore[union-attr]
                           started, canceled)
    results = []
    for m, (code, timed_out, out, out_size, err, err_size, began, ended, errno_) in \
            zip(members, ran):
        result = UnitResult(start=began, end=ended)
        if errno_:
            result.error = f"cannot start {m.executable}: {os.strerror(errno_)}"
        else:
            _ended(result, m, code, timed_out)
            result.stdout = None if out is None else OutputTail(data=out, size=out_size)
            result.stderr = None if err is None else OutputTail(data=err, size=err_size)
        results.append(result)
    for _ in members[len(ran):]:   # canceled before they started
        results.append(_canceled())
    return _bundle_result(start, results)


def _canceled() -> UnitResult:
    """A bundle member canceled before it started."""
    now = time.time()
    return UnitResult(error="canceled", start=now, end=now)


def _bundle_result(start: float, members: list[UnitResult]) -> UnitResult:
    """A bundle's result from its members': failed if any failed, saying how many."""
    failed = [m for m in members if not m.ok]
    return UnitResult(exit_code=0 if not failed else 1, start=start, end=time.time(),
                      error=f"{len(failed)} of {len(members)} bundled tasks failed"
                      if failed else None, members=members)


def _ended(result: UnitResult, cud: ComputeUnitDescription, code: int,
           timed_out: bool) -> None:
    """A process's exit code (negative: its signal) and what it says, into ``result``."""
    result.exit_code = code
    if timed_out:
        result.error = f"walltime of {cud.walltime}s exceeded"
    elif code < 0:
        result.error = f"killed by signal {-code}"
    elif code != 0:
        result.error = f"exit status {code}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def kill(proc: subprocess.Popen) -> None:
    """Kill a unit's process and everything it started (it runs in its own session)."""
    _kill_group(proc)


def execute(cud: ComputeUnitDescription, *, sandbox: str | None = None,
            on_start: ProcessHook | None = None,
            canceled: Callable[[], bool] | None = None) -> UnitResult:
    """Run ``cud`` to completion and return its result; never raises for the unit's own
    failures (they are in ``result.error``). ``sandbox`` is the default working directory;
    ``on_start`` receives each started process so a caller can kill it; ``canceled``, when
    it turns true, stops a bundle before its next member (those get a "canceled" result)."""
    start = time.time()
    if cud.bundle:
        batched = _run_batch(cud, sandbox, on_start, canceled, start)
        if batched is not None:
            return batched
        members = [_canceled() if canceled is not None and canceled()
                   else execute(m, sandbox=sandbox, on_start=on_start) for m in cud.bundle]
        return _bundle_result(start, members)
    workdir = cud.working_directory or sandbox or os.getcwd()
    # a callable without staging or a working directory never touches the file system
    if cud.function is None or cud.inputs or cud.outputs or cud.working_directory:
        try:
            if not os.path.isdir(workdir):  # one stat where makedirs makes three calls
                os.makedirs(workdir, exist_ok=True)
            stage_in(cud, workdir)
        except OSError as err:
            return UnitResult(error=f"staging in failed: {err}", start=start, end=time.time())
    if cud.function is not None:
        try:
            value = cud.function(*cud.args, **cud.kwargs)
        except (Exception, SystemExit) as err:  # sys.exit() in a unit fails the unit only
            return UnitResult(error=f"{type(err).__name__}: {err}\n{traceback.format_exc()}",
                              start=start, end=time.time())
        result = UnitResult(value=value, start=start)
    else:
        result = _run_process(cud, workdir, on_start)
        result.start = start
    if result.error is None:
        try:
            stage_out(cud, workdir)
        except OSError as err:
            result.error = f"staging out failed: {err}"
    result.end = time.time()
    return result
