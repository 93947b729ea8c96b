"""The scaling decision: a pure function of what the manager observed.

:func:`decide` reads an :class:`Observed` snapshot (nodes held and their states, availability
per CM and hardware type, demand, the time of the last add and delete, work in flight) and a
:class:`PolicyConfig`, and answers a :class:`Decision`: how many nodes to add at which CM, or
which nodes to give back. It does no I/O and reads no clock (time is ``Observed.now``), so it
is tested on its own and a virtual-clock simulation (:mod:`elasticslice.managers.policysim`)
can drive it through hours of load in milliseconds.

The rules (the seed's defaults, plus hysteresis and rate limits so it never flaps):

* ``count`` = nodes held that are not failed, not pending delete, not being deleted and not
  without their agent (below), plus the nodes of an AddNodes in flight. ``wanted`` =
  ``maxthreshold`` when demand is unknown (grow while CloudLab has room, like the seed), else
  demand clamped to the thresholds. Demand is stated in nodes (``Observed.demand``) or in
  cores (``demand_cores`` plus ``lookahead`` x ``waiting_cores``, over ``cores_per_node``:
  :func:`wanted_nodes`).
* Add while ``count < wanted`` at each CM (``cmlist`` order, else the availability's order)
  whose available fraction stays at least ``percent_available_minimum`` after the add; below
  ``minthreshold`` add even when nodes are scarce (as long as some are free). At most
  ``max_add_per_cycle``, never more than available, not within ``add_cooldown`` of the last add
  nor within ``delete_cooldown`` of the last delete (unless below ``minthreshold``).
  A CM whose last AddNodes failed (``Observed.paused``: BUSY, down) is left out until its
  own retry: the others grow instead.
* Delete only with ``enable_delete``: at a CM whose fraction fell below
  ``percent_available_minimum - hysteresis``, when demand (or ``maxthreshold``) is below the
  count, never below ``minthreshold``. Victims: lowest value first (CloudLab's
  SetResourceValues), else newest; never initial, pending-delete, in-flight or busy nodes; with
  ``idle_timeout`` a surplus is taken only from nodes idle that long. At most
  ``max_delete_per_cycle``, not within ``delete_cooldown`` of the last delete nor within
  ``add_cooldown`` of the last add.
* Never both in one decision, and no add anywhere while a CM is scarce enough to give back.
* Replacements (``Decision.replace``, with either): added nodes that failed to boot, and,
  with ``agent_grace`` / ``agent_timeout``, nodes whose agent died (gone ``agent_grace``
  seconds) or never joined (a ready node, ``agent_timeout``); never the last node of a CM.
  They do not count, so what replaces them is added meanwhile.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

ALL_TYPES = "*"
_EPS = 1e-9


class NodeState(str, Enum):
    """A node's state, normalised from the CM's SliverStatus per-node ``status``."""

    NOTREADY = "notready"
    CHANGING = "changing"
    READY = "ready"
    FAILED = "failed"

    @classmethod
    def from_cm(cls, status: str | None) -> NodeState:
        """Map a CM status string (any case); unknown or empty strings are NOTREADY."""
        return _FROM_CM.get((status or "").strip().lower(), cls.NOTREADY)


_FROM_CM: dict[str, NodeState] = {
    "ready": NodeState.READY,
    "notready": NodeState.NOTREADY,
    "unknown": NodeState.NOTREADY,
    "stopped": NodeState.NOTREADY,
    "changing": NodeState.CHANGING,
    "mixed": NodeState.CHANGING,
    "configuring": NodeState.CHANGING,
    "booting": NodeState.CHANGING,
    "failed": NodeState.FAILED,
    "error": NodeState.FAILED,
}


@dataclass(frozen=True)
class NodeView:
    """One node of the slice as the policy sees it."""

    client_id: str
    cm: str
    state: NodeState
    added_at: float
    node_id: str | None = None
    initial: bool = False          # part of the sliver as created: never given back by the policy
    value: float | None = None     # CloudLab's SetResourceValues value 0..1 (lower = reclaimed sooner)
    pending_delete: bool = False   # a NotifyDeletePending is open for it
    busy: bool | None = None       # from the hosted system (Troy); None = unknown
    idle_since: float | None = None
    agentless_since: float | None = None  # held without a live agent since (None: has one)
    had_agent: bool = False        # an agent ran there once (else it never joined)
    startup_failed: bool = False   # its startup command exited non-zero (state FAILED)


@dataclass(frozen=True)
class Availability:
    """Free and total nodes of one hardware type (or ``"*"``: all types) at one CM."""

    available: int
    total: int

    @property
    def fraction(self) -> float:
        return self.available / self.total if self.total > 0 else 0.0


@dataclass(frozen=True)
class Observed:
    """Everything :func:`decide` may look at. ``adding`` counts the nodes of an AddNodes in
    flight (an open intent) that are not yet in ``nodes``."""

    now: float
    nodes: tuple[NodeView, ...]
    availability: Mapping[str, Mapping[str, Availability]]  # cm -> hardware type -> counts
    demand: int | None = None      # total nodes the work wants; None = no opinion (grow to max)
    last_add: float | None = None
    last_delete: float | None = None
    adding: int = 0
    deleting: frozenset[str] = frozenset()  # client_ids to give back, or in a DeleteNodes
    demand_cores: int | None = None  # cores the work wants now (None: no opinion in cores)
    waiting_cores: int = 0           # cores of work not released yet (``lookahead`` counts)
    cores_per_node: int | None = None  # None: no node told its size yet
    extra_nodes: float = 0.0         # nodes asked besides the cores (Dask's adaptive target)
    failed_in_a_row: int = 0          # added nodes that failed to start, one after another
    last_failed_at: float | None = None
    paused: frozenset[str] = frozenset()  # CMs whose last AddNodes failed: none added there


@dataclass(frozen=True)
class PolicyConfig:
    """The knobs of :func:`decide` (seed defaults for the first five)."""

    minthreshold: int = 1
    maxthreshold: int = 10
    percent_available_minimum: float = 0.5
    enable_delete: bool = False
    nodetype: str | None = None
    cmlist: tuple[str, ...] = ()
    max_add_per_cycle: int = 10
    add_cooldown: float = 60.0
    delete_cooldown: float = 300.0
    max_delete_per_cycle: int = 1
    hysteresis: float = 0.1
    idle_timeout: float | None = None
    lookahead: float = 0.0               # share of ``waiting_cores`` that counts as demand
    agent_grace: float | None = None     # a held node's agent gone this long: replaced
    agent_timeout: float | None = None   # a ready node no agent joined this long: replaced
    failures_before_backoff: int = 3     # nodes failing to start in a row before adds pause
    failure_backoff: float = 60.0        # the first pause (s); doubles with each failure more
    failure_backoff_max: float = 900.0


@dataclass(frozen=True)
class Decision:
    """What to do this cycle: ``add`` (cm -> count) or ``delete`` (cm -> client_ids), never
    both, and why."""

    add: Mapping[str, int] = field(default_factory=dict)
    delete: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    replace: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.add and not self.delete and not self.replace

    def give_back(self, cm: str) -> list[str]:
        """What DeleteNodes takes at ``cm``: the victims, then the replaced nodes."""
        return [*self.delete.get(cm, ()), *self.replace.get(cm, ())]

    @property
    def add_total(self) -> int:
        return sum(self.add.values())

    @property
    def delete_total(self) -> int:
        return sum(len(ids) for ids in self.delete.values())


def agentless(node: NodeView, observed: Observed, config: PolicyConfig) -> bool:
    """A held node whose agent died (gone ``agent_grace``) or never joined (``agent_timeout``),
    and that CloudLab is not taking anyway."""
    limit = config.agent_grace if node.had_agent else config.agent_timeout
    return limit is not None and node.agentless_since is not None \
        and not node.pending_delete and node.client_id not in observed.deleting \
        and observed.now - node.agentless_since >= limit


_HELD: tuple[Any, list[NodeView], bool] = (None, [], False)   # the last tuple _held read


def _held(nodes: Iterable[NodeView]) -> tuple[list[NodeView], bool]:
    """The nodes neither failed nor pending delete, and whether one may be agentless. A
    manager passes the same tuple until its state changes, and decides twice a cycle: the
    last tuple's answer is kept (its views are frozen; a list could change: not kept)."""
    global _HELD
    if _HELD[0] is nodes:
        return _HELD[1], _HELD[2]
    held = [n for n in nodes if n.state is not NodeState.FAILED and not n.pending_delete]
    maybe = any(n.agentless_since is not None for n in held)
    if isinstance(nodes, tuple):
        _HELD = (nodes, held, maybe)
    return held, maybe


