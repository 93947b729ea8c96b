"""Running a demo as a command: the directory, the log, SIGTERM as Ctrl-C, one line on
any failure (after everything is stopped), the check that nothing is left, the summary.
Both demos (elastic, the default, and ``--static``) run through ``run_demo``."""
from __future__ import annotations

import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from elasticslice.demo.console import (
    Console, leftover_processes, prepare_directory, rel, route_dask_logs, setup_logging,
)
from elasticslice.demo.static import DemoResult
from elasticslice.errors import ElasticSliceError

log = logging.getLogger("elasticslice.demo")
LEFTOVER_GRACE = 10.0


class RunnableDemo(Protocol):
    dir: Any

    def run(self) -> Any: ...
    def close(self) -> None: ...


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(directory: Path, make: Callable[[], RunnableDemo], console: Console, *,
             dask: bool, banner: str, also_watch: Sequence[Path] = ()) -> Any:
    """Recreate ``directory``, log there, ``make()`` the demo and run it; returns what
    ``run()`` returned. ``also_watch``: more directories whose node processes must be gone.
    Exits 1 (failure) or 130 (interrupted) with one line on stderr; every process the
    demo started is stopped first."""
    signal.signal(signal.SIGTERM, _terminate)
    root = logging.getLogger()
    for handler in list(root.handlers):      # nothing logged on the terminal, ever
        root.removeHandler(handler)
    root.addHandler(logging.NullHandler())
    demo: RunnableDemo | None = None
    try:
        prepare_directory(directory)
        setup_logging(directory.resolve())
        if dask:
            route_dask_logs()
        console.write(banner)
        demo = make()
        result = demo.run()
    except KeyboardInterrupt:
        fail(demo, console, None, 130)
    except Exception as err:   # ours, Troy's and anything unexpected: one line
        log.exception("demo failed in %s", console.where)
        known = isinstance(err, ElasticSliceError) or type(err).__module__.startswith("troy")
        text = str(err) if known else f"internal error: {type(err).__name__}: {err}"
        fail(demo, console, text, 1)
    finally:
        if demo is not None:
            try:
                demo.close()
            except KeyboardInterrupt:      # a second Ctrl-C while closing: close again
                demo.close()
    watch = [*also_watch, *getattr(demo, "owned_dirs", [])]
    deadline = time.monotonic() + LEFTOVER_GRACE      # processes take a moment to exit
    while (left := leftover_processes(directory, *watch)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        fail(None, console, f"processes still running after the demo: "
                            f"{', '.join(map(str, left))}", 1)
    return result


def fail(demo: RunnableDemo | None, console: Console, text: str | None, code: int) -> None:
    """Stop everything, then one line on stderr (``text`` None: interrupted)."""
    if demo is not None:
        try:
            demo.close()
        except KeyboardInterrupt:
            demo.close()
    hint = f" [log: {rel(demo.dir / 'demo.log')}]" if demo is not None else ""
    console.close_line()
    if text is None:
        sys.stderr.write(f"demo: interrupted in {console.where}; everything it started is "
                         f"stopped{hint}\n")
    else:
        sys.stderr.write(f"demo: failed in {console.where}: {text}{hint}\n")
    sys.exit(code)


def static_summary(result: DemoResult, console: Console) -> None:
    """The closing lines of ``--static``: what was acquired, released and run."""
    nodes = result.nodes
    got = Counter(x.acquired_by for x in nodes)
    gone = Counter(x.released_by for x in nodes if x.released_by)
    t = result.troy
    w = console.write
    w("")
    w("Summary")
    w(f"  nodes acquired  {len(nodes)} ({got['CreateSliver']} by CreateSliver, "
      f"{got['AddNodes']} by AddNodes), {sum(x.cores for x in nodes)} cores")
    w(f"  nodes released  {sum(gone.values())} ({gone['DeleteNodes']} by DeleteNodes, "
      f"{gone['DeleteSlice']} by DeleteSlice)")
    w(f"  tasks run       {t['tasks_done']}/{t['tasks_total']} done, {t['tasks_failed']} "
      f"failed, {t['tasks_canceled']} canceled: {t['workflow_name']} on "
      f"{len(t['pilots'])} {t['framework']} pilots, makespan {t['makespan_s']:.2f} s")
    w("  processes       none left: emulator stopped (port closed), node processes "
      "and pilots ended")
    w(f"  report          {rel(result.report_path)} (nodes; Troy report with every task)")
    w(f"  logs            {rel(result.directory / 'demo.log')}; Troy's sandbox "
      f"{rel(result.directory / 'troy')}/ (node sandboxes are wiped on release)")
    w(f"  took            {result.seconds:.1f} s")
