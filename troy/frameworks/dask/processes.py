"""The processes and threads behind the ``dask`` framework: our worker and scheduler
processes (``AgentProcess``) and a scheduler inside this process (``InProcessScheduler``)."""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import subprocess
import sys
import threading
from typing import Any

from troy.errors import BadParameter
from troy.frameworks.dask import forkserver, guard

log = logging.getLogger(__name__)


def resolve_dask_log_level(option: str | int | None, where: str) -> int | None:
    """The level for Dask's ``distributed`` loggers from a framework's ``dask_log_level``
    option, or None to leave them as Dask configured them. ``"auto"``: WARNING, unless the
    root logger is at DEBUG (``troy --debug``, or an application debugging), which keeps
    Dask's own INFO chatter."""
    if option is None:
        return None
    if option == "auto":
        return None if logging.getLogger().getEffectiveLevel() <= logging.DEBUG \
            else logging.WARNING
    level = logging.getLevelName(option.upper()) if isinstance(option, str) else option
    if isinstance(level, bool) or not isinstance(level, int):
        raise BadParameter(f"{where}: dask_log_level: expected a logging level such as "
                           f"'WARNING' or 'INFO', got {option!r}")
    return level


def quiet_dask_here(level: int, explicit: bool) -> None:
    """Set the level of Dask's ``distributed`` loggers in this process (where the client,
    and the scheduler we start in-process, log). Without ``explicit`` (``"auto"``), only
    while they are still at Dask's own default (INFO): an application that set them keeps
    its choice."""
    import distributed  # noqa: F401  (configures its loggers on import)
    logger = logging.getLogger("distributed")
    if explicit or logger.level in (logging.NOTSET, logging.INFO):
        logger.setLevel(level)


def silence_dask() -> None:
    """Silence every ``distributed`` logger of this process: Dask logs its connection chatter
    (and closing tracebacks) at INFO and above, and the commands that run workloads (``troy
    run``, ``elasticslice run``) report unit failures themselves, so Dask speaks only under
    ``--debug``."""
    import distributed  # noqa: F401  (configures its loggers on import; we override them)
    for name in list(logging.root.manager.loggerDict):
        if name == "distributed" or name.startswith("distributed."):
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def tls_options(security: Any) -> dict[str, Any]:
    """Scheduler keyword arguments: listen on ``tls://`` with ``security``, or as Dask
    defaults (plain TCP) without one."""
    return {} if security is None else {"protocol": "tls", "security": security}


class AgentProcess:
    """``python -m troy.frameworks.dask ARGS``: logs to ``logpath``, reports its address as
    its first stdout line, and leaves when its stdin closes (see ``agent``). ``forked``:
    from the fork server, if one is held (:mod:`.forkserver`); ``proc`` is then a
    :class:`~.forkserver.ForkedProcess`, which answers as the ``Popen`` it is otherwise."""

    def __init__(self, args: list[str], logpath: str, log_level: int | None = None,
                 environ: dict[str, str] | None = None, forked: bool = False) -> None:
        self.logpath = logpath
        env = None
        if log_level is not None or environ:  # Dask reads its config from DASK_* variables
            env = dict(os.environ, **(environ or {}))
            if log_level is not None:
                env["DASK_LOGGING__DISTRIBUTED"] = logging.getLevelName(log_level)
        with open(logpath, "ab") as logf:
            # ``forked``: from the fork server, Dask already imported, if it serves (see
            # forkserver.py); else afresh
            self.proc: Any = (forked and forkserver.start(args, env, logf.fileno())) or \
                subprocess.Popen([sys.executable, "-m", "troy.frameworks.dask", *args],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                                 close_fds=True, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read_address(self, timeout: float) -> str | None:
        """Block until the process reports its address; None (and the process killed) if
        it fails or takes longer than ``timeout`` seconds."""
        watchdog = threading.Timer(timeout, self.proc.kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            line = self.proc.stdout.readline() if self.proc.stdout else b""
        finally:
            watchdog.cancel()
        try:
            return str(json.loads(line)["address"])
        except (ValueError, KeyError, TypeError):
            self.proc.kill()
            return None

    def log_tail(self) -> str:
        try:
            with open(self.logpath, "rb") as f:
                lines = f.read()[-2000:].decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def stop(self, timeout: float = 10.0) -> None:
        """Close its stdin (it leaves cleanly); kill it if it takes longer than ``timeout``."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        except (OSError, ValueError):
            pass
        if self.proc.stdout:
            self.proc.stdout.close()


class InProcessScheduler:
    """A Dask scheduler on ``host`` (127.0.0.1), ``port`` (0: any) on its own event-loop
    thread; ``tls://`` only when given a ``security``. No dashboard unless
    ``dashboard_address`` (``"127.0.0.1:0"``: loopback, any port; needs bokeh)."""

    def __init__(self, name: str, saturation: float, security: Any = None,
                 host: str = "127.0.0.1", port: int = 0,
                 dashboard_address: str | None = None, deny_file: str | None = None) -> None:
        self.name = name
        self.deny_file = deny_file
        self.dashboard_address = dashboard_address
        self.host = host
        self.port = port
        self.saturation = saturation
        self.security = security
        self.address = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._scheduler: Any = None

    def start(self, timeout: float = 30.0) -> str:
        import dask
        from distributed import Scheduler
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"troy-{self.name}-scheduler")
        self._thread.start()

        async def make() -> Any:
            with dask.config.set({"distributed.scheduler.worker-saturation": self.saturation}):
                s = Scheduler(host=self.host, port=self.port,
                              dashboard=self.dashboard_address is not None,
                              dashboard_address=self.dashboard_address or "127.0.0.1:0",
                              **tls_options(self.security))
            guard.install(s, "scheduler", deny_file=self.deny_file)
            await s
            from troy.frameworks.dask.agent import quicken
            quicken(s)
            return s

        self._scheduler = asyncio.run_coroutine_threadsafe(make(), self._loop).result(timeout)
        self.address = self._scheduler.address
        return self.address

    @property
    def scheduler(self) -> Any:
        """The ``distributed.Scheduler`` (None before ``start``): touch it on its loop only
        (:meth:`call`)."""
        return self._scheduler

    def call(self, fn: Any, timeout: float = 10.0) -> Any:
        """``fn(scheduler)`` on the scheduler's event loop (its state is the loop's alone)."""
        if self._loop is None or self._scheduler is None:
            raise RuntimeError(f"the scheduler of {self.name} is not running")
        scheduler = self._scheduler

        async def run() -> Any:
            out = fn(scheduler)
            return await out if inspect.isawaitable(out) else out
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def close(self) -> None:
        if self._loop is None:
            return
        if self._scheduler is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._scheduler.close(), self._loop).result(10)
            except Exception:  # closing anyway
                log.exception("closing the Dask scheduler of %s", self.name)
            self._scheduler = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop.close()
        self._loop = None
