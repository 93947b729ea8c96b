"""UnitService: submits compute units across every pilot framework of a session (seed 003).

A scheduler picks the framework for each unit (and a pilot, with ``early_binding=True``);
otherwise binding is left to the framework (late binding). A unit no framework can take now
is queued in the service (state PENDING) and tried again whenever a pilot changes state or a
unit finishes; a service created with ``wait=False`` raises ``NoSuccess`` instead.

A unit submitted with ``frameworks`` (names) goes only to those frameworks: its scheduler
sees a view of the service that lists just them. A workload manager submits an overlay's
late-bound units this way, so they stay on the frameworks holding the overlay's pilots.

Queued units are offered in the service's ``order`` (:mod:`troy.order`): by default the
longest ``runtime`` hint first, the others as they came; ``order="fifo"``: as they came.

Dispatch of queued units happens in one service thread, so framework callbacks (which may
run in a framework's own threads) never call back into a framework while it is busy.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from troy.descriptions import ComputeUnitDescription
from troy.errors import DoesNotExist, IncorrectState, NoSuccess
from troy.frameworks.base import Pilot, PilotFramework
from troy.order import check_order
from troy.order import rank as rank_of
from troy.schedulers import BaseScheduler, could_ever_fit, get_scheduler
from troy.states import FINAL_STATES, State
from troy.unit import ComputeUnit, UnitResult

if TYPE_CHECKING:
    from troy.session import Session

log = logging.getLogger(__name__)

UnitLike = ComputeUnit | ComputeUnitDescription | dict[str, Any]


class _ScopedView:
    """The unit service as a scheduler sees it for a unit limited to some frameworks:
    ``list_pilot_frameworks()`` lists only those; everything else is the service's."""

    def __init__(self, service: UnitService, names: frozenset[str]) -> None:
        self._service = service
        self._names = names

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    def list_pilot_frameworks(self) -> list[PilotFramework]:
        return [fw for fw in self._service.list_pilot_frameworks() if fw.name in self._names]


