"""A virtual-clock simulation of :func:`~elasticslice.managers.policy.decide`.

No CM, no threads, no sleeping: each step builds an :class:`Observed` from the simulated CMs
(total nodes, other tenants' load as a function of time, our own nodes), asks ``decide`` and
applies the decision at once. Tests use it to check that the policy never flaps; the
benchmark uses it to time decisions over long runs. Pure: nothing here does I/O.

>>> from elasticslice.managers.policy import PolicyConfig
>>> run = simulate(PolicyConfig(maxthreshold=4), {"cm": 20}, duration=600)
>>> run[-1].count
4
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from elasticslice.managers.policy import (
    ALL_TYPES, Availability, Decision, NodeState, NodeView, Observed, PolicyConfig, decide,
)

Load = Callable[[float], Mapping[str, int]]


@dataclass(frozen=True)
class SimStep:
    """One decision of a run: when, what, and the slice's node count after applying it."""

    now: float
    decision: Decision
    count: int
    availability: Mapping[str, Availability]   # cm -> counts ("*") the decision saw


def _no_load(_now: float) -> Mapping[str, int]:
    return {}


def _no_demand(_now: float) -> int | None:
    return None


def simulate(config: PolicyConfig, totals: Mapping[str, int], *,
             other_load: Load = _no_load,
             demand: Callable[[float], int | None] = _no_demand,
             initial: Mapping[str, int] | None = None,
             step: float = 60.0, duration: float = 3600.0, start: float = 0.0,
             boot_delay: float = 0.0) -> list[SimStep]:
    """Run ``decide`` every ``step`` virtual seconds for ``duration``.

    ``totals``: cm -> nodes the CM has; ``other_load(now)``: cm -> nodes other tenants hold;
    ``demand(now)``: what the work wants; ``initial``: cm -> nodes of the sliver as created;
    nodes added turn ready after ``boot_delay``.
    """
    nodes: dict[str, NodeView] = {}
    serial = 0
    for cm, n in (initial or {}).items():
        for _ in range(n):
            serial += 1
            nodes[f"node{serial}"] = NodeView(f"node{serial}", cm, NodeState.READY, start,
                                              initial=True)
    last_add: float | None = None
    last_delete: float | None = None
    steps: list[SimStep] = []
    now = start
    while now <= start + duration:
        load = other_load(now)
        availability: dict[str, Availability] = {}
        for cm, total in totals.items():
            ours = sum(1 for n in nodes.values() if n.cm == cm)
            free = max(total - load.get(cm, 0) - ours, 0)
            availability[cm] = Availability(free, total)
        views = tuple(
            n if n.state is NodeState.READY or now - n.added_at < boot_delay
            else NodeView(n.client_id, n.cm, NodeState.READY, n.added_at, initial=n.initial)
            for n in nodes.values())
        nodes = {n.client_id: n for n in views}
        observed = Observed(now=now, nodes=views,
                            availability={cm: {ALL_TYPES: a} for cm, a in availability.items()},
                            demand=demand(now), last_add=last_add, last_delete=last_delete)
        decision = decide(observed, config)
        for cm, count in decision.add.items():
            for _ in range(count):
                serial += 1
                state = NodeState.READY if boot_delay <= 0 else NodeState.NOTREADY
                nodes[f"node{serial}"] = NodeView(f"node{serial}", cm, state, now)
            last_add = now
        for ids in decision.delete.values():
            for client_id in ids:
                nodes.pop(client_id, None)
            last_delete = now
        steps.append(SimStep(now, decision, len(nodes), availability))
        now += step
    return steps


def directions(steps: list[SimStep]) -> list[tuple[float, str]]:
    """The non-empty decisions of a run as (time, "add" | "delete")."""
    return [(s.now, "add" if s.decision.add else "delete") for s in steps if not s.decision.empty]


def reversals(steps: list[SimStep]) -> list[tuple[float, float]]:
    """Each change of direction as (time of the previous decision, time of the opposite one)."""
    seq = directions(steps)
    return [(a[0], b[0]) for a, b in zip(seq, seq[1:]) if a[1] != b[1]]
