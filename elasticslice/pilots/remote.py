"""The manager daemon's view of the workload side, over the local channel.

The manager daemon holds the CloudLab credentials and the cluster CA's key and so never
decodes what a node sends; Troy's framework and session live in the workload's process
(:mod:`elasticslice.pilots.link` is its end). :class:`RemoteWorkload` stands where the
framework and the session stand for a manager in one process:
:class:`~elasticslice.pilots.manager.PilotWatch` and
:class:`~elasticslice.pilots.manager.PilotDrainer` use it as a framework (``find_pilot``,
``list_pilots``, ``drain_pilot``, ``retire``, ``lose_pilot``, ``set_pilot_values``), and the
manager reads ``demand()`` from it as from a session. What it knows is the workload side's
last report, checked JSON (:mod:`elasticslice.channel`); what it decides is sent back.

No workload attached (not started yet, or its process died): no pilot (a revoked node has
nothing to drain and goes at once; a ready node counts as without its agent, as when the
workload's process restarts today) and the last demand stands, so the slice is not shrunk
while the workload comes back. A workload that attaches hears the nodes held at once
(``held()``), then each node event as it happens.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from elasticslice.channel import DEMAND_FIELDS, Channel, ChannelError, ChannelServer
from troy import Demand
from troy.states import State

log = logging.getLogger(__name__)

REFRESH_TIMEOUT = 1.0   # seconds a decision waits for the workload's fresh report


@dataclasses.dataclass
class RemotePilot:
    """A pilot as the workload side last reported it (the attributes the manager's watch
    and drainer read of a Troy pilot)."""

    id: str
    worker_name: str        # the node's client_id
    state: State
    size: int
    busy: bool
    idle_since: float | None
    units: int = 0

    @property
    def native_id(self) -> str:
        return self.worker_name


@dataclasses.dataclass(frozen=True)
class RemoteDrain:
    """What was asked of the workload side for a revoked node's pilot."""

    pilot: str
    deadline: float
    margin: float


