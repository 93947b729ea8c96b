"""A virtual-clock simulation of one campaign on one CM: no sleeping, no threads.

The CM has ``total_nodes`` nodes of ``cores_per_node`` cores. Other tenants hold some (a
:class:`~elastic.tenants.Pattern` says how many they want); the rest are free. The scaling
policy under test asks for nodes (at most what is free; each boots for ``boot_delay``) and
gives nodes back. When tenants want more than the free nodes, the emulator's reclaimer takes
the shortfall from our slice, newest nodes first (LIFO; under CLIENT, the nodes the policy's
values put lowest: :mod:`elasticslice.pilots.values`), each with a countdown of ``max_wait``
seconds; at the deadline the node goes, and the units running on it are lost (re-run).
A policy that ``drains`` (ours: the manager's deadline-aware drain) starts nothing on a
node under notice that would not finish before the deadline, and hands the node back as
soon as it is empty. Units (WfFormat tasks) run on ready nodes in the policy's ``order``
(:mod:`troy.order`, the function Troy's unit service orders its queue with: ours, as Troy
does, the longest runtime first; the baselines, as Parsl's and Dask's queues do, first come
first served), placed as the policy's ``placement`` says: ours by expected end
(:func:`troy.place.choose`, as Troy's ``local`` framework places them: units that end
together share nodes, and the long ones take only the nodes they need to end with the rest
of the work known), the baselines best fit (the fullest node that has room).

Time moves from event to event: unit ends, and ticks every ``tick`` seconds (tenant load,
countdowns, node readiness, the policy's decisions at its own interval).
"""
from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field
from typing import Protocol

from elasticslice.pilots.values import NodeWork, node_values
from troy.order import ordered
from troy.place import Budget, Slot, choose, long_budget

from .tenants import Pattern
from .workload import SimTask, lower_bound


@dataclass(frozen=True)
class SimConfig:
    total_nodes: int = 200
    cores_per_node: int = 8
    max_nodes: int = 20            # every policy's cap (maxthreshold, max_blocks, maximum)
    boot_delay: float = 300.0      # AddNodes to a ready node
    max_wait: float = 300.0        # the reclaim countdown
    tick: float = 10.0
    horizon: float = 7 * 86400.0   # give up (a policy that never gets nodes)


@dataclass
class SimNode:
    uid: str
    added_at: float
    ready_at: float
    cores: int
    initial: bool = False
    used: int = 0
    running: dict[str, float] = field(default_factory=dict)  # task uid -> start
    deadline: float | None = None    # under a reclaim notice until then
    idle_since: float | None = None  # ready and empty since

    def ready(self, now: float) -> bool:
        return self.ready_at <= now


@dataclass(frozen=True)
class View:
    """What a policy sees when it decides."""

    now: float
    nodes: tuple[SimNode, ...]
    free: int                  # free nodes at the CM
    total: int
    cores_per_node: int
    max_nodes: int
    queued_cores: int          # units ready to run, waiting for cores
    queued_units: int
    queued_work: float         # their core-seconds
    running_cores: int
    running_units: int


@dataclass(frozen=True)
class Action:
    add: int = 0
    delete: tuple[str, ...] = ()


class Policy(Protocol):
    name: str
    interval: float      # seconds between decisions
    drains: bool         # honours reclaim notices (starts nothing that would be cut)
    order: str           # the order ready units are placed in (troy.order.ORDERS)
    placement: str       # "best_fit" (the fullest node with room) or "by_end" (troy.place)

    def initial_nodes(self, config: SimConfig) -> int: ...

    def decide(self, view: View) -> Action: ...


@dataclass(frozen=True)
class Sample:
    t: float
    held: int
    ready: int
    running_units: int
    tenants: int


@dataclass
class Result:
    policy: str
    pattern: str
    makespan: float = 0.0
    lower_bound: float = 0.0
    node_hours: float = 0.0
    idle_node_hours: float = 0.0
    revocations: int = 0
    units_lost: int = 0
    lost_core_hours: float = 0.0
    adds: int = 0
    gives_back: int = 0
    refused_deletes: int = 0     # DeleteNodes of the slice's last node (CloudLab refuses)
    cut_floor: int = 0           # the fewest units the reclaims' victims could have cut
    finished: bool = False
    samples: list[Sample] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound if self.lower_bound else float("inf")