class UnitService:
    """Units over the frameworks of ``session`` (live: frameworks added later count too)."""

    def __init__(self, session: Session, scheduler: str | type[BaseScheduler] | BaseScheduler
                 = "round_robin", *, wait: bool = True, early_binding: bool = False,
                 order: str = "longest_first") -> None:
        self.session = session
        self.scheduler = get_scheduler(scheduler)
        #: the order queued units are offered to the scheduler in (:mod:`troy.order`)
        self.order = check_order(order)
        self.wait = wait
        self.early_binding = early_binding
        self._units: dict[str, ComputeUnit] = {}
        # the units not final yet, and how many ended DONE: what the session's demand reads
        # every manager cycle, without walking every unit the session ever ran
        self._live: dict[str, ComputeUnit] = {}
        self._done = 0
        self._queue: dict[str, ComputeUnit] = {}  # insertion-ordered: the queue order
        self._rank: dict[str, float] = {}  # queued unit id -> its sort key (longest first)
        self._scopes: dict[str, frozenset[str]] = {}  # unit id -> frameworks it may use
        self._lock = threading.RLock()
        self._dispatch_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._shared: str | None = None  # the scheduler name, if the session shares it
        # False while an earlier unit of the current pass waits: later units then take free
        # cores only, not room in a pilot's backlog (see schedulers.backlog_pilot)
        self.backlog_ok = True

    def __repr__(self) -> str:
        return (f"<UnitService {self.scheduler.name!r} units={len(self._units)} "
                f"queued={len(self._queue)}>")

    # -- the public API schedulers use ------------------------------------------------
    def list_pilot_frameworks(self) -> list[PilotFramework]:
        """The session's frameworks, in the order they were added."""
        return list(self.session.frameworks.values())

    def get_framework(self, name: str) -> PilotFramework:
        try:
            return self.session.frameworks[name]
        except KeyError:
            raise DoesNotExist(f"no pilot framework named {name!r}; known: "
                               f"{', '.join(self.session.frameworks) or 'none'}") from None

    # -- units --------------------------------------------------------------------------
    def submit_unit(self, unit: UnitLike, pilot: Pilot | str | None = None) -> ComputeUnit:
        """Submit one unit; ``pilot`` (a Pilot or pilot id) binds it early, bypassing the
        scheduler. Returns at once; the unit may still be queued (state PENDING)."""
        return self.submit_units([unit], pilot=pilot)[0]

    def submit_units(self, units: Iterable[UnitLike], pilot: Pilot | str | None = None,
                     workload: str | None = None, stored: bool = False,
                     frameworks: Collection[str] | None = None) -> list[ComputeUnit]:
        """Submit several units (recorded in the store in one transaction, unless
        ``stored`` says they already are, as a workload manager's are). ``frameworks``
        (names): late-bound units go only to these (default: any of the session's)."""
        if self._closed:
            raise IncorrectState("the unit service is closed")
        cus = [u if isinstance(u, ComputeUnit) else ComputeUnit(ComputeUnitDescription.coerce(u))
               for u in units]
        target = self._find_pilot(pilot) if pilot is not None else None
        for u in cus:
            u._set_state(State.PENDING)
            # recorded before its task hears of it: a run woken by its last task's end and
            # closing the store at once still finds that unit's final state queued there
            u.add_callback(self._on_unit, first=True)
        if stored:
            for u in cus:
                self.session.store.record(u)
        else:
            self.session.store.add_units(cus, session=self.session.id, workload=workload)
        with self._lock:
            for u in cus:
                known = u.id in self._units
                self._units[u.id] = u
                if u.state not in FINAL_STATES:
                    self._live[u.id] = u
                elif u.state is State.DONE and not known:   # final already: no callback
                    self._done += 1   # will count it (it found no live unit, or none came)
                if frameworks is not None and target is None:
                    self._scopes[u.id] = frozenset(frameworks)
        if target is not None:
            for u in cus:
                target.framework.submit_unit(u, target)
            return cus
        with self._lock:
            self._enqueue(cus)
        if not self.wait:
            self._pass(raise_unplaced=True)
        else:
            self._kick()
        return cus

    def _enqueue(self, units: list[ComputeUnit]) -> None:
        """Queue ``units`` (lock held) in the service's order. Longest first: each queued
        unit's rank is kept (:func:`troy.order.rank`), and the queue is sorted again only
        when a new unit passes one already queued, by a stable sort on a dict's C-level
        lookup (ties as they came; no Python call per queued unit, a queue may be long)."""
        if self.order == "fifo":
            self._queue.update((u.id, u) for u in units)
            return
        rank = self._rank
        last = rank.get(next(reversed(self._queue))) if self._queue else None
        new = [rank_of(u.description.runtime) for u in units]
        rank.update(zip((u.id for u in units), new))
        self._queue.update((u.id, u) for u in units)
        if new and (any(a > b for a, b in zip(new, new[1:]))
                    or (last is not None and new[0] < last)):
            uids = sorted(self._queue, key=rank.__getitem__)
            self._queue = dict(zip(uids, map(self._queue.__getitem__, uids)))

    def _dequeue(self, uid: str) -> None:
        """Take ``uid`` out of the queue (lock held)."""
        self._queue.pop(uid, None)
        self._scopes.pop(uid, None)
        self._rank.pop(uid, None)

    def _find_pilot(self, pilot: Pilot | str) -> Pilot:
        if isinstance(pilot, Pilot):
            return pilot
        for fw in self.list_pilot_frameworks():
            for p in fw.list_pilots():
                if p.id == pilot:
                    return p
        raise DoesNotExist(f"no pilot {pilot!r} in any framework of the session")

    def list_units(self) -> list[ComputeUnit]:
        with self._lock:
            return list(self._units.values())

    def live_units(self) -> list[ComputeUnit]:
        """The units of this service that are not final yet."""
        with self._lock:
            return list(self._live.values())

    @property
    def units_done(self) -> int:
        """How many of this service's units ended DONE."""
        return self._done

    def queued_units(self) -> list[ComputeUnit]:
        """The units waiting in this service's queue, in its order."""
        with self._lock:
            return list(self._queue.values())

    def get_unit(self, uid: str) -> ComputeUnit:
        with self._lock:
            try:
                return self._units[uid]
            except KeyError:
                raise DoesNotExist(f"no unit {uid!r} in this unit service") from None

    def wait_units(self, units: Sequence[ComputeUnit] | None = None,
                   timeout: float | None = None) -> list[State]:
        """Block until the units (default: all of this service's) are final, or ``timeout``
        seconds pass; returns their states (non-final ones if the timeout hit)."""
        todo = list(units) if units is not None else self.list_units()
        deadline = None if timeout is None else time.monotonic() + timeout
        for u in todo:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            u.wait(left)
        return [u.state for u in todo]

    def cancel_units(self, units: Sequence[ComputeUnit] | None = None) -> None:
        """Cancel the units (default: every unit of this service not yet final)."""
        todo = list(units) if units is not None else self.list_units()
        with self._lock:
            ids = {u.id for u in todo}
            for uid in ids:
                self._dequeue(uid)
        for u in todo:
            if u.state not in FINAL_STATES:
                u.cancel()

    def close(self) -> None:
        """Stop dispatching; units still queued in the service become CANCELED."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            queued, self._queue = list(self._queue.values()), {}
            self._rank.clear()
        self._wake.set()
        for u in queued:
            u._set_state(State.CANCELED)

    # -- dispatching --------------------------------------------------------------------
    def _on_unit(self, unit: ComputeUnit, state: State) -> None:
        self.session.store.record(unit, state)
        if state in FINAL_STATES:
            with self._lock:
                if self._live.pop(unit.id, None) is not None and state is State.DONE:
                    self._done += 1
            self._kick()

    def _kick(self) -> None:
        """Something changed (a pilot, a unit, the queue): try the queue again soon."""
        if self._closed:
            return
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, daemon=True,
                                                    name=f"troy-units-{self.scheduler.name}")
                    self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while not self._closed:
            # events wake us at once; the timeout is only a safety net
            self._wake.wait(1.0)
            self._wake.clear()
            if self._closed:
                break
            try:
                self._pass()
            except Exception:  # keep dispatching whatever one pass did
                log.exception("unit service dispatch pass failed")

    def _queue_scopes(self, queued: dict[str, ComputeUnit]) -> set[frozenset[str] | None]:
        """The scopes of the ``queued`` units (None: any framework), from the few units that
        have one: a pass that finds everything full must not walk the whole queue again."""
        with self._lock:
            scoped = [scope for uid, scope in self._scopes.items() if uid in queued]
        return {*scoped, None} if len(scoped) < len(queued) else set(scoped)

    def _pass(self, raise_unplaced: bool = False) -> None:
        """Offer every queued unit to the scheduler, in order."""
        with self._dispatch_lock:
            with self._lock:
                queued = dict(self._queue)
            queue = list(queued.values())
            if not queue:
                return
            sched = self.scheduler
            done: set[str] = set()
            unplaced: list[ComputeUnit] = []
            # per framework scope (None: every framework): the narrowest unit not placed
            narrowest: dict[frozenset[str] | None, int] = {}
            full: set[frozenset[str] | None] = set()  # scopes where nothing fits at all
            scopes: set[frozenset[str] | None] | None = None
            self.backlog_ok = True
            # a framework takes what one pass placed at once (see PilotFramework.holding)
            holds = contextlib.ExitStack()
            held: set[str] = set()
            with holds:
                for unit in queue:
                    if unit.state in FINAL_STATES:  # canceled while queued
                        done.add(unit.id)
                        continue
                    cores = unit.description.cores
                    scope = self._scopes.get(unit.id)
                    if sched.monotone and (scope in full
                                           or cores >= narrowest.get(scope, cores + 1)):
                        unplaced.append(unit)
                        continue
                    view: Any = self if scope is None else _ScopedView(self, scope)
                    decision = sched.schedule(view, unit.description)
                    if decision is None:
                        unplaced.append(unit)
                        self.backlog_ok = False
                        if sched.in_order and not raise_unplaced \
                                and could_ever_fit(view, cores):
                            break
                        if sched.monotone and cores == 1 and not raise_unplaced:
                            full.add(scope)  # nothing fits at all: that scope waits
                            if scopes is None:  # the scopes of the queue, once per pass
                                scopes = self._queue_scopes(queued)
                            if full >= scopes:  # every unit left waits: stop here (a pass
                                break           # per finished unit must not cost O(queue))
                        narrowest[scope] = min(narrowest.get(scope, cores), cores)
                        continue
                    framework, pilot = decision
                    try:
                        if framework.name not in held:
                            holds.enter_context(framework.holding())
                            held.add(framework.name)
                        framework.submit_unit(unit, pilot)
                    except IncorrectState as err:  # e.g. the pilot ended meanwhile: try again
                        log.info("submitting %s to %s: %s; keeping it queued", unit.id,
                                 framework.name, err)
                        unplaced.append(unit)
                        continue
                    except Exception as err:  # the framework refuses this unit for good
                        log.warning("framework %s refused unit %s: %s", framework.name,
                                    unit.id, err)
                        unit._set_state(State.FAILED, result=UnitResult(
                            error=f"framework {framework.name} refused the unit: {err}"))
                    done.add(unit.id)
            if raise_unplaced and unplaced:
                ids = {u.id for u in unplaced}
                with self._lock:
                    for uid in done | ids:
                        self._dequeue(uid)
                for u in unplaced:
                    u._set_state(State.FAILED)
                widths = sorted({u.description.cores for u in unplaced})
                raise NoSuccess(f"no suitable pilot found to run {len(unplaced)} unit(s) "
                                f"of {', '.join(map(str, widths))} core(s) (scheduler "
                                f"{sched.name!r}, wait=False)")
            with self._lock:
                for uid in done:
                    self._dequeue(uid)
