"""Work that must not run on the thread that asked for it (CloudLab's callback, the cycle, the
workload link's reader): done in order, on threads of its own, each piece's failure logged
and forgotten."""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_Item = tuple[Callable[..., Any], tuple[Any, ...]] | None


class Background:
    """``post(fn, *args)`` runs ``fn(*args)`` later on up to ``threads`` threads named
    ``name``, in posting order. After :meth:`close` a post runs nothing (the manager is
    stopping).

    The threads are daemon threads, not a ``concurrent.futures`` pool: Python joins those
    pools' threads at exit, and one piece stuck in a call whose peer went away (a drain's
    ``run_on_scheduler`` after a Ctrl-C) held its process's exit for good."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self.name = name
        self.threads = threads
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Item] | None = None
        self._workers: list[threading.Thread] = []
        self._closed = False

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._closed:
                log.debug("%s: closed, dropping %r", self.name, fn)
                return
            if self._queue is None:
                self._queue = queue.SimpleQueue()
            self._queue.put((fn, args))
            if len(self._workers) < self.threads:
                worker = threading.Thread(target=self._serve, args=(self._queue,),
                                          name=f"{self.name}_{len(self._workers)}",
                                          daemon=True)
                self._workers.append(worker)
                worker.start()

    def _serve(self, work: queue.SimpleQueue[_Item]) -> None:
        while (item := work.get()) is not None:
            fn, args = item
            try:
                fn(*args)
            except Exception:  # one failed reaction must not stop the next
                log.exception("%s: %s failed", self.name, getattr(fn, "__name__", fn))

    def open(self) -> None:
        """Take posts again (a manager started again)."""
        with self._lock:
            self._closed = False

    def close(self, wait: bool = True, drop: bool = False) -> None:
        """Nothing more until :meth:`open`; what was posted runs (``drop``: what has not
        started is dropped) and is waited for (``wait``; never from one of these threads)."""
        with self._lock:
            self._closed = True
            work, workers = self._queue, self._workers
            self._queue, self._workers = None, []
        if work is None:
            return
        if drop:
            while True:
                try:
                    work.get_nowait()
                except queue.Empty:
                    break
        for _ in workers:
            work.put(None)
        if wait:
            for worker in workers:
                if worker is not threading.current_thread():
                    worker.join()