class Pending:
    """The tasks arrived and not running (queued, or waiting for their parents): their
    core-seconds, those of the long ones (runtime over ``horizon``) and the longest."""

    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self.uids: set[str] = set()
        self.work = self.long_work = 0.0
        self._longest: list[tuple[float, str]] = []   # a heap; uids gone are skipped

    def add(self, task: SimTask) -> None:
        if task.uid not in self.uids:
            self.uids.add(task.uid)
            self._count(task, 1)
            heapq.heappush(self._longest, (-task.runtime, task.uid))

    def discard(self, task: SimTask) -> None:
        if task.uid in self.uids:
            self.uids.remove(task.uid)
            self._count(task, -1)

    def _count(self, task: SimTask, sign: int) -> None:
        self.work += sign * task.cores * task.runtime
        if task.runtime > self.horizon:
            self.long_work += sign * task.cores * task.runtime

    def longest(self) -> float:
        while self._longest and self._longest[0][1] not in self.uids:
            heapq.heappop(self._longest)
        return -self._longest[0][0] if self._longest else 0.0


class Simulation:
    def __init__(self, config: SimConfig, tasks: list[SimTask], pattern: Pattern,
                 policy: Policy) -> None:
        self.cfg, self.pattern, self.policy = config, pattern, policy
        self.tasks = {t.uid: t for t in tasks}
        self.missing = {t.uid: sum(1 for p in t.parents if p in self.tasks) for t in tasks}
        self.children: dict[str, list[str]] = {}
        for t in tasks:
            for p in t.parents:
                self.children.setdefault(p, []).append(t.uid)
        self.arrivals = sorted((t.arrival, t.uid) for t in tasks if self.missing[t.uid] == 0)
        self.waves = sorted(((t.arrival, t.uid) for t in tasks), reverse=True)  # all, last first
        self.pending = Pending(config.max_wait)   # arrived, not running: queued or waiting
        self.queue: list[str] = []
        self.nodes: dict[str, SimNode] = {}
        self.ends: list[tuple[float, int, str, str]] = []   # (end, attempt, task, node)
        self.attempt: dict[str, int] = {}
        self.tenants = 0
        self.done = 0
        self.serial = 0
        self.now = 0.0
        peak = config.max_nodes * config.cores_per_node
        self.result = Result(policy.name, pattern.name, lower_bound=lower_bound(tasks, peak))

    # -- the pool -------------------------------------------------------------------
    def free_nodes(self) -> int:
        return max(0, self.cfg.total_nodes - self.tenants - len(self.nodes))

    def _add(self, count: int, *, initial: bool = False) -> None:
        count = min(count, self.free_nodes())
        for _ in range(max(count, 0)):
            self.serial += 1
            ready_at = self.now if initial else self.now + self.cfg.boot_delay
            self.nodes[f"n{self.serial}"] = SimNode(f"n{self.serial}", self.now, ready_at,
                                                    self.cfg.cores_per_node, initial=initial)
        self.result.adds += max(count, 0) if not initial else 0

    def _remove(self, uid: str) -> None:
        node = self.nodes.pop(uid)
        for task_uid, start in node.running.items():  # cut: the unit runs again elsewhere
            self.attempt[task_uid] = self.attempt.get(task_uid, 0) + 1
            self.result.units_lost += 1
            self.result.lost_core_hours += self.tasks[task_uid].cores * (self.now - start) / 3600
            self.queue.insert(0, task_uid)
            self.pending.add(self.tasks[task_uid])

    def _tenants(self) -> None:
        target = self.pattern.target(self.now, len(self.nodes))
        if target < self.tenants:
            self.tenants = target
        notice = sum(1 for n in self.nodes.values() if n.deadline is not None)
        need = target - self.tenants - notice
        if need <= 0:
            return
        take = min(need, self.free_nodes())
        self.tenants += take
        need -= take
        candidates = [n for n in self.nodes.values() if n.deadline is None]
        if getattr(self.policy, "reclaim_policy", "LIFO") == "CLIENT":
            values = self.client_values(candidates)
            victims = sorted(candidates, key=lambda n: (values[n.uid], -n.added_at, n.uid))
        else:
            victims = sorted(candidates, key=lambda n: (-n.added_at, n.uid))
        victims = victims[:need]
        if victims:   # the fewest units any choice of victims would cut at their deadline
            risk = sorted(self._at_risk(n) for n in candidates)
            self.result.cut_floor += sum(risk[:len(victims)])
        for node in victims:
            node.deadline = self.now + self.cfg.max_wait
            self.result.revocations += 1

    def _at_risk(self, node: SimNode) -> int:
        """Units on ``node`` that a notice now would cut (not done by its deadline)."""
        deadline = self.now + self.cfg.max_wait
        return sum(1 for u, start in node.running.items()
                   if start + self.tasks[u].runtime > deadline)

    def client_values(self, nodes: list[SimNode]) -> dict[str, float]:
        """The values the pilot manager would send for ``nodes`` now (CLIENT policy)."""
        deadline = self.now + self.cfg.max_wait
        def lost(n: SimNode) -> list[tuple[str, float]]:   # the units cut at the deadline
            return [(u, start) for u, start in n.running.items()
                    if start + self.tasks[u].runtime > deadline]
        work = {n.uid: NodeWork(
            ready=n.ready(self.now), units=len(n.running), at_risk=len(lost(n)),
            core_seconds=sum(self.tasks[u].cores * (deadline - start) for u, start in lost(n)),
            idle_for=0.0 if n.running or n.idle_since is None else self.now - n.idle_since)
            for n in nodes}
        return node_values(work)

    def _countdowns(self) -> None:
        for node in list(self.nodes.values()):
            if node.deadline is None:
                continue
            if self.now >= node.deadline or (self.policy.drains and not node.running):
                self._remove(node.uid)
                self.tenants += 1   # the tenant that wanted it gets it

    # -- the units ------------------------------------------------------------------
    def _arrive(self) -> None:
        while self.arrivals and self.arrivals[0][0] <= self.now:
            self.queue.append(self.arrivals.pop(0)[1])
        while self.waves and self.waves[-1][0] <= self.now:
            self.pending.add(self.tasks[self.waves.pop()[1]])

    def _finish(self, end: float, attempt: int, task_uid: str, node_uid: str) -> None:
        if self.attempt.get(task_uid, 0) != attempt:
            return   # that attempt was cut
        node = self.nodes[node_uid]
        node.running.pop(task_uid)
        node.used -= self.tasks[task_uid].cores
        if not node.running:
            node.idle_since = end
        self.done += 1
        self.result.makespan = max(self.result.makespan, end)
        for child in self.children.get(task_uid, ()):
            self.missing[child] -= 1
            if self.missing[child] == 0:
                self.queue.append(child)

    def _place(self) -> None:
        ready = [n for n in self.nodes.values() if n.ready(self.now)]
        for n in ready:
            if n.idle_since is None and not n.running:
                n.idle_since = self.now
        free = sum(n.cores - n.used for n in ready)
        if free <= 0 or not self.queue:
            return
        ready.sort(key=lambda n: n.uid)   # best fit's ties: by name
        slots = {n.uid: self._slot(n) for n in ready}
        by_end = self.policy.placement == "by_end"
        budget = functools.cache(self._long_budget) if by_end else None
        keep: list[str] = []
        queue = ordered(self.queue, lambda u: self.tasks[u].runtime, self.policy.order)
        for i, uid in enumerate(queue):
            if free <= 0:
                keep += queue[i:]
                break
            task = self.tasks[uid]
            cores = min(task.cores, self.cfg.cores_per_node)
            fits = [slots[n.uid] for n in ready if self._may_start(n, task)]
            slot = choose(fits, cores, self.now + task.runtime if by_end else None,
                          now=self.now, horizon=self.cfg.max_wait, budget=budget)
            if slot is None:
                keep.append(uid)
                continue
            node = self.nodes[slot.key]
            self.pending.discard(task)
            node.used += cores
            node.running[uid] = self.now
            node.idle_since = None
            end = self.now + task.runtime
            slots[node.uid] = Slot(node.uid, node.cores, node.cores - node.used,
                                   end if slot.end is None else max(slot.end, end))
            free -= cores
            attempt = self.attempt.get(uid, 0)
            heapq.heappush(self.ends, (end, attempt, uid, node.uid))
        self.queue = keep

    def _slot(self, node: SimNode) -> Slot[str]:
        ends = [start + self.tasks[u].runtime for u, start in node.running.items()]
        return Slot(node.uid, node.cores, node.cores - node.used, max(ends, default=None))

    def _long_budget(self) -> Budget:
        """The cores the long units (not ending within a countdown) need to end with the
        rest of the work known now: running, queued, and waiting for their parents in the
        workflows that have arrived (as Troy's workload manager holds them)."""
        horizon = self.now + self.cfg.max_wait
        left = [(self.tasks[u].cores, start + self.tasks[u].runtime - self.now)
                for n in self.nodes.values() for u, start in n.running.items()]
        cores = sum(n.cores for n in self.nodes.values()
                    if n.ready(self.now) and n.deadline is None)
        p = self.pending
        return long_budget(p.long_work + sum(c * r for c, r in left if self.now + r > horizon),
                           p.work + sum(c * r for c, r in left), cores,
                           max([p.longest(), *(r for _, r in left)]))

    def _may_start(self, node: SimNode, task: SimTask) -> bool:
        if node.deadline is None:
            return True
        return self.policy.drains is False or self.now + task.runtime <= node.deadline

    # -- the policy -----------------------------------------------------------------
    def view(self) -> View:
        queued = [self.tasks[u] for u in self.queue]
        running = [(n, u) for n in self.nodes.values() for u in n.running]
        return View(self.now, tuple(self.nodes.values()), self.free_nodes(),
                    self.cfg.total_nodes, self.cfg.cores_per_node, self.cfg.max_nodes,
                    sum(t.cores for t in queued), len(queued),
                    sum(t.cores * t.runtime for t in queued),
                    sum(self.tasks[u].cores for _, u in running), len(running))

    def _decide(self) -> None:
        action = self.policy.decide(self.view())
        for uid in action.delete:
            if uid in self.nodes and len(self.nodes) == 1:
                self.result.refused_deletes += 1   # CloudLab refuses to empty a sliver
                continue
            if uid in self.nodes:
                self._remove(uid)
                self.result.gives_back += 1
        if action.add:
            self._add(action.add)

    # -- the clock ------------------------------------------------------------------
    def _account(self, until: float) -> None:
        dt = until - self.now
        if dt <= 0:
            return
        self.result.node_hours += len(self.nodes) * dt / 3600
        idle = sum(1 for n in self.nodes.values() if n.ready(self.now) and not n.running)
        self.result.idle_node_hours += idle * dt / 3600

    def run(self) -> Result:
        cfg, total = self.cfg, len(self.tasks)
        self._tenants()
        self._add(self.policy.initial_nodes(cfg), initial=True)
        next_tick, next_decision = 0.0, 0.0
        while self.done < total and self.now < cfg.horizon:
            at = min(next_tick, self.ends[0][0] if self.ends else next_tick)
            self._account(at)
            self.now = at
            while self.ends and self.ends[0][0] <= self.now:
                self._finish(*heapq.heappop(self.ends))
            if self.now >= next_tick:
                self._arrive()
                self._tenants()
                self._countdowns()
                if self.now >= next_decision:
                    self._decide()
                    next_decision = self.now + self.policy.interval
                running = sum(len(n.running) for n in self.nodes.values())
                self.result.samples.append(Sample(
                    self.now, len(self.nodes), sum(1 for n in self.nodes.values()
                                                   if n.ready(self.now)), running, self.tenants))
                next_tick += cfg.tick
            self._place()
        self.result.finished = self.done == total
        if not self.result.finished:
            self.result.makespan = self.now
        return self.result


def simulate(config: SimConfig, tasks: list[SimTask], pattern: Pattern,
             policy: Policy) -> Result:
    return Simulation(config, tasks, pattern, policy).run()