def counted(observed: Observed, config: PolicyConfig | None = None) -> list[NodeView]:
    """The nodes that count towards the thresholds."""
    (held, maybe), deleting = _held(observed.nodes), observed.deleting
    if not deleting and not (maybe and config is not None):
        return list(held)
    return [n for n in held   # (a node with its agent is never agentless: no call)
            if n.client_id not in deleting
            and (n.agentless_since is None or config is None
                 or not agentless(n, observed, config))]


def node_count(observed: Observed, config: PolicyConfig | None = None) -> int:
    return len(counted(observed, config)) + max(observed.adding, 0)


def wanted_nodes(config: PolicyConfig, *, nodes: int | None = None, cores: int | None = None,
                 waiting_cores: int = 0, cores_per_node: int | None = None,
                 extra_nodes: float = 0.0) -> int | None:
    """Nodes the work wants before the thresholds: ``nodes`` when stated, else the cores it
    wants now plus ``lookahead`` of those waiting, in nodes of ``cores_per_node``, plus
    ``extra_nodes`` asked in nodes (rounded up; summed here, never turned into cores). With
    no node's size known yet, cores ask for ``minthreshold`` (the first node will tell), or
    for the nodes asked if more. None: no opinion."""
    if nodes is not None:
        return nodes
    extra = math.ceil(extra_nodes) if extra_nodes > 0 else 0
    if cores is None:
        return extra or None
    total = max(cores, 0) + math.ceil(config.lookahead * max(waiting_cores, 0))
    if total <= 0:
        return extra
    if not cores_per_node:
        return max(config.minthreshold, extra)
    return math.ceil(total / cores_per_node) + extra


