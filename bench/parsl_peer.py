"""Parsl as a peer of Troy in ``bench_troy``: one HighThroughputExecutor block of 2 worker
processes on this machine, listening on 127.0.0.1 only, unencrypted (as the Dask cluster the
bench compares it with: plain TCP on loopback).

The apps are Parsl's two ways of running an executable: a ``python_app`` that runs it with
``subprocess`` and a ``bash_app``; and a ``python_app`` no-op for the null figure.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

import parsl
from parsl.app.app import bash_app, python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider


@python_app
def null_app() -> None:
    return None


@python_app
def true_python_app() -> int:
    import subprocess
    return subprocess.call(["/bin/true"])


@bash_app
def true_bash_app() -> str:
    return "/bin/true"


APPS: dict[str, Callable[[], Any]] = {"null": null_app, "python_app": true_python_app,
                                      "bash_app": true_bash_app}


class ParslPeer:
    """A loaded Parsl DataFlowKernel with ``workers`` HTEX workers (context manager)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._dir = ""

    def __enter__(self) -> ParslPeer:
        # interchange.py and process_worker_pool.py are console scripts of the venv we run in
        bindir = os.path.dirname(sys.executable)
        if bindir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        # the workers unpickle the apps by reference: they import this module
        here = os.path.dirname(os.path.abspath(__file__))
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if here not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([here] + [p for p in paths if p])
        self._dir = tempfile.mkdtemp(prefix="bench-parsl-")
        executor = HighThroughputExecutor(
            label="htex", address="127.0.0.1", loopback_address="127.0.0.1",
            encrypted=False, max_workers_per_node=self.workers, cores_per_worker=1,
            worker_logdir_root=self._dir,
            provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1))
        parsl.load(Config(executors=[executor], run_dir=self._dir, strategy="none",
                          usage_tracking=0, initialize_logging=False))
        for name in ("parsl", "parsl.dataflow", "parsl.executors"):
            logging.getLogger(name).setLevel(logging.WARNING)
        self.burst("null", 4 * self.workers)  # both workers up and serving
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            parsl.dfk().cleanup()
        finally:
            parsl.clear()
            shutil.rmtree(self._dir, ignore_errors=True)

    def burst(self, app: str, n: int) -> float:
        """Seconds to submit ``n`` calls of ``app`` at once and collect every result."""
        fn = APPS[app]
        t0 = time.perf_counter()
        futures = [fn() for _ in range(n)]
        for f in futures:
            f.result()
        return time.perf_counter() - t0

    def once(self) -> None:
        null_app().result()
