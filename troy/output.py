"""Keeping each task's output: the end of its stdout and stderr, written to a directory.

A unit's process writes its streams to temporary files where it runs (this machine, a Dask
worker, a node agent on a CloudLab node); the last ``TAIL_BYTES`` of each come back in its
``UnitResult`` (``troy.execution``). ``OutputKeeper`` watches a workload's tasks: when one
ends, it writes ``DIR/<task>.stdout`` and ``DIR/<task>.stderr`` (a bundled task its own
member's output) and drops the bytes from the result, so a run of any number of tasks holds
only the output of the units still in flight. A stream the task wrote nothing to gets no
file; a task whose description names its own stdout/stderr file keeps writing there.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from troy.errors import TroyError
from troy.unit import OutputTail, UnitResult

log = logging.getLogger(__name__)

STREAMS = ("stdout", "stderr")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_NAME_LIMIT = 120  # characters of a task id kept in its file names


class OutputError(TroyError):
    """The output directory cannot be made or written."""


@dataclass
class TaskFiles:
    """The kept output files of one task (absolute paths; None: nothing written)."""

    stdout: str | None = None
    stderr: str | None = None


def file_stem(task_id: str) -> str:
    """A file name for ``task_id``: itself when it is a plain name, else a cleaned-up one
    with a short hash (two ids never share files; ``../x`` never leaves the directory)."""
    clean = _UNSAFE.sub("_", task_id)[:_NAME_LIMIT]
    if clean == task_id and clean not in ("", ".", ".."):
        return clean
    return f"{clean.strip('.') or 'task'}-{hashlib.sha256(task_id.encode()).hexdigest()[:8]}"


def default_output_dir(workload_file: str, report: str | None) -> Path:
    """Beside the report (``r.json`` -> ``r-output/``), else ``./troy-out/<workload>/``."""
    if report:
        path = Path(report)
        return path.with_name(f"{path.stem}-output")
    return Path("troy-out") / (Path(workload_file).stem or "workload")


def member_result(task_id: str, unit: Any) -> UnitResult | None:
    """What ran for ``task_id`` in ``unit``: its own member's result inside a bundle (the
    bundle's when it has none: the bundle failed as a whole, e.g. its worker was lost)."""
    result = unit.result if unit is not None else None
    if result is None:
        return None
    if unit.description.bundle and task_id in unit.task_ids:
        i = unit.task_ids.index(task_id)
        if i < len(result.members):
            return result.members[i]
    return result


class OutputKeeper:
    """Writes each ended task's output into ``directory`` (see the module doc)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory).absolute()
        self._files: dict[str, TaskFiles] = {}
        self._lock = threading.Lock()
        self._stale = False  # the directory held files before: clear a task's old ones

    def open(self) -> OutputKeeper:
        """Make the directory (said now, before any task runs, if it cannot be)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._stale = any(self.directory.iterdir())
        except OSError as err:
            raise OutputError(f"--output-dir {self.directory}: cannot make it: "
                              f"{err.strerror or err}") from err
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise OutputError(f"--output-dir {self.directory}: not writable")
        return self

    def watch(self, workload: Any) -> None:
        """Keep the output of every task of ``workload`` as it ends. A task already final
        (a resumed run: it ended in an earlier one) keeps the files that run wrote here."""
        for task in workload.tasks.values():
            task.add_callback(self._on_task)
            if task.state.is_final:
                self._adopt(task.id)

    def _adopt(self, task_id: str) -> None:
        stem = file_stem(task_id)
        found = TaskFiles(*(str(p) if (p := self.directory / f"{stem}.{s}").is_file()
                            else None for s in STREAMS))
        with self._lock:
            self._files.setdefault(task_id, found)

    def _on_task(self, task: Any, state: Any) -> None:
        if state.is_final:
            self.keep(task.id, member_result(task.id, task.units[-1] if task.units
                                             else None))

    def keep(self, task_id: str, result: UnitResult | None) -> TaskFiles:
        """Write ``result``'s output as ``task_id``'s files and drop it from the result."""
        files = TaskFiles()
        stem = file_stem(task_id)
        for stream in STREAMS:
            tail = getattr(result, stream) if result is not None else None
            path = self.directory / f"{stem}.{stream}"
            if tail is not None:
                setattr(files, stream, self._write(path, tail))
                setattr(result, stream, None)
            elif self._stale:
                path.unlink(missing_ok=True)
        with self._lock:
            self._files[task_id] = files
        return files

    def _write(self, path: Path, tail: OutputTail) -> str | None:
        try:
            with open(path, "wb") as f:
                if tail.dropped:
                    f.write(f"[troy: {tail.dropped} of {tail.size} bytes dropped; the last "
                            f"{len(tail.data)} follow]\n".encode())
                f.write(tail.data)
        except OSError as err:  # one task's file is lost, not the run
            log.warning("cannot keep %s: %s", path, err.strerror or err)
            return None
        return str(path)

    def files(self, task_id: str) -> TaskFiles:
        with self._lock:
            return self._files.get(task_id) or TaskFiles()


def last_lines(path: str | None, count: int = 5, limit: int = 8192) -> list[str]:
    """The last ``count`` non-empty lines of a kept file (of its last ``limit`` bytes)."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-count:]