def observed_wanted(observed: Observed, config: PolicyConfig) -> int | None:
    return wanted_nodes(config, nodes=observed.demand, cores=observed.demand_cores,
                        waiting_cores=observed.waiting_cores,
                        cores_per_node=observed.cores_per_node,
                        extra_nodes=observed.extra_nodes)


def wanted_count(observed: Observed, config: PolicyConfig) -> int:
    wanted = observed_wanted(observed, config)
    if wanted is None:
        return config.maxthreshold
    return max(config.minthreshold, min(config.maxthreshold, wanted))


def availability_for(observed: Observed, cm: str, nodetype: str | None) -> Availability | None:
    """The CM's counts for ``nodetype``, else for all types ("*"), else None (unknown)."""
    per_type = observed.availability.get(cm)
    if not per_type:
        return None
    if nodetype and nodetype in per_type:
        return per_type[nodetype]
    return per_type.get(ALL_TYPES)


def cm_order(observed: Observed, config: PolicyConfig) -> list[str]:
    if config.cmlist:
        return list(config.cmlist)
    return list(observed.availability)


def decide(observed: Observed, config: PolicyConfig) -> Decision:
    """The decision for this snapshot; see the module docstring for the rules."""
    count = node_count(observed, config)
    wanted = wanted_count(observed, config)
    head = f"count {count}, wanted {wanted}"
    delete: dict[str, tuple[str, ...]] = {}
    reasons: list[str] = []
    blocking = False
    if config.enable_delete:
        delete, reasons, blocking = _deletes(observed, config, count, wanted)
    replace, replace_reasons = _replacements(observed, config, delete)
    if delete or blocking:
        hold = [] if delete else ["no add while a delete is wanted"]
        return Decision(delete=delete, replace=replace,
                        reasons=(head, *reasons, *replace_reasons, *hold))
    add, add_reasons = _adds(observed, config, count, wanted)
    return Decision(add=add, replace=replace,
                    reasons=(head, *reasons, *replace_reasons, *add_reasons))


