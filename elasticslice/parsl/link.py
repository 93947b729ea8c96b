"""The provider's end of the local channel to its manager daemon: :class:`BlockLink`.

It starts the daemon (:meth:`BlockLink.open`; a daemon left by a provider that died is
stopped first, keeping the nodes), tells it the blocks Parsl wants (at each attach, and
whenever they change), hears back their nodes and states, the nodes that failed to start and
the drains to carry out, and answers each drain once done. A daemon that goes away (even of
SIGKILL) is started again and attached to; it hears the blocks again, with their nodes.
"""
from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticslice.channel import Channel, ChannelError, connect, daemon_answers
from elasticslice.errors import ElasticSliceError

log = logging.getLogger(__name__)

REFUSED = "the peer refused: "
RETRY = 1.0   # seconds between two attempts to attach again
START_TIMEOUT = 300.0   # seconds the daemon has to start its manager (its CM calls)
CLOSE_TIMEOUT = 300.0   # seconds the daemon has to give the slice back


class BlockLink:
    """See the module docstring. ``command``: how to start the daemon (a
    :class:`~elasticslice.parsl.daemon.ParslDaemonCommand`); ``blocks()``: the fields of a
    ``blocks`` frame now; ``on_bound(entries)``, ``on_drain(job_id, until, margin)``,
    ``on_failures(list)``: what the daemon says."""

    def __init__(self, state_dir: str | Path, command: Any, *,
                 blocks: Callable[[], dict[str, Any]],
                 on_bound: Callable[[list[dict[str, Any]]], None],
                 on_drain: Callable[[str, float, float], None],
                 on_failures: Callable[[list[dict[str, Any]]], None]) -> None:
        self.state_dir = Path(state_dir)
        self.command = command
        self.blocks, self.on_bound, self.on_drain = blocks, on_bound, on_drain
        self.on_failures = on_failures
        self.daemon: subprocess.Popen | None = None   # the daemon this process started
        self.channel: Channel | None = None
        #: the daemon told the blocks' nodes at least once since this link attached first
        self.bound = threading.Event()
        #: why the daemon refused this provider for good (None: it did not)
        self.fatal: str | None = None
        self._stop = threading.Event()
        self._attached = threading.Event()
        self._wake = threading.Event()
        self._done = threading.Event()   # the daemon closed after a ``close``
        self._closing = False
        self._bye = False                 # the daemon said bye (not: it died)
        self._thread: threading.Thread | None = None
        self._daemon_lock = threading.Lock()
        self._send_lock = threading.Lock()   # one blocks frame at a time, the newest last

    def open(self, timeout: float = START_TIMEOUT) -> BlockLink:
        """Start the daemon (after stopping one a dead provider left), attach, tell it the
        blocks and wait until its manager runs: :class:`ElasticSliceError` with its one line
        if it cannot (the caller closes the link)."""
        from elasticslice.pilots.daemon import spawn_daemon
        if daemon_answers(self.state_dir):
            self._replace_daemon()
        self.daemon = spawn_daemon(self.command, self.state_dir)
        self._attach()
        self._thread = threading.Thread(target=self._loop, name="parsl-link", daemon=True)
        self._thread.start()
        if not self.bound.wait(timeout) or self.fatal:
            raise ElasticSliceError(self.fatal or "the manager daemon did not start its "
                                                  "manager")
        return self

    def _replace_daemon(self) -> None:
        """A daemon of an earlier provider serves the state directory (that provider died):
        it stops, keeping the nodes, and ours takes them with this provider's arguments."""
        done = threading.Event()
        deadline = time.monotonic() + 5   # a provider that just died may not be let go yet
        while True:
            try:
                channel = connect(self.state_dir, on_message=lambda m: None,
                                  on_close=lambda reason: done.set())
                break
            except ChannelError as err:   # a live provider attached: its line, in the end
                if "another workload" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        log.warning("the manager daemon of %s stops (the nodes are kept): this provider "
                    "starts its own", self.state_dir)
        try:
            channel.send("close", give_back=False)
            done.wait(CLOSE_TIMEOUT)
        finally:
            channel.close()
        deadline = time.monotonic() + 30
        while daemon_answers(self.state_dir) and time.monotonic() < deadline:
            time.sleep(0.1)

    def revive(self) -> None:
        """The daemon died: a new one, which resumes from its state."""
        from elasticslice.pilots.daemon import spawn_daemon
        with self._daemon_lock:
            if self._stop.is_set() or self._closing or daemon_answers(self.state_dir):
                return
            if self.daemon is not None and self.daemon.poll() is None:
                return   # ours, still starting
            try:
                self.daemon = spawn_daemon(self.command, self.state_dir)
            except ElasticSliceError as err:
                log.warning("the manager daemon cannot start again: %s", err)
                raise ChannelError(str(err)) from err
            log.warning("the manager daemon was gone: a new one (pid %d) serves %s",
                        self.daemon.pid, self.state_dir)

    @property
    def attached(self) -> bool:
        return self._attached.is_set()

    def _attach(self) -> None:
        self.channel = connect(self.state_dir, on_message=self._on_message,
                               on_close=self._on_close)
        self._attached.set()
        self.send_blocks()

    def send_blocks(self) -> None:
        """Tell the daemon the blocks as they are now (if attached)."""
        with self._send_lock:   # built and sent together: never an older list last
            channel = self.channel
            if channel is None or channel.closed:
                return
            try:
                channel.send("blocks", **self.blocks())
            except ChannelError as err:
                log.warning("the manager daemon did not hear the blocks: %s", err)

    def send(self, kind: str, **fields: Any) -> bool:
        channel = self.channel
        if channel is None or channel.closed:
            return False
        try:
            channel.send(kind, **fields)
            return True
        except ChannelError:
            return False

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "bound":
            self.on_bound(message["bound"])
            self.bound.set()
        elif kind == "drain_block":
            self.on_drain(message["job_id"], message["until"], message["margin"])
        elif kind == "failures":
            self.on_failures(message["failures"])
        else:
            raise ChannelError(f"{kind}: not something a Parsl manager daemon sends")

    def _on_close(self, reason: str | None) -> None:
        self._attached.clear()
        self._bye = reason == "the peer said bye"
        self._done.set()
        if reason and reason.startswith(REFUSED) and not self._closing:
            self.fatal = reason[len(REFUSED):]   # its manager cannot start: no use coming back
            self._stop.set()
            self.bound.set()
            return
        if not self._stop.is_set() and not self._closing:
            log.warning("the manager daemon left (%s): starting it again", reason)
            self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(RETRY)
            self._wake.clear()
            if self._stop.is_set() or self._closing or self._attached.is_set():
                continue
            try:
                self.revive()
                if self._stop.is_set() or self._closing:
                    continue
                self._attach()
                log.warning("attached to the manager daemon again")
            except ChannelError as err:
                log.debug("attaching again: %s", err)

    def close_daemon(self, give_back: bool, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Tell the daemon the provider closes (``give_back``: the slice goes back; one
        being started again is waited for) and wait until it says it is done (False: it did
        not within ``timeout``, or is gone)."""
        deadline = time.monotonic() + 60
        while not self.attached and not self.fatal and not self._stop.is_set() \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        self._closing = True
        self._done.clear()
        if not self.send("close", give_back=give_back):
            return False
        return self._done.wait(timeout) and self._bye

    def close(self) -> None:
        """Detach, and wait for the daemon this process started to end."""
        self._stop.set()
        self._wake.set()
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        daemon, self.daemon = self.daemon, None
        if daemon is not None:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.warning("the manager daemon (pid %d) is still there: stopping it "
                            "(the nodes are kept)", daemon.pid)
                daemon.terminate()
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
