"""Work that must not run on the thread that asked for it (CloudLab's callback, the cycle):
done in order, on one thread of its own, each piece's failure logged and forgotten."""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from threading import Lock
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """``post(fn, *args)`` runs ``fn(*args)`` later on the ``name`` thread(s), in posting
    order. After :meth:`close` a post runs nothing (the manager is stopping)."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self.name = name
        self.threads = threads
        self._lock = Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._closed:
                log.debug("%s: closed, dropping %r", self.name, fn)
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
            self._pool.submit(self._run, fn, args)

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:  # one failed reaction must not stop the next
            log.exception("%s: %s failed", self.name, getattr(fn, "__name__", fn))

    def open(self) -> None:
        """Take posts again (a manager started again)."""
        with self._lock:
            self._closed = False

    def close(self, wait: bool = True) -> None:
        """Run what was posted (``wait``), then nothing more until :meth:`open`."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait)
