"""The Dask scheduler of a ``dask`` framework in a process of its own
(``scheduler_process=True``): both sides of it.

In the scheduler's process (``python -m troy.frameworks.dask scheduler ...``):
:func:`serve_scheduler`, which also reloads the scheduler's certificate and key when their
files change on disk (:class:`CertWatch`: whoever issues certificates replaces the files,
atomically; new handshakes take the new one, open connections keep theirs).

In the framework's process: :class:`SchedulerProcess` starts that process on a given port
and watches it; :class:`SchedulerRecovery` (mixed into ``DaskFramework``) brings a
scheduler that died back on the same address: the client reconnects (or a new one is
made) and subscribes to its topics again, the units in flight are requeued (counted as
requeued, never lost), our own pilots get a new worker, and the nodes' agents, which rejoin
the address they were given, are adopted again as new pilots (their old pilots are lost,
as when any adopted worker leaves).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from troy.frameworks.base import Pilot
from troy.frameworks.dask.events import UnitRecord
from troy.frameworks.dask.processes import AgentProcess, tls_options
from troy.states import FINAL_STATES

log = logging.getLogger(__name__)

CERT_CHECK_SECONDS = 5.0    # how often the scheduler's process looks at its certificate files
SAME_PORT_SECONDS = 30.0    # how long a restart tries the old port before it takes any
LOST_REASON = "scheduler-connection-lost"  # Dask's reason on futures of a lost scheduler


# ------------------------------------------------------------ the scheduler's process ----
def scheduler_contexts(scheduler: Any) -> list[ssl.SSLContext]:
    """The TLS contexts of a Dask scheduler that hold its certificate: its listeners' and
    its connections' out (to workers)."""
    found = [getattr(getattr(listener, "tcp_server", None), "ssl_options", None)
             for listener in getattr(scheduler, "listeners", ())]
    found.append((getattr(scheduler, "connection_args", None) or {}).get("ssl_context"))
    return list({id(c): c for c in found if isinstance(c, ssl.SSLContext)}.values())