def _replacements(observed: Observed, config: PolicyConfig,
                  delete: Mapping[str, tuple[str, ...]]
                  ) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """Added nodes that failed to boot, nodes whose startup command failed (of the sliver as
    created too: they run nothing of the experiment) and nodes without their agent, given
    back whatever the rest of the decision is; never the last node held at a CM (CloudLab
    refuses)."""
    out: dict[str, tuple[str, ...]] = {}
    reasons: list[str] = []
    replaced: dict[str, tuple[list[str], list[str]]] = {}   # cm -> (failed, agentless)
    failed_state, deleting = NodeState.FAILED, observed.deleting
    for n in observed.nodes:   # one pass; most nodes are neither
        if n.state is failed_state and (not n.initial or n.startup_failed) \
                and not n.pending_delete and n.client_id not in deleting:
            replaced.setdefault(n.cm, ([], []))[0].append(n.client_id)
        if n.agentless_since is not None and agentless(n, observed, config):
            replaced.setdefault(n.cm, ([], []))[1].append(n.client_id)
    if not replaced:
        return out, reasons
    held = Counter(n.cm for n in observed.nodes)   # (counted only when some are replaced)
    for cm in (c for c in held if c in replaced):   # (the CMs in the nodes' order)
        failed, dead = replaced[cm]
        taken = set(delete.get(cm, ()))
        picks = list(dict.fromkeys(c for c in failed + dead if c not in taken))
        room = max(0, held[cm] - len(taken) - 1)
        if picks[:room]:
            out[cm] = tuple(picks[:room])
            reasons.append(f"{cm}: replace {', '.join(out[cm])} (failed or no agent)")
    return out, reasons


def failure_pause(observed: Observed, config: PolicyConfig) -> float:
    """Seconds adds still wait because nodes keep failing to start: after
    ``failures_before_backoff`` in a row, ``failure_backoff`` from the last failure, twice as
    long with each failure more, at most ``failure_backoff_max`` (0: no pause)."""
    extra = observed.failed_in_a_row - config.failures_before_backoff
    if config.failures_before_backoff <= 0 or extra < 0 or observed.last_failed_at is None:
        return 0.0
    wait = min(config.failure_backoff * 2 ** min(extra, 30), config.failure_backoff_max)
    return max(0.0, observed.last_failed_at + wait - observed.now)


def _since(now: float, then: float | None) -> float:
    return math.inf if then is None else now - then


def _adds(observed: Observed, config: PolicyConfig, count: int,
          wanted: int) -> tuple[dict[str, int], list[str]]:
    if count >= wanted:
        return {}, ["nothing to add: at the wanted count"]
    below_min = count < config.minthreshold
    now = observed.now
    pause = failure_pause(observed, config)
    if pause > 0:  # more nodes would fail as the last ones did: each costs a boot
        return {}, [f"{observed.failed_in_a_row} added nodes in a row failed to start: no "
                    f"add for {pause:.0f}s more (the log and the run name their causes)"]
    if not below_min:
        if _since(now, observed.last_add) < config.add_cooldown:
            return {}, [f"add cooldown: last add {now - observed.last_add:.0f}s ago "
                        f"(< {config.add_cooldown:g}s)"]
        if _since(now, observed.last_delete) < config.delete_cooldown:
            return {}, [f"no add within {config.delete_cooldown:g}s of the last delete"]
    budget = min(wanted - count, max(config.max_add_per_cycle, 0))
    if below_min:  # reaching the minimum is not rate-limited by max_add_per_cycle
        budget = max(budget, config.minthreshold - count)
    add: dict[str, int] = {}
    reasons: list[str] = []
    held = count
    for cm in cm_order(observed, config):
        if budget <= 0:
            break
        if cm in observed.paused:
            reasons.append(f"{cm}: its last AddNodes failed; none added there until its retry")
            continue
        avail = availability_for(observed, cm, config.nodetype)
        if avail is None or avail.total <= 0 or avail.available <= 0:
            reasons.append(f"{cm}: no free nodes known")
            continue
        # Keep the fraction after the add at or above the minimum, so that our own add never
        # makes the CM look scarce (and never triggers a give-back by itself).
        room = math.floor(avail.available - config.percent_available_minimum * avail.total + _EPS)
        room = max(room, 0)
        if held < config.minthreshold:
            room = max(room, config.minthreshold - held)
        n = min(budget, room, avail.available)
        if n <= 0:
            reasons.append(f"{cm}: available {avail.available}/{avail.total} "
                           f"({avail.fraction:.2f}) below {config.percent_available_minimum:g}")
            continue
        add[cm] = n
        budget -= n
        held += n
        reasons.append(f"{cm}: add {n} (available {avail.available}/{avail.total})")
    return add, reasons