class RemoteWorkload:
    """The daemon's end (see the module docstring): serves the channel in ``state_dir``.
    ``held()``: the nodes held now, as ``(client_id, control address)`` pairs or
    ``(client_id, control address, site)`` (its CM's), told to a workload when it attaches; ``on_change()``: called when the demand or the pilots
    changed (the manager wakes its cycle)."""

    def __init__(self, state_dir: str | Path, *,
                 held: Callable[[], Sequence[tuple[str, ...]]] = list,
                 on_change: Callable[[], None] | None = None,
                 on_scheduler: Callable[[str], None] | None = None,
                 on_close: Callable[[bool], None] | None = None,
                 on_bounds: Callable[[int, int], None] | None = None) -> None:
        self.held = held
        self.on_change = on_change
        #: ``(address)``: where the workload's scheduler serves the nodes' agents
        self.on_scheduler = on_scheduler
        #: ``(give_back)``: the workload says the run ends
        self.on_close = on_close
        #: ``(minthreshold, maxthreshold)``: the workload's new bounds
        self.on_bounds = on_bounds
        #: the nodes the workload was told of: client_id -> (address, site)
        self._told: dict[str, tuple[str | None, str | None]] = {}
        self._failures_told = -1
        self.server = ChannelServer(state_dir, on_message=self._on_message,
                                    on_attach=self._on_attach, on_detach=self._on_detach)
        self._lock = threading.Lock()
        self._pilots: dict[str, RemotePilot] = {}
        self._demand = Demand()
        self._extra_nodes: float | None = None
        self._on_empty: dict[str, list[Callable[[Any], None]]] = {}
        self._retiring: dict[str, threading.Event] = {}   # client_id -> set when retired
        self._reading = threading.local()   # .now: this thread is handling a message
        self._attached = threading.Event()
        self._reported = threading.Condition()   # a pilots frame answered a report
        self._asked = self._answered = 0           # report sequence numbers

    # ------------------------------------------------------------------ running
    def start(self) -> RemoteWorkload:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    @property
    def attached(self) -> bool:
        """A workload is attached (from its hello to the moment its pilots are forgotten)."""
        return self._attached.is_set()

    def _send(self, kind: str, **fields: Any) -> bool:
        workload = self.server.workload
        if workload is None:
            return False
        try:
            workload.send(kind, **fields)
            return True
        except ChannelError as err:
            log.warning("the workload side did not get %s: %s", kind, err)
            return False

    # ------------------------------------------------------------------ what it says
    def _held_now(self) -> dict[str, tuple[str | None, str | None]]:
        """client_id -> (control address, site) of the nodes :attr:`held` says."""
        out: dict[str, tuple[str | None, str | None]] = {}
        for client_id, address, *site in self.held():
            out[client_id] = (address, site[0] if site else None)
        return out

    def _on_attach(self, channel: Channel) -> None:
        held = self._held_now()
        with self._lock:
            self._told = held
            self._failures_told = -1
        for client_id, (address, site) in held.items():
            channel.send("node", event="joined", client_id=client_id, address=address,
                         **({"site": site} if site else {}))
        self._attached.set()

    def tell_nodes(self) -> None:
        """Tell the workload (if attached) of the nodes held since it last heard, and of
        those gone: its framework adopts only the agents of nodes held."""
        if not self.attached:
            return
        held = self._held_now()
        with self._lock:
            told, self._told = self._told, held
        for client_id, (address, site) in held.items():
            if client_id not in told or told[client_id] != (address, site):
                self.node_event("joined", client_id, address=address, site=site)
        for client_id in told.keys() - held.keys():
            self.node_event("released", client_id)

    def tell_failures(self, failures: list[dict[str, Any]]) -> None:
        """The nodes that failed to start (``to_json`` with ``seen_at``), when there are
        more than the workload heard of (the last :data:`~elasticslice.channel.MAX_FAILURES`)."""
        if not self.attached or len(failures) == self._failures_told:
            return
        from elasticslice.channel import MAX_FAILURES
        if self._send("failures", failures=failures[-MAX_FAILURES:]):
            self._failures_told = len(failures)

    def _on_detach(self, channel: Channel, reason: str | None) -> None:
        with self._lock:
            self._pilots.clear()
            self._on_empty.clear()
            retiring, self._retiring = self._retiring, {}
        for event in retiring.values():   # nobody will answer: nothing to wait for
            event.set()
        self._attached.clear()
        self._changed()

    def _on_message(self, channel: Channel, message: dict[str, Any]) -> None:
        self._reading.now = True
        try:
            self._handle(message)
        finally:
            self._reading.now = False

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "demand":
            with self._lock:
                self._demand = Demand(**{k: message.get(k, 0) for k in DEMAND_FIELDS})
                self._extra_nodes = message.get("extra_nodes")
            self._changed()
        elif kind == "pilots":
            pilots = {}
            for entry in message["pilots"]:
                try:
                    state = State(entry["state"])
                except ValueError:
                    raise ChannelError(f"pilots: {entry['client_id'][:64]!r}: unknown state "
                                       f"{entry['state'][:32]!r}") from None
                pilots[entry["client_id"]] = RemotePilot(
                    entry["pilot_id"], entry["client_id"], state, entry["cores"],
                    entry["busy"], entry.get("idle_since"), entry.get("units", 0))
            with self._lock:
                self._pilots = pilots
            seq = message.get("seq", 0)
            if seq:
                with self._reported:
                    self._answered = max(self._answered, seq)
                    self._reported.notify_all()
            self._changed()
        elif kind == "scheduler":
            if self.on_scheduler is not None:
                self.on_scheduler(message["address"])
        elif kind == "bounds":
            if self.on_bounds is not None:
                self.on_bounds(message["minthreshold"], message["maxthreshold"])
        elif kind == "close":
            if self.on_close is not None:
                self.on_close(message["give_back"])
        elif kind == "retired":
            with self._lock:
                event = self._retiring.pop(message["client_id"], None)
            if event is None:
                log.info("the workload side says %s retired: no retirement was asked of it",
                         message["client_id"])
                return
            if not message["done"]:
                log.warning("%s: its worker did not retire in time (Dask recomputes what "
                            "only it held)", message["client_id"])
            event.set()
        elif kind == "drained":
            with self._lock:
                callbacks = self._on_empty.pop(message["client_id"], [])
                pilot = self._pilots.get(message["client_id"])
            if pilot is None or not callbacks:
                log.info("the workload side says %s drained: no drain was asked of it",
                         message["client_id"])
                return
            log.info("pilot %s of %s drained (%d unit(s) requeued)", pilot.id,
                     pilot.worker_name, message["requeued"])
            for callback in callbacks:
                callback(pilot)
        else:
            raise ChannelError(f"{kind}: not something the workload side sends")

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def refresh(self, timeout: float = REFRESH_TIMEOUT) -> bool:
        """Ask the workload for its pilots now and wait (at most ``timeout`` seconds) for
        them: a decision about to be made on them (a revoked node without a pilot goes at
        once; a victim is chosen among the idle) sees what is, not the last report. False:
        not attached, or no answer in time (the last report stands)."""
        if not self.attached:
            return False
        with self._lock:
            self._asked += 1
            seq = self._asked
        if not self._send("report", seq=seq):
            return False
        until = time.monotonic() + timeout
        with self._reported:   # a report sent before it was asked does not count
            while self._answered < seq:
                left = until - time.monotonic()
                if left <= 0 or not self.attached:
                    return False
                self._reported.wait(left)
        return True

    # ------------------------------------------------------------------ as a session
    def demand(self) -> Demand:
        with self._lock:
            return self._demand

    @property
    def extra_nodes(self) -> float | None:
        """Nodes asked for besides Troy's units (Dask's adaptive target, Parsl's slots)."""
        return self._extra_nodes

    # ------------------------------------------------------------------ as a framework
    def list_pilots(self) -> list[RemotePilot]:
        with self._lock:
            return list(self._pilots.values())

    def find_pilot(self, key: str) -> RemotePilot | None:
        with self._lock:
            found = self._pilots.get(key)
            if found is None:
                found = next((p for p in self._pilots.values() if p.id == key), None)
            return found

    def drain_pilot(self, pilot: RemotePilot, deadline: float | None = None, *,
                    margin: float = 5.0,
                    on_empty: Callable[[Any], None] | None = None) -> RemoteDrain:
        """Ask the workload side to drain ``pilot`` before ``deadline``; ``on_empty(pilot)``
        when it says the pilot is empty."""
        if deadline is None:
            raise ValueError("a remote drain needs a deadline")
        with self._lock:
            if on_empty is not None:
                self._on_empty.setdefault(pilot.worker_name, []).append(on_empty)
        self._send("drain", client_id=pilot.worker_name, until=deadline, margin=margin)
        return RemoteDrain(pilot.id, deadline, margin)

    def retire(self, pilot: RemotePilot, until: float | None = None) -> bool:
        """Ask the workload side to retire ``pilot`` (Dask moves the data only its worker
        holds to the others) and wait for its answer until ``until`` (epoch seconds): the
        node is given back after, not while its results still live only there. True once
        the workload side says it is done."""
        if until is None:
            raise ValueError("a remote retire needs a time")
        name = pilot.worker_name
        if getattr(self._reading, "now", False):   # its answer would come on this thread
            self._send("retire", client_id=name, until=until)
            return False
        event = threading.Event()
        with self._lock:
            self._retiring[name] = event
        sent = self._send("retire", client_id=name, until=until)
        answered = sent and event.wait(min(120.0, max(0.0, until - time.time())) + 1.0)
        with self._lock:
            if self._retiring.get(name) is event:
                del self._retiring[name]
        if sent and not answered:
            log.warning("%s: the workload side did not say it retired in time; giving it "
                        "back", name)
        return answered

    def lose_pilot(self, pilot: RemotePilot, reason: str = "lost") -> list[Any]:
        """Tell the workload side ``pilot`` is gone (it requeues the units); counted there,
        so nothing is returned here."""
        with self._lock:
            self._on_empty.pop(pilot.worker_name, None)
            self._pilots.pop(pilot.worker_name, None)
        self._send("lose", client_id=pilot.worker_name, reason=reason[:200])
        return []

    def set_pilot_values(self, values: dict[str, float]) -> None:
        self._send("values", values={k: float(v) for k, v in values.items()})

    def live_units(self) -> list[Any]:
        """Units are the workload side's: none here (values go by the pilots' reports)."""
        return []

    # ------------------------------------------------------------------ node events
    def node_event(self, event: str, client_id: str, *, address: str | None = None,
                   deadline: float | None = None, site: str | None = None) -> None:
        """Tell the workload side (if attached) what happened to a node (``site``: its
        CM's, for the pilot's label)."""
        fields: dict[str, Any] = {"event": event, "client_id": client_id}
        if address is not None:
            fields["address"] = address
        if site is not None:
            fields["site"] = site
        if deadline is not None:
            fields["deadline"] = deadline
        self._send("node", **fields)
