"""The scaling policies under comparison: ours (the manager's real ``decide``) and baselines.

* :class:`Ours`: :func:`elasticslice.managers.policy.decide` itself, fed the Observed the
  pilots manager builds (node states, availability, the cores of the units ready or running
  as Troy reports them and the cores of a node: the policy turns them into nodes, as in the
  manager; busy/idle per node) every 60 s; it drains nodes under notice (the manager's
  deadline-aware drain).
* :class:`Static`: N nodes held from the start (re-acquired after a revocation).
* :class:`SeedDefaults`: the seed's manager as shipped: every 300 s (``add_nodes``), grow to
  ``maxthreshold`` while the CM keeps ``percent_available_minimum`` (0.5) free; no deletes
  (``enable_delete = False``), no notion of demand.
* :class:`ParslBlocks`: Parsl's ``htex_auto_scale`` strategy, one node per block: every
  5 s, scale out when outstanding tasks exceed the slots (parallelism 1), scale in blocks
  idle for ``max_idletime`` (120 s) when slots exceed the tasks; min_blocks 0, init_blocks 1.
* :class:`DaskAdaptive`: ``distributed.deploy.Adaptive``: the target is the cores for the
  ready and running tasks' expected time over ``target_duration`` (5 s), capped by their
  count; scale down (idle workers) after ``wait_count`` (3) low recommendations 1 s apart.

None of the baselines knows CloudLab's delete notices, so their units run until the node is
taken; each asks only for what is free (CloudLab refuses the rest). Their queues are first
come, first served (``order``), as Parsl's interchange and Dask's scheduler run tasks that
carry no runtime; ours places the longest runtime first, as Troy's unit service does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from elasticslice.managers.policy import (ALL_TYPES, Availability, NodeState, NodeView,
                                          Observed, PolicyConfig, decide)

from .sim import Action, SimConfig, View

CM = "urn:publicid:IDN+sim+authority+cm"


def idle_nodes(view: View, *, newest_first: bool = True) -> list[str]:
    """Ready nodes running nothing and under no notice, newest first."""
    nodes = [n for n in view.nodes if n.ready(view.now) and not n.running and n.deadline is None]
    nodes.sort(key=lambda n: n.added_at, reverse=newest_first)
    return [n.uid for n in nodes]


@dataclass
class Ours:
    config: PolicyConfig
    name: str = "ours"
    interval: float = 10.0      # the simulation's tick; the pilot cluster decides every 2 s
    drains: bool = True
    order: str = "longest_first"  # Troy's unit service: the longest runtime hint first
    placement: str = "by_end"     # Troy's local framework: troy.place.choose
    reclaim_policy: str = "LIFO"  # CLIENT: the CM reclaims the nodes our values put lowest
    last_add: float | None = None
    last_delete: float | None = None
    decisions: int = 0

    def initial_nodes(self, config: SimConfig) -> int:
        return self.config.minthreshold

    def observed(self, view: View) -> Observed:
        nodes = tuple(NodeView(
            client_id=n.uid, cm=CM,
            state=NodeState.READY if n.ready(view.now) else NodeState.NOTREADY,
            added_at=n.added_at, initial=n.initial, pending_delete=n.deadline is not None,
            busy=bool(n.running), idle_since=n.idle_since) for n in view.nodes)
        return Observed(now=view.now, nodes=nodes,
                        availability={CM: {ALL_TYPES: Availability(view.free, view.total)}},
                        demand_cores=view.queued_cores + view.running_cores,
                        cores_per_node=view.cores_per_node,
                        last_add=self.last_add, last_delete=self.last_delete)

    def decide(self, view: View) -> Action:
        decision = decide(self.observed(view), self.config)
        self.decisions += 1
        if decision.add:
            self.last_add = view.now
        if decision.delete:
            self.last_delete = view.now
        return Action(decision.add_total,
                      tuple(c for cm in {**decision.delete, **decision.replace}
                            for c in decision.give_back(cm)))


@dataclass
class Static:
    nodes: int
    name: str = "static"
    interval: float = 60.0
    drains: bool = False
    order: str = "fifo"
    placement: str = "best_fit"

    def initial_nodes(self, config: SimConfig) -> int:
        return self.nodes

    def decide(self, view: View) -> Action:
        return Action(add=max(0, self.nodes - len(view.nodes)))


@dataclass
class SeedDefaults:
    maxthreshold: int
    minthreshold: int = 1
    percent_available_minimum: float = 0.5
    name: str = "seed"
    interval: float = 300.0
    drains: bool = False
    order: str = "fifo"
    placement: str = "best_fit"

    def initial_nodes(self, config: SimConfig) -> int:
        return self.minthreshold

    def decide(self, view: View) -> Action:
        count = len(view.nodes)
        if count >= self.maxthreshold:
            return Action()
        room = math.floor(view.free - self.percent_available_minimum * view.total)
        if count < self.minthreshold:
            room = max(room, self.minthreshold - count)
        return Action(add=max(0, min(self.maxthreshold - count, room)))


@dataclass
class ParslBlocks:
    max_blocks: int
    min_blocks: int = 0
    init_blocks: int = 1
    parallelism: float = 1.0
    max_idletime: float = 120.0
    name: str = "parsl"
    interval: float = 5.0
    drains: bool = False
    order: str = "fifo"
    placement: str = "best_fit"
    idle_since: float | None = None

    def initial_nodes(self, config: SimConfig) -> int:
        return self.init_blocks

    def decide(self, view: View) -> Action:
        tasks = view.queued_units + view.running_units     # outstanding in the executor
        blocks = len(view.nodes)
        slots = blocks * view.cores_per_node
        if tasks == 0:
            if blocks <= self.min_blocks:
                return Action()
            if self.idle_since is None:
                self.idle_since = view.now
            if view.now - self.idle_since < self.max_idletime:
                return Action()
            return Action(delete=tuple(idle_nodes(view)[:blocks - self.min_blocks]))
        self.idle_since = None
        if slots == 0 or slots / tasks < self.parallelism:
            excess = math.ceil(tasks * self.parallelism - slots)
            more = math.ceil(excess / view.cores_per_node)
            return Action(add=max(0, min(more, self.max_blocks - blocks)))
        excess = math.ceil(slots - tasks * self.parallelism)
        fewer = math.floor(excess / view.cores_per_node)
        if fewer <= 0:
            return Action()
        long_idle = [n.uid for n in view.nodes if n.ready(view.now) and not n.running
                     and n.idle_since is not None and view.now - n.idle_since >= self.max_idletime]
        return Action(delete=tuple(long_idle[:min(fewer, blocks - self.min_blocks)]))


@dataclass
class DaskAdaptive:
    maximum: int
    minimum: int = 0
    target_duration: float = 5.0
    wait_count: int = 3
    name: str = "dask"
    interval: float = 10.0      # the simulation's tick; Adaptive's own is 1 s (3 s to scale down)
    drains: bool = False
    order: str = "fifo"
    placement: str = "best_fit"

    def initial_nodes(self, config: SimConfig) -> int:
        return max(self.minimum, 1)

    def decide(self, view: View) -> Action:
        running = [(n, u) for n in view.nodes for u in n.running]
        occupancy = view.queued_work + sum(n.cores for n, _ in running) * self.target_duration
        cores = math.ceil(occupancy / self.target_duration)
        cores = min(cores, view.queued_cores + view.running_cores)
        target = max(self.minimum, min(self.maximum, math.ceil(cores / view.cores_per_node)))
        held = len(view.nodes)
        if target > held:
            return Action(add=target - held)
        if target < held:  # one tick (10 s) stands for wait_count (3) calls 1 s apart
            return Action(delete=tuple(idle_nodes(view)[:held - target]))
        return Action()