def victim_order(nodes: Iterable[NodeView]) -> list[NodeView]:
    """Lowest value first (nodes without a value after those with one), then newest."""
    return sorted(nodes, key=lambda n: (n.value is None, n.value if n.value is not None else 0.0,
                                        -n.added_at, n.client_id))


def _deletable(observed: Observed, config: PolicyConfig) -> list[NodeView]:
    return [n for n in counted(observed, config) if not n.initial and n.busy is not True]


def _idle(node: NodeView, observed: Observed, config: PolicyConfig) -> bool:
    if config.idle_timeout is None:
        return True
    return node.idle_since is not None and observed.now - node.idle_since >= config.idle_timeout


def _deletes(observed: Observed, config: PolicyConfig, count: int, wanted: int
             ) -> tuple[dict[str, tuple[str, ...]], list[str], bool]:
    """(delete, reasons, blocking): ``blocking`` is True when some rule wants to give back a
    node it could give back (whether or not the rate limits allow it now); that holds back
    any add, so the slice never grows at one CM while shrinking at another."""
    low = config.percent_available_minimum - config.hysteresis
    candidates = _deletable(observed, config)
    # (why, eligible nodes, at most how many for this reason)
    wants: list[tuple[str, list[NodeView], int]] = []
    if count > config.minthreshold:
        for cm in cm_order(observed, config):
            avail = availability_for(observed, cm, config.nodetype)
            if avail is None or avail.total <= 0 or avail.fraction >= low - _EPS:
                continue
            wants.append((f"{cm}: available fraction {avail.fraction:.2f} below {low:.2f}",
                          [n for n in candidates if n.cm == cm], count - config.minthreshold))
    surplus = count - wanted
    if surplus > 0:
        why = "demand" if observed.demand is not None else "maxthreshold"
        wants.append((f"{surplus} above {why}",
                      [n for n in candidates if _idle(n, observed, config)], surplus))
    reasons = [why for why, _, _ in wants]
    blocking = config.max_delete_per_cycle > 0 and any(pool for _, pool, _ in wants)
    if not blocking:
        if wants:
            reasons.append("no node may be given back (initial, busy or not idle)")
        return {}, reasons, False
    now = observed.now
    if _since(now, observed.last_delete) < config.delete_cooldown:
        return {}, reasons + [f"delete cooldown: last delete {now - observed.last_delete:.0f}s "
                              f"ago (< {config.delete_cooldown:g}s)"], True
    if _since(now, observed.last_add) < config.add_cooldown:
        return {}, reasons + [f"no delete within {config.add_cooldown:g}s of the last add"], True
    limit = min(config.max_delete_per_cycle, count - config.minthreshold)
    chosen: list[NodeView] = []
    for _, pool, cap in wants:
        need = min(limit, cap) - len(chosen)  # each reason caps the total given back
        taken = {n.client_id for n in chosen}
        chosen.extend(victim_order(n for n in pool if n.client_id not in taken)[:max(need, 0)])
    delete: dict[str, tuple[str, ...]] = {}
    for node in chosen:
        delete[node.cm] = (*delete.get(node.cm, ()), node.client_id)
    return delete, reasons + [f"give back {', '.join(n.client_id for n in chosen)}"], True