class CertWatch:
    """Loads ``cert_file`` and ``key_file`` into ``contexts()`` when either file changes
    (its mtime, size or inode); :meth:`check` is called every few seconds. A pair that does
    not load (the key not replaced yet) is tried again at the next check; the contexts keep
    the certificate they had meanwhile."""

    def __init__(self, cert_file: str, key_file: str,
                 contexts: Callable[[], list[ssl.SSLContext]]) -> None:
        self.cert_file, self.key_file, self.contexts = cert_file, key_file, contexts
        self.loaded = self._stamp()
        self._failed: tuple | None = None

    def _stamp(self) -> tuple | None:
        try:
            return tuple((st.st_mtime_ns, st.st_size, st.st_ino)
                         for st in map(os.stat, (self.cert_file, self.key_file)))
        except OSError:
            return None

    def check(self) -> bool:
        """Reload if the files changed; whether it did."""
        stamp = self._stamp()
        if stamp is None or stamp == self.loaded:
            return False
        try:
            self._load()
        except (OSError, ssl.SSLError) as err:
            if stamp != self._failed:   # once per change, not every few seconds
                log.warning("the scheduler's new certificate %s does not load (yet): %s",
                            self.cert_file, err)
            self._failed = stamp
            return False
        self.loaded = stamp
        log.warning("the scheduler reloaded its certificate from %s", self.cert_file)
        return True


    def _load(self) -> None:
        """Load a snapshot of the pair, checked first on a scratch context: a pair that
        does not match, loaded into a live context, leaves it with the new certificate
        and the old key (every handshake then fails: no shared cipher)."""
        with tempfile.TemporaryDirectory(prefix="troy-cert-") as tmp:  # 0700: the key
            pair = []
            for name, path in (("cert.pem", self.cert_file), ("key.pem", self.key_file)):
                with open(path, "rb") as f:
                    data = f.read()
                copy = os.path.join(tmp, name)
                with open(os.open(copy, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                    f.write(data)
                pair.append(copy)
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(*pair)
            for context in self.contexts():
                context.load_cert_chain(*pair)


def close_replaced_client(client: Any) -> None:
    """Close a Dask client replaced by a new one, on a thread of its own. Dask's close of a
    client caught mid-reconnect can raise (seen under load: "IOStream is not idle; cannot
    convert to SSL"), and on that thread it printed a traceback into the run's output: the
    client is not needed any more, whatever its close says."""
    try:
        client.close(timeout=5)
    except Exception as err:
        log.info("closing a replaced Dask client: %s: %s", type(err).__name__, err)


def watch_certificate(scheduler: Any, interval: float = CERT_CHECK_SECONDS) -> CertWatch | None:
    """Keep ``scheduler`` (not started yet) serving the certificate its Dask configuration
    names, reloaded when the files change (None: no TLS)."""
    import dask
    cert = dask.config.get("distributed.comm.tls.scheduler.cert", None)
    key = dask.config.get("distributed.comm.tls.scheduler.key", None) or cert
    if not cert or getattr(scheduler, "security", None) is None \
            or not scheduler.security.require_encryption:
        return None
    from tornado.ioloop import PeriodicCallback
    watch = CertWatch(cert, key, lambda: scheduler_contexts(scheduler))
    scheduler.periodic_callbacks["troy-cert-reload"] = PeriodicCallback(watch.check,
                                                                        interval * 1000)
    return watch


async def serve_scheduler(saturation: float, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serve a scheduler (TLS when configured) until stdin closes; its address is printed
    on stdout once it serves. One line on stderr (and exit 1) if it cannot listen."""
    import dask
    from distributed import Scheduler
    from troy.frameworks.dask import guard
    from troy.frameworks.dask.agent import quicken
    from troy.frameworks.dask.tls import security_from_config
    with dask.config.set({"distributed.scheduler.worker-saturation": saturation}):
        s = Scheduler(host=host, port=port, dashboard=False,
                      dashboard_address="127.0.0.1:0",
                      **tls_options(security_from_config()))
    guard.install(s, "scheduler")
    watch_certificate(s)
    try:
        await s
    except Exception as err:  # noqa: BLE001 - the port is taken (Dask wraps the OSError);
        cause = err.__cause__ or err  # SO_REUSEADDR: TIME_WAIT is no obstacle
        sys.stderr.write(f"troy scheduler: cannot listen on {host}:{port}: {cause}\n")
        sys.stderr.flush()
        os._exit(1)
    quicken(s)
    sys.stdout.write(json.dumps({"address": s.address}) + "\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    await s.close()


# ------------------------------------------------------------ the framework's side -------
class SchedulerProcess:
    """Our scheduler's process (an ``AgentProcess``), started on ``host``:``port`` (0: any)
    and watched: ``on_exit(returncode)`` is called when it ends without :meth:`stop`."""

    def __init__(self, saturation: float, host: str, port: int, logpath: str,
                 log_level: int | None, environ: dict[str, str] | None) -> None:
        self.saturation, self.host, self.port = saturation, host, port
        self.logpath, self.log_level, self.environ = logpath, log_level, environ
        self.proc: AgentProcess | None = None
        self.address = ""
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float) -> str | None:
        """Its address once it serves; None if it did not start (``reason`` says why)."""
        self.proc = AgentProcess(["scheduler", str(self.saturation), self.host,
                                  str(self.port)], self.logpath, self.log_level, self.environ)
        address = self.proc.read_address(timeout)
        if address is None:
            self.proc.stop(1)
            return None
        self.address = address
        return address

    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None

    def reason(self) -> str:
        return (self.proc.log_tail() if self.proc is not None else "") or "no output"

    def watch(self, on_exit: Callable[[int], None]) -> None:
        proc = self.proc

        def wait() -> None:
            code = proc.proc.wait() if proc is not None else 0
            if not self._stopping:
                on_exit(code)

        threading.Thread(target=wait, daemon=True, name="troy-scheduler-watch").start()

    def stop(self) -> None:
        self._stopping = True
        if self.proc is not None:
            self.proc.stop()


class SchedulerRecovery:
    """Mixin of ``DaskFramework``: brings its scheduler process back when it dies (see the
    module). Expects the framework's scheduler options, ``_scheduler``, ``client``, its
    records and pilots; its ``_tls_environ``, ``_subscribe`` (the client's topics),
    ``_relaunch`` (a new worker for one of our pilots), ``_requeue_rec``,
    ``_handle_cluster``, ``list_pilots`` and ``adopt_joined``."""

    name: str
    client: Any
    listen: str
    port: int
    sandbox: str | None
    scheduler_address: str | None
    worker_saturation: float
    connect_timeout: float
    adopt_workers: bool
    _started: bool
    _scheduler: Any
    _security: Any
    _log_level: int | None
    _records: dict[str, UnitRecord]
    _by_key: dict[str, UnitRecord]
    _workers: dict[str, Any]
    _dead_addrs: set[str]
    _links: Any
    _dispatch_lock: Any
    _sched_lock: Any
    _scheduler_up: threading.Event

    @property
    def scheduler_pid(self) -> int | None:
        """The pid of the scheduler's process (``scheduler_process=True``), else None."""
        scheduler = self._scheduler
        return scheduler.pid if isinstance(scheduler, SchedulerProcess) else None

    def _scheduler_proc(self, port: int) -> SchedulerProcess:
        return SchedulerProcess(self.worker_saturation, self.listen, port,
                                os.path.join(self.sandbox or ".", "scheduler.log"),
                                self._log_level, self._tls_environ())

    def _watch_scheduler(self, proc: SchedulerProcess) -> None:
        proc.watch(lambda code: self._scheduler_died(proc, code))

    def _scheduler_died(self, proc: SchedulerProcess, code: int) -> None:
        """On the watch thread: ``proc`` ended on its own; bring a new one up."""
        if not self._started or self._scheduler is not proc:
            return
        self._scheduler_up.clear()   # the submitter holds what comes until it serves
        port = int(str(self.scheduler_address).rsplit(":", 1)[1])
        log.warning("framework %s: its Dask scheduler (pid %s) ended (exit %s); starting a "
                    "new one on %s", self.name, proc.pid, code, self.scheduler_address)
        stale = getattr(self.client, "scheduler_comm", None)
        # the pilots whose workers were the dead scheduler's: an agent that rejoins the new
        # one before the client does is adopted as a new pilot, which is left as it is
        old_pilots = [p for p in self.list_pilots() if p.state not in FINAL_STATES]
        proc.stop()   # its pipes
        new = self._restart_scheduler(port)
        adopted = new is not None and self._adopt_scheduler(new)
        try:
            if adopted and self._reconnect(new, stale):
                self._resume_after_scheduler(old_pilots)
        except Exception:  # noqa: BLE001 - logged; the units already requeued run nowhere
            log.exception("framework %s: resuming after its scheduler died", self.name)
        finally:
            if not adopted or new.alive():   # else the next recovery, at once, sets it
                self._scheduler_up.set()
        if adopted:   # watched from now: one recovery at a time (a dead one is seen at once)
            self._watch_scheduler(new)

    def _restart_scheduler(self, port: int) -> SchedulerProcess | None:
        """A new scheduler on ``port``, tried for :data:`SAME_PORT_SECONDS`; then on any port
        (the nodes' agents, which rejoin the old address, cannot follow: said in one line)."""
        deadline = time.monotonic() + SAME_PORT_SECONDS
        pause = 0.5
        while self._started:
            proc = self._scheduler_proc(port)
            if proc.start(self.connect_timeout + 30) is not None:
                return proc
            if time.monotonic() > deadline:
                break
            log.warning("framework %s: %s; trying again", self.name, proc.reason())
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
        if not self._started:
            return None
        log.error("framework %s: cannot serve the Dask scheduler on port %d again (%s); it "
                  "takes another port: the nodes' agents given %s cannot rejoin", self.name,
                  port, proc.reason(), self.scheduler_address)
        proc = self._scheduler_proc(0)
        if proc.start(self.connect_timeout + 30) is not None:
            return proc
        log.error("framework %s: the Dask scheduler does not start again: %s", self.name,
                  proc.reason())
        return None

    def _adopt_scheduler(self, proc: SchedulerProcess) -> bool:
        with self._sched_lock:   # close() meanwhile: it stops what it finds, not this one
            if not self._started:
                proc.stop()
                return False
            self._scheduler = proc
        return True

    def _reconnect(self, new: SchedulerProcess, stale: Any) -> bool:
        """The client on ``new``'s address: Dask's own reconnects to the same address (its
        futures are cancelled, they were the old scheduler's); else a new client. False if
        ``new`` ended meanwhile."""
        from distributed import Client
        old, address = self.client, new.address
        deadline = time.monotonic() + self.connect_timeout
        while address == self.scheduler_address and time.monotonic() < deadline:
            if not new.alive():
                return False
            comm = getattr(old, "scheduler_comm", None)
            if old.status == "running" and comm is not None and comm is not stale:
                break
            if old.status in ("closing", "closed"):
                break
            time.sleep(0.05)
        if old.status == "running" and address == self.scheduler_address \
                and old.scheduler_comm is not stale:
            with self._dispatch_lock:
                self._requeue_in_flight(lambda fut: fut.status == "cancelled")
        else:
            log.info("framework %s: its Dask client did not reconnect (%s): a new one",
                     self.name, old.status)
            client = Client(address, set_as_default=False,
                            timeout=f"{self.connect_timeout}s", security=self._security)
            with self._dispatch_lock:
                if not self._started:   # closed meanwhile: it closed the old client
                    client.close(timeout=5)
                    return False
                self._requeue_in_flight(lambda fut: True)
                self.client = client
            threading.Thread(target=close_replaced_client, args=(old,), daemon=True).start()
        self.scheduler_address = address
        self._subscribe()
        return True

    def _requeue_in_flight(self, lost: Callable[[Any], bool]) -> None:
        """Requeue the units whose Dask futures were the old scheduler's. Under
        ``_dispatch_lock``."""
        for rec in list(self._records.values()):
            fut = rec.future
            if fut is None or rec.canceling or rec.unit.state in FINAL_STATES or not lost(fut):
                continue
            rec.future = None   # nothing to cancel: the scheduler that had it is gone
            self._requeue_rec(rec, rec.addr)

    def _resume_after_scheduler(self, pilots: list[Any]) -> None:
        """The ``pilots`` (live when the scheduler died) had workers of the old scheduler:
        ours get a new worker, the others are lost (their agents rejoin and are adopted
        again, as new pilots; one adopted already is not among ``pilots``)."""
        for pilot in pilots:
            addr = pilot.native_id
            if pilot.state in FINAL_STATES or not addr or addr in self._dead_addrs:
                continue
            w = self._workers.get(pilot.id)
            if w is not None and w.proc is not None and not pilot.draining:
                self._dead_addrs.add(addr)
                if self._links is not None:   # its units were sent to the old worker
                    with self._dispatch_lock:
                        for rec in self._held_by(pilot, set()):
                            self._requeue_rec(rec, addr)
                    self._links.drop(addr)
                pilot.native_id = None   # units bound to it wait for its new worker
                threading.Thread(target=self._relaunch, args=(pilot,), daemon=True,
                                 name=f"troy-{pilot.id}-restart").start()
            else:
                self._handle_cluster({"action": "remove-worker", "worker": addr})
                if w is not None and w.proc is not None:
                    threading.Thread(target=w.proc.stop, daemon=True).start()
        if self.adopt_workers:
            self.adopt_joined()

    def _handle_done(self, fut: Any) -> None:
        """A future the client cancelled because it lost our scheduler: its unit is
        requeued (the scheduler comes back), not lost."""
        rec = self._by_key.get(fut.key)
        if isinstance(self._scheduler, SchedulerProcess) and rec is not None \
                and rec.future is fut and not rec.canceling and fut.status == "cancelled" \
                and getattr(getattr(fut._state, "exception", None), "reason", "") == LOST_REASON:
            with self._dispatch_lock:
                if rec.future is fut:
                    rec.future = None
                    self._requeue_rec(rec, rec.addr)
            return
        super()._handle_done(fut)  # type: ignore[misc]
