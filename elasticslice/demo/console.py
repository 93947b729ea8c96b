"""What both demos share: the console (steps, details, progress lines), the demo
directory, the log file, the check that no process is left, the one-line error."""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any, TextIO

from elasticslice.errors import ElasticSliceError

MARKER = ".elasticslice-demo"


class DemoError(ElasticSliceError):
    """The demo cannot go on (bad option, a node that failed, a deadline passed)."""


def rel(path: Path) -> str:
    """``path`` relative to the current directory when it is below it (shorter lines)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def port_open(port: int | None, host: str = "127.0.0.1") -> bool:
    if not port:
        return False
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


class Console:
    """The demo's output: numbered steps, details, progress lines, events.

    On a terminal a progress line is rewritten in place; on a pipe or file each call that
    the caller chooses to show is a line of its own (the caller rate-limits them)."""

    def __init__(self, out: TextIO, quiet: bool = False, steps: int = 5) -> None:
        self.out = out
        self.quiet = quiet
        self.steps = steps
        self.step_no = 0
        self.step_title = ""
        self.tty = out.isatty()
        self._open_line = False

    def write(self, text: str = "") -> None:
        if self._open_line:
            self.out.write("\n")
            self._open_line = False
        self.out.write(text + "\n")
        self.out.flush()

    def step(self, title: str, short: str) -> None:
        self.step_no += 1
        self.step_title = short
        self.write(f"[{self.step_no}/{self.steps}] {title}")

    def detail(self, label: str, text: str = "") -> None:
        if not self.quiet:
            self.write(f"      {label:<14}{text}" if text else f"      {label}")

    def event(self, text: str) -> None:
        """A line of its own, shown even with ``quiet`` (something happened)."""
        self.write(f"        {text}")

    def progress(self, text: str, final: bool) -> None:
        """A line updated in place on a terminal; one line per call elsewhere."""
        if self.quiet:
            return
        if not self.tty:
            self.write(f"        {text}")
            return
        self.out.write(f"\r        {text}\x1b[K")
        self.out.flush()
        self._open_line = True
        if final:
            self.out.write("\n")
            self._open_line = False

    def close_line(self) -> None:
        if self._open_line:
            self.out.write("\n")
            self.out.flush()
            self._open_line = False

    @property
    def where(self) -> str:
        return (f"step {self.step_no}/{self.steps} ({self.step_title})" if self.step_no
                else "setup")


def prepare_directory(directory: Path) -> Path:
    """Recreate the demo directory; refuse to wipe one the demo did not make."""
    d = directory.resolve()
    if d.exists():
        if not d.is_dir():
            raise DemoError(f"--dir {directory}: exists and is not a directory")
        if any(d.iterdir()) and not (d / MARKER).exists():
            raise DemoError(f"--dir {directory}: exists, is not empty and was not made by "
                            f"the demo (no {MARKER} in it); choose another directory")
        for server_json in (d / "server.json", d / "emulator" / "server.json"):
            try:
                port = int(json.loads(server_json.read_text(encoding="utf-8"))["port"])
            except (OSError, ValueError, KeyError, TypeError):
                port = 0
            if port and port_open(port):
                raise DemoError(f"--dir {directory}: another demo's emulator still serves "
                                f"from it (port {port})")
        shutil.rmtree(d)
    try:
        d.mkdir(parents=True)
        (d / MARKER).write_text("made by the elasticslice demo; wiped and recreated on "
                                "every run\n", encoding="utf-8")
    except OSError as err:
        raise DemoError(f"--dir {directory}: cannot create it: {err.strerror or err}") \
            from err
    return d


def leftover_processes(*directories: Path) -> list[int]:
    """Live processes the demo left: our children (node startup commands, Dask workers)
    and anything running with a node sandbox of one of ``directories`` (daemons a startup
    command detached). Linux ``/proc``; elsewhere nothing can be checked: empty list."""
    me = os.getpid()
    marks = [f"ELASTICSLICE_NODE_DIR={d.resolve()}".encode() for d in directories]
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(entry.name) == me or fields[0] == "Z":
                continue
            if int(fields[1]) == me or (marks and any(
                    m in (entry / "environ").read_bytes() for m in marks)):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def route_dask_logs() -> None:
    """Dask logs to stderr through its own handlers (closing chatter, tracebacks); in the
    demo its records go to the demo's log file instead, like everything else."""
    import distributed  # noqa: F401  (configures its loggers on import; we re-route them)
    for name in list(logging.root.manager.loggerDict):
        if name == "distributed" or name.startswith("distributed."):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True


def setup_logging(directory: Path) -> None:
    """Everything (ours, Troy's, Dask's, warnings) goes to DIR/demo.log, nothing to the
    terminal: the terminal shows the demo's own lines."""
    handler = logging.FileHandler(directory / "demo.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    logging.captureWarnings(True)


def stop_emulator(emu: Any) -> None:
    """Stop a demo's emulator (it also kills every node process it started)."""
    demo_log = logging.getLogger("elasticslice.demo")
    demo_log.info("stopping the emulator")
    emu.stop()
    demo_log.info("emulator stopped")
