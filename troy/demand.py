"""``Demand``: what a session's work asks for now, for whoever sizes the resources (an
elastic cluster manager turns it into nodes to hold)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from troy.states import FINAL_STATES, State

if TYPE_CHECKING:
    from troy.descriptions import ComputeUnitDescription
    from troy.session import Session
    from troy.unit import ComputeUnit


@dataclass(frozen=True)
class Demand:
    """Cores and units of a session's work that is not final: ``queued`` (submitted, not
    running yet, wherever it waits: a unit service's queue, a framework's, a pilot's),
    ``running``, and ``waiting`` (units of workloads being executed that are held until the
    tasks they depend on are done). ``max_unit_cores``: the widest unit not yet running
    (queued or waiting; 0 if none): a pilot must be at least that wide for it. ``cores``:
    queued + running, what would keep every unit busy now. ``units_done``: units of the
    session's unit services that ended DONE so far (for progress reports)."""

    queued_cores: int = 0
    running_cores: int = 0
    waiting_cores: int = 0
    max_unit_cores: int = 0
    units_queued: int = 0
    units_running: int = 0
    units_waiting: int = 0
    units_done: int = 0

    @property
    def cores(self) -> int:
        return self.queued_cores + self.running_cores


def session_demand(session: Session) -> Demand:
    """The demand of every unit the session's unit services, frameworks and workload
    managers hold."""
    live: dict[str, ComputeUnit] = {}
    done = 0
    for us in list(session._services):
        for u in us.live_units():
            if u.state not in FINAL_STATES:
                live[u.id] = u
        done += us.units_done
    for fw in list(session.frameworks.values()):
        for u in fw.live_units():   # (one that just ended may be listed a moment longer)
            if u.state not in FINAL_STATES:
                live[u.id] = u
    waiting: dict[str, ComputeUnit] = {}
    for wm in list(session._managers):
        for u in wm.held_units():
            if u.id not in live:
                waiting[u.id] = u
    qc = rc = nq = nr = widest = 0
    for u in live.values():
        c = u.description.cores
        if u.state is State.RUNNING:
            rc, nr = rc + c, nr + 1
        else:
            qc, nq, widest = qc + c, nq + 1, max(widest, c)
    wc = sum(u.description.cores for u in waiting.values())
    widest = max([widest] + [u.description.cores for u in waiting.values()])
    return Demand(qc, rc, wc, widest, nq, nr, len(waiting), done)


def work_to_come(session: Session) -> list[ComputeUnitDescription]:
    """The descriptions of the session's units no framework has yet: queued in its unit
    services, or held by its workload managers until the tasks they depend on are done
    (what a framework's placement counts as the work a wave still has: troy.place)."""
    out = [u.description for us in list(session._services) for u in us.queued_units()
           if u.state is State.PENDING]
    return out + [u.description for wm in list(session._managers) for u in wm.held_units()]
