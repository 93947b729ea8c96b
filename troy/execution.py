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
import time
import traceback
from collections.abc import Callable

from troy.descriptions import ComputeUnitDescription
from troy.unit import UnitResult

ProcessHook = Callable[[subprocess.Popen], None]


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


def _open(path: str | None, workdir: str, mode: str):
    if path is None:
        return subprocess.DEVNULL
    full = path if os.path.isabs(path) else os.path.join(workdir, path)
    return open(full, mode)


def _run_process(cud: ComputeUnitDescription, workdir: str,
                 on_start: ProcessHook | None) -> tuple[int | None, str | None]:
    env = None
    if cud.environment:
        env = dict(os.environ)
        env.update(cud.environment)
    stdin = _open(cud.stdin, workdir, "rb")
    stdout = _open(cud.stdout, workdir, "ab")
    stderr = _open(cud.stderr, workdir, "ab")
    try:
        proc = subprocess.Popen([cud.executable, *cud.arguments], cwd=workdir, env=env,
                                stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=True)
    except OSError as err:
        return None, f"cannot start {cud.executable}: {err.strerror or err}"
    finally:
        for f in (stdin, stdout, stderr):
            if f is not subprocess.DEVNULL:
                f.close()
    if on_start is not None:
        on_start(proc)
    try:
        code = proc.wait(timeout=cud.walltime)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        return proc.returncode, f"walltime of {cud.walltime}s exceeded"
    if code < 0:
        return code, f"killed by signal {-code}"
    if code != 0:
        return code, f"exit status {code}"
    return code, None


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
        members = []
        for m in cud.bundle:
            if canceled is not None and canceled():
                members.append(UnitResult(error="canceled", start=time.time(),
                                          end=time.time()))
                continue
            members.append(execute(m, sandbox=sandbox, on_start=on_start))
        failed = [m for m in members if not m.ok]
        return UnitResult(exit_code=0 if not failed else 1, start=start, end=time.time(),
                          error=f"{len(failed)} of {len(members)} bundled tasks failed"
                          if failed else None, members=members)
    workdir = cud.working_directory or sandbox or os.getcwd()
    # a callable without staging or a working directory never touches the file system
    if cud.function is None or cud.inputs or cud.outputs or cud.working_directory:
        try:
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
        code, error = _run_process(cud, workdir, on_start)
        result = UnitResult(exit_code=code, error=error, start=start)
    if result.error is None:
        try:
            stage_out(cud, workdir)
        except OSError as err:
            result.error = f"staging out failed: {err}"
    result.end = time.time()
    return result
