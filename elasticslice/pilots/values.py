"""Our own resource values, for CloudLab's CLIENT reclaim policy.

Under ``CLIENT`` (PROTOCOL.md) the server reclaims the nodes the client values lowest first
(a node the client gave no value counts 1.0). The pilot manager values each node by what a
reclamation there would cost the work:

* an idle pilot (ready, no unit): nothing is lost, so it goes first: at most
  :data:`IDLE`, lower the longer it has been idle;
* a node still booting (no pilot yet): no unit is lost, only its boot: :data:`BOOTING`;
* a busy pilot: at least :data:`BUSY`, higher with the work in progress on it (the cores
  times the seconds its running units have run, which a reclamation would throw away and
  run again), saturating at 1.0 (:data:`SCALE` core-seconds reach the midpoint).

So a reclamation takes idle nodes, then booting ones, then the busy node that would lose the
least work. :func:`node_values` is pure (the simulation in ``bench/elastic`` uses it as the
manager does); :func:`pilot_work` reads the work in progress from a Troy framework.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from typing import Any

IDLE = 0.1          # the highest value of an idle pilot (just became idle)
IDLE_HALF = 60.0    # seconds of idleness that halve it
BOOTING = 0.25      # a node without a pilot yet
SAFE = 0.4          # a busy pilot whose units all end within a reclaim's countdown
BUSY = 0.5          # the lowest value of a busy pilot that would lose work
SCALE = 3600.0      # core-seconds of work in progress at the midpoint of BUSY..1.0


@dataclasses.dataclass(frozen=True)
class NodeWork:
    """What is on a node now: ``ready`` (a pilot runs there), ``units`` running,
    ``core_seconds`` of work they have done so far (lost if the node goes), ``idle_for``
    seconds with no unit (ready nodes)."""

    ready: bool
    units: int = 0
    core_seconds: float = 0.0
    idle_for: float = 0.0
    at_risk: int | None = None   # units not expected to end within a reclaim's countdown
                                 # (None: not known, all of them)


def node_value(work: NodeWork) -> float:
    """The value of one node, 0..1 (lower: reclaimed sooner)."""
    if work.units > 0:
        risk = work.units if work.at_risk is None else min(work.at_risk, work.units)
        if risk == 0:   # all of it ends within the countdown: nothing is lost
            return SAFE
        w = max(0.0, work.core_seconds)
        return round(BUSY + (1.0 - BUSY) * w / (w + SCALE), 6)
    if not work.ready:
        return BOOTING
    idle = max(0.0, work.idle_for)
    return round(IDLE * IDLE_HALF / (IDLE_HALF + idle), 6)


def node_values(work: Mapping[str, NodeWork]) -> dict[str, float]:
    """``{node: value}`` for every node of ``work``."""
    return {node: node_value(w) for node, w in work.items()}


def reclaim_order(values: Mapping[str, float]) -> list[str]:
    """The nodes in the order CLIENT reclaims them: lowest value first (ties: by name)."""
    return sorted(values, key=lambda n: (values[n], n))


def pilot_work(pilots: Mapping[str, Any], units: Iterable[Any], *,
               now: float | None = None, wait: float | None = None) -> dict[str, NodeWork]:
    """``{node: NodeWork}`` from Troy: ``pilots`` maps each held node (client_id) to its
    live pilot (None: no pilot yet); ``units``: the framework's live units (a running unit
    names its pilot's id in ``unit.pilot`` and its start, epoch seconds, in ``unit.start``);
    ``wait``: a reclamation's countdown (seconds): a unit whose runtime hint says it ends
    within it loses nothing (None, or a unit without a hint: every unit is at risk). The
    work a node would lose counts its units at risk only, as run until the countdown ends."""
    now = time.time() if now is None else now
    by_pilot: dict[str, list[Any]] = {}
    for unit in units:
        pid = getattr(unit, "pilot", None)
        if pid is not None and getattr(unit, "start", None) is not None:
            by_pilot.setdefault(pid, []).append(unit)
    end = now + (wait or 0.0)

    def at_risk(unit: Any) -> bool:
        runtime = getattr(unit.description, "runtime", None)
        return wait is None or not runtime or unit.start + float(runtime) > end

    out: dict[str, NodeWork] = {}
    for node, pilot in pilots.items():
        if pilot is None:
            out[node] = NodeWork(ready=False)
            continue
        running = by_pilot.get(pilot.id, [])
        risky = [u for u in running if at_risk(u)]
        lost = sum(max(1, int(getattr(u.description, "cores", 1) or 1)) * max(0.0, end - u.start)
                   for u in risky)
        busy = bool(running) or bool(getattr(pilot, "busy", False))
        since = getattr(pilot, "idle_since", None)
        count = len(running) if running else int(busy)
        out[node] = NodeWork(ready=True, units=count, core_seconds=lost,
                             at_risk=len(risky) if running else None,
                             idle_for=0.0 if busy or since is None else max(0.0, now - since))
    return out


def changed(old: Mapping[str, float], new: Mapping[str, float], *,
            tolerance: float = 0.02) -> bool:
    """Whether ``new`` is worth sending over ``old``: other nodes, another reclaim order,
    or a value that moved more than ``tolerance``."""
    if set(old) != set(new) or reclaim_order(old) != reclaim_order(new):
        return True
    return any(abs(old[n] - new[n]) > tolerance for n in new)
