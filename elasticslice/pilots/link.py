"""The workload side's end of the local channel to the manager daemon.

The workload's process (Troy's session and framework; later a Dask client or Parsl's
DataFlowKernel) decodes what nodes send, so it holds no CloudLab credential and no CA key:
those are the manager daemon's (:mod:`elasticslice.pilots.remote` is its end).
:class:`WorkloadLink` reports the framework's pilots and the session's demand to the daemon,
every ``interval`` seconds and at once on :meth:`report`, and carries out the daemon's
decisions on the framework: drain a revoked node's pilot before its deadline (and say when
it is empty), retire it, lose it, CloudLab's values of the pilots. The daemon's node events
say which nodes it holds, at which address (:meth:`holds`, :meth:`address_of`: the
framework's adopt filter). A daemon that goes away is waited for: the link attaches again
when it is back, and says so in one line.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticslice.channel import DEMAND_FIELDS, Channel, ChannelError, connect
from elasticslice.managers.background import Background
from troy.states import FINAL_STATES

log = logging.getLogger(__name__)

REFUSED = "the peer refused: "   # a Channel's reason when the other end said why it closed
DEFAULT_INTERVAL = 0.5   # seconds between two reports (and at once on a pilot's change)
RETRY = 1.0              # seconds between two attempts to attach again


class WorkloadLink:
    """See the module docstring. ``framework``: a Troy pilot framework; ``session``: what
    ``demand()`` is read from (a Troy session); ``extra_nodes()``: nodes asked for besides
    Troy's units (None: none)."""

    def __init__(self, state_dir: str | Path, framework: Any = None, session: Any = None, *,
                 interval: float = DEFAULT_INTERVAL,
                 extra_nodes: Callable[[], float | None] | None = None,
                 on_node: Callable[[str, str], None] | None = None,
                 on_failures: Callable[[list[dict[str, Any]]], None] | None = None,
                 revive: Callable[[], None] | None = None,
                 on_attach: Callable[[WorkloadLink], None] | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.framework = framework
        self.session = session
        self.interval = interval
        self.extra_nodes = extra_nodes
        #: ``() -> {client_id: None (busy now) or when it was last busy}``: work on the
        #: nodes the framework does not see (a Dask client's own tasks), merged into the
        #: pilots reported (``PilotWatch.activity``'s rule)
        self.activity: Callable[[], dict[str, float | None]] | None = None
        #: ``(event, client_id)`` for each node event (after the link's own bookkeeping)
        self.on_node = on_node
        self.on_failures = on_failures
        #: called before each attempt to attach again (start a daemon that died)
        self.revive = revive
        #: ``(link)``: attached (again), after the scheduler's address was told
        self.on_attach = on_attach
        #: where the nodes' agents join (told to the daemon at each attach): :meth:`serve`
        self.scheduler_address: str | None = None
        self.channel: Channel | None = None
        self._held: dict[str, str | None] = {}
        self._sites: dict[str, str] = {}   # client_id -> its site (its CM's), as told
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._attached = threading.Event()
        # a Dask round trip each: never on the reader, and never held at exit (Background)
        self._work = Background("link-decision", threads=4)
        self._thread: threading.Thread | None = None
        self._closed_by_daemon = threading.Event()
        self._closing = False   # the daemon was told the run ends: its bye is expected
        #: why the daemon refused this workload for good (None: it did not)
        self.fatal: str | None = None
        self._asked = 0         # the last report the daemon asked for (its sequence number)
        self._unsent = ""       # the last reason a report was not sent (said once)

    # ------------------------------------------------------------------ running
    def start(self) -> WorkloadLink:
        """Attach to the daemon of ``state_dir`` (:class:`ChannelError`, one line, if none
        answers) and start reporting."""
        self._attach()
        self._thread = threading.Thread(target=self._loop, name="workload-link", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._work.close(wait=False, drop=True)

    @property
    def attached(self) -> bool:
        return self._attached.is_set()

    def _attach(self) -> None:
        channel = connect(self.state_dir, on_message=self._on_message,
                          on_close=self._on_close)
        self.channel = channel
        self._attached.set()
        if self.on_attach is not None:
            self.on_attach(self)
        if self.scheduler_address is not None:
            channel.send("scheduler", address=self.scheduler_address)
        self._wake.set()

    def serve(self, framework: Any, session: Any) -> None:
        """From now on, report ``framework``'s pilots and ``session``'s demand, and tell the
        daemon where the nodes' agents join (the framework's scheduler)."""
        self.framework, self.session = framework, session
        self.scheduler_address = framework.scheduler_address
        framework.add_pilot_callback(self._pilot_changed)   # joined, ended
        channel = self.channel
        if channel is not None and not channel.closed:
            channel.send("scheduler", address=self.scheduler_address)
        self.poke()

    def _pilot_changed(self, pilot: Any, _state: Any = None) -> None:
        self._label(pilot)
        self.poke()

    def _label(self, pilot: Any) -> None:
        """The pilot's site: its node's, as the daemon told (before it gets units)."""
        description = getattr(pilot, "description", None)
        site = self.site_of(getattr(pilot, "worker_name", None) or "")
        if description is not None and site and not getattr(description, "site", None):
            description.site = site

    def site_of(self, client_id: str) -> str | None:
        """The site (its CM's) of the daemon's node ``client_id`` (None: not told)."""
        with self._lock:
            return self._sites.get(client_id)

    def accepts(self, name: str | None, address: str, resources: Any = None) -> bool:
        """The framework's ``adopt_filter``: only the agents of nodes the daemon holds."""
        return bool(name) and self.holds(str(name))

    def close_daemon(self, give_back: bool, timeout: float) -> bool:
        """Tell the daemon the run ends (``give_back``: the slice goes back) and wait until
        it says it is done (False: it did not within ``timeout`` seconds, or is gone)."""
        channel = self.channel
        if channel is None or channel.closed:
            return False
        self._closed_by_daemon.clear()
        self._closing = True
        try:
            channel.send("close", give_back=give_back)
        except ChannelError:
            return False
        return self._closed_by_daemon.wait(timeout)

    def _on_close(self, reason: str | None) -> None:
        self._closed_by_daemon.set()
        self._attached.clear()
        if reason and reason.startswith(REFUSED) and not self._closing:
            # the daemon cannot serve this run (its manager cannot start): no use coming back
            self.fatal = reason[len(REFUSED):]
            self._stop.set()
            log.info("the manager daemon stopped: %s", self.fatal)   # the caller says it
            return
        with self._lock:
            self._held.clear()   # the daemon tells them again when it is back
        if not self._stop.is_set() and not self._closing:
            log.warning("the manager daemon left (%s): waiting for it", reason)
            self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._attached.is_set():
                try:
                    if self.revive is not None:
                        self.revive()
                    self._attach()
                    log.info("attached to the manager daemon again")
                except ChannelError:
                    self._stop.wait(RETRY)
                    continue
            try:
                self.report()
                self._unsent = ""
            except ChannelError as err:
                if self._attached.is_set() and str(err) != self._unsent:
                    log.warning("the manager daemon did not get the pilots: %s", err)
                self._unsent = str(err)
            self._wake.wait(self.interval)
            self._wake.clear()

    # ------------------------------------------------------------------ reporting
    def report(self) -> None:
        """Send the demand and the pilots now."""
        channel = self.channel
        if channel is None or channel.closed:
            raise ChannelError("not attached to the manager daemon")
        if self.framework is None or self.session is None:
            return   # nothing to report before the workload's side is up
        demand = self.session.demand()
        fields: dict[str, Any] = {name: int(getattr(demand, name, 0)) for name in DEMAND_FIELDS}
        if self.extra_nodes is not None:
            fields["extra_nodes"] = self.extra_nodes()
        channel.send("demand", **fields)
        with self._lock:
            seq = self._asked   # the last report the daemon asked for: this one answers it
        other = self._activity()
        channel.send("pilots", seq=seq,
                     pilots=[self._entry(p, other) for p in self.framework.list_pilots()
                             if p.worker_name and p.state not in FINAL_STATES])

    def _activity(self) -> dict[str, float | None]:
        if self.activity is None:
            return {}
        try:
            return dict(self.activity())
        except Exception:  # noqa: BLE001 - without it, the framework's view alone
            log.exception("reading the nodes' other activity")
            return {}

    @staticmethod
    def _entry(pilot: Any, other: dict[str, float | None]) -> dict[str, Any]:
        busy, since = bool(pilot.busy), pilot.idle_since
        if pilot.worker_name in other:   # other work: busy, or idle since it ended
            last = other[pilot.worker_name]
            busy = busy or last is None
            since = None if busy else max(since or 0.0, last or 0.0) or None
        return {"client_id": pilot.worker_name, "pilot_id": pilot.id,
                "state": pilot.state.value, "cores": int(pilot.size), "busy": busy,
                "idle_since": since}

    def send_bounds(self, minthreshold: int, maxthreshold: int) -> bool:
        """Tell the daemon to hold from ``minthreshold`` to ``maxthreshold`` nodes."""
        channel = self.channel
        if channel is None or channel.closed:
            return False
        try:
            channel.send("bounds", minthreshold=minthreshold, maxthreshold=maxthreshold)
        except ChannelError:
            return False
        return True

    def poke(self) -> None:
        """Report at once (something changed)."""
        self._wake.set()

    # ------------------------------------------------------------------ the daemon's word
    def holds(self, client_id: str) -> bool:
        """Whether the daemon holds the node ``client_id`` (its events say so)."""
        with self._lock:
            return client_id in self._held

    def address_of(self, client_id: str) -> str | None:
        with self._lock:
            return self._held.get(client_id)

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "node":
            with self._lock:
                if message["event"] == "released":
                    self._held.pop(message["client_id"], None)
                    self._sites.pop(message["client_id"], None)
                else:
                    self._held[message["client_id"]] = message.get("address")
                    if message.get("site"):
                        self._sites[message["client_id"]] = message["site"]
            pilot = (self.framework.find_pilot(message["client_id"])
                     if self.framework is not None else None)
            if pilot is not None:   # joined before its site was told
                self._label(pilot)
            if self.on_node is not None:
                self.on_node(message["event"], message["client_id"])
            return
        if kind == "report":
            with self._lock:
                self._asked = max(self._asked, message["seq"])
            self.poke()
            return
        if kind == "failures":
            if self.on_failures is not None:
                self.on_failures(message["failures"])
            return
        if kind == "values":   # may be a Dask round trip: off the reader, as decisions
            if self.framework is not None:
                self._work.post(self._values, message["values"])
            return
        if kind not in ("drain", "retire", "lose"):
            raise ChannelError(f"{kind}: not something the manager daemon sends")
        self._work.post(self._decide, message)   # a Dask round trip: off the reader

    def _values(self, values: dict[str, float]) -> None:
        try:
            self.framework.set_pilot_values(values)
        except Exception:  # noqa: BLE001 - the next values come with the next cycle
            log.exception("cannot give the pilots CloudLab's values")

    def _decide(self, message: dict[str, Any]) -> None:
        client_id = message["client_id"]
        if self.framework is None:
            if message["type"] == "drain":
                self._drained(client_id, 0)
            return
        pilot = self.framework.find_pilot(client_id)
        live = pilot is not None and pilot.state not in FINAL_STATES
        try:
            if message["type"] == "drain":
                if not live:
                    self._drained(client_id, 0)
                    return
                requeued: list[str] = []   # filled once the plan is known
                plan = self.framework.drain_pilot(
                    pilot, message["until"], margin=message["margin"],
                    on_empty=lambda _p: self._drained(client_id, len(requeued)))
                requeued.extend(getattr(plan, "requeued", ()))
            elif message["type"] == "retire":
                done = self.framework.retire(pilot, message["until"]) if live else True
                self._send_back("retired", client_id=client_id, done=bool(done))
            elif message["type"] == "lose" and live:
                self.framework.lose_pilot(pilot, message["reason"])
            self.poke()
        except Exception:  # noqa: BLE001 - one decision failing leaves the link up
            log.exception("cannot %s the pilot of %s", message["type"], client_id)

    def _drained(self, client_id: str, requeued: int) -> None:
        self._send_back("drained", client_id=client_id, requeued=requeued)

    def _send_back(self, kind: str, **fields: Any) -> None:
        """Tell the daemon a decision was carried out (it may be waiting for that)."""
        channel = self.channel
        if channel is None:
            return
        try:
            channel.send(kind, **fields)
        except ChannelError as err:
            log.warning("the manager daemon did not hear that %s %s: %s",
                        fields.get("client_id"), kind, err)
