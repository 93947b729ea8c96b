"""The manager whose nodes are Troy pilots: demand in, CloudLab's notices out.

:class:`PilotSliceManager` is a :class:`SimpleElasticSliceManager` that

* turns Troy's demand (``session.demand()``) into nodes wanted (``get_system_state``);
* hands CloudLab's resource values to Troy (``set_system_state``), so the least valuable
  pilots get no long units;
* adopts only the agents of nodes it holds (:meth:`accepts`, the framework's
  ``adopt_filter``): a worker with a valid certificate but a name it does not hold gets
  nothing;
* drains a pilot against the deadline of CloudLab's ``NotifyDeletePending`` (no new unit at
  once; units that cannot finish in time are requeued elsewhere) and releases the node as
  soon as the pilot is empty (the next countdown answer says ``max_wait_time`` 0);
* requeues everything of a pilot whose node is gone anyway (``max_wait_time`` 0,
  ``NotifyDeleteComplete``, a node that left the sliver);
* gives back idle pilots (the policy's ``idle_timeout``; lowest value first, never a busy
  one, rate-limited, down to ``minthreshold``);
* replaces a node whose agent died (its pilot ended and none came back for ``agent_grace``
  seconds): such a node is wanted once more (the replacement comes first) and given back,
  never the last node of the sliver.

What it counted survives a restart (the state store's meta table).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers import actions
from elasticslice.managers.cycle import one_line
from elasticslice.managers.endpoint import DeleteNotice
from elasticslice.managers.manager import SimpleElasticSliceManager
from elasticslice.managers.policy import Decision, NodeState, NodeView, decide
from troy.frameworks.base import Pilot, PilotFramework
from troy.states import FINAL_STATES

log = logging.getLogger(__name__)

_META = "pilots.revocations"


@dataclasses.dataclass
class Revocations:
    """CloudLab's reclamations of our nodes (node_ids): seen, released early, forced."""

    seen: set[str] = dataclasses.field(default_factory=set)
    early: set[str] = dataclasses.field(default_factory=set)
    forced: set[str] = dataclasses.field(default_factory=set)

    def to_json(self) -> str:
        return json.dumps({k: sorted(v) for k, v in dataclasses.asdict(self).items()})

    @classmethod
    def from_json(cls, text: str | None) -> Revocations:
        try:
            data = json.loads(text) if text else {}
            return cls(**{k: set(map(str, data.get(k, ()))) for k in ("seen", "early", "forced")})
        except (ValueError, TypeError):
            log.warning("unreadable revocation counts in the state; starting from zero")
            return cls()


class PilotSliceManager(SimpleElasticSliceManager):
    """A manager whose helper's nodes run Troy node agents (see the module docstring).

    ``framework``: the Troy ``dask`` framework the agents join (with ``adopt_workers``);
    ``session``: the Troy session whose ``demand()`` drives scaling; ``margin``: seconds
    kept free before a revocation deadline; ``node_cores``: cores of a node to plan with
    (None: the largest pilot seen); ``lookahead``: the share of the cores of tasks not yet
    released that counts as demand; ``agent_grace``: seconds a held node may stay without
    the agent that once ran there (an agent restarting with its node comes back well
    within) before it is replaced; ``agent_timeout``: the same for a ready node whose agent
    never joined. Other options as :class:`SimpleElasticSliceManager`."""

    def __init__(self, server: Any, *, framework: PilotFramework, session: Any,
                 margin: float = 5.0, node_cores: int | None = None, lookahead: float = 0.0,
                 agent_grace: float = 15.0, agent_timeout: float = 120.0,
                 **options: Any) -> None:
        super().__init__(server, **options)
        self.framework = framework
        self.session = session
        self.margin = margin
        self.node_cores = node_cores
        self.lookahead = lookahead
        self.last_demand: Any = None
        self._rev_lock = threading.Lock()
        self.revocations = Revocations.from_json(self.state.get_meta(_META))
        self._refused: set[str] = set()
        self.agent_grace = agent_grace
        self.agent_timeout = agent_timeout
        self._agentless_since: dict[str, float] = {}

    # ------------------------------------------------------------------ pilots of nodes
    def pilot_of(self, client_id: str | None) -> Pilot | None:
        """The pilot of the node ``client_id`` (its agent's name), None if none joined."""
        return self.framework.find_pilot(client_id) if client_id else None

    def holds(self, client_id: str) -> bool:
        """Whether ``client_id`` is a node of ours (held, or being added)."""
        if any(r.client_id == client_id for r in self.state.nodes()):
            return True
        return any(i.kind == "add" and client_id in i.client_ids
                   for i in self.state.open_intents())

    def accepts(self, name: str | None, address: str, resources: Any = None) -> bool:
        """The framework's ``adopt_filter``: only agents named after a node we hold."""
        ok = bool(name) and self.holds(str(name))
        if not ok and address not in self._refused:
            self._refused.add(address)
            log.warning("worker %s (%r) is not one of our nodes: not adopted, no units",
                        address, name)
        return ok

    # ------------------------------------------------------------------ demand and values
    def cores_per_node(self) -> int | None:
        if self.node_cores:
            return self.node_cores
        sizes = [p.size for p in self.framework.list_pilots() if p.state not in FINAL_STATES]
        return max(sizes) if sizes else None

    def nodes_for(self, demand: Any) -> int:
        """Nodes wanted for ``demand`` (the policy clamps it to the thresholds)."""
        cores = demand.queued_cores + demand.running_cores + \
            math.ceil(self.lookahead * demand.waiting_cores)
        if cores <= 0:
            return 0
        per = self.cores_per_node()
        if per is None:  # no node has told us its size yet: the first one will
            return self.minthreshold
        return math.ceil(cores / per)

    def get_system_state(self) -> Any:
        demand = self.session.demand()
        self.last_demand = demand
        wanted = self.nodes_for(demand)
        # a node whose agent died gives nothing: its replacement is wanted on top
        self.set_demand(wanted + len(self.dead_agents()) if wanted else wanted)
        return demand

    def dead_agents(self) -> list[str]:
        """client_ids of held nodes whose agent died: their pilot ended, none came back
        for ``agent_grace`` seconds (or the node is ready and no agent joined within
        ``agent_timeout``), and CloudLab is not taking them (a drained pilot's
        node goes anyway)."""
        now = time.monotonic()
        dead, seen = [], set()
        for rec in self.state.nodes():
            pilot = self.pilot_of(rec.client_id)
            if (rec.node_id and rec.node_id in self.revocations.seen) or \
                    (pilot is None and rec.state != NodeState.READY.value) or \
                    (pilot is not None and pilot.state not in FINAL_STATES):
                continue
            seen.add(rec.client_id)
            since = self._agentless_since.setdefault(rec.client_id, now)
            if now - since >= (self.agent_grace if pilot else self.agent_timeout):
                dead.append(rec.client_id)
        for cid in set(self._agentless_since) - seen:
            del self._agentless_since[cid]
        return sorted(dead)

    def set_system_state(self) -> Any:
        values = self.state.values()
        by_name = {r.client_id: values[r.node_id] for r in self.state.nodes()
                   if r.node_id and r.node_id in values}
        if by_name:
            self.framework.set_pilot_values(by_name)
        return len(by_name)

    # ------------------------------------------------------------------ nodes coming, going
    def handle_added_node(self, node: dict[str, Any], status: str) -> None:
        super().handle_added_node(node, status)
        pilot = self.pilot_of(node.get("client_id"))
        if status == "ready":
            log.info("node %s ready: %s", node.get("client_id"),
                     f"pilot {pilot.id} adopted" if pilot else "waiting for its agent")
        elif pilot is not None:
            self.framework.lose_pilot(pilot, f"node {status}")

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        super().handle_deleted_node(node)
        node_id = node.get("node_id")
        if node_id:
            self._note_forced(str(node_id))
        self._lose(node.get("client_id"), "node gone")

    def _lose(self, client_id: str | None, reason: str) -> None:
        pilot = self.pilot_of(client_id)
        if pilot is not None and pilot.state not in FINAL_STATES:
            requeued = self.framework.lose_pilot(pilot, reason)
            log.info("pilot %s of %s lost (%s): %d unit(s) requeued", pilot.id, client_id,
                     reason, len(requeued))

    # ------------------------------------------------------------------ CloudLab's notices
    def _client_id(self, node_id: str, given: str | None) -> str | None:
        if given:
            return given
        rec = self.state.find_node(node_id)
        return rec.client_id if rec else None

    def on_delete_pending(self, nodes: list[DeleteNotice]) -> None:
        super().on_delete_pending(nodes)
        fresh = False
        with self._rev_lock:
            for n in nodes:
                if n.node_id not in self.revocations.seen:
                    self.revocations.seen.add(n.node_id)
                    fresh = True
        if fresh:
            self._save()
        for n in nodes:
            if n.max_wait_time == 0 and not self.delete_finished(n.node_id):
                self._note_forced(n.node_id)
                self._lose(self._client_id(n.node_id, n.client_id), "revoked without notice")

    def on_delete_complete(self, nodes: list[DeleteNotice]) -> None:
        for n in nodes:
            self._note_forced(n.node_id)
        super().on_delete_complete(nodes)
        for n in nodes:  # a node we no longer knew (or knew by node_id only)
            self._lose(self._client_id(n.node_id, n.client_id), "taken back by CloudLab")

    def start_delete(self, nodelist: list[dict[str, Any]]) -> None:
        """A fresh notice with time left: drain each node's pilot against its deadline and
        release the node when the pilot is empty (no commands run on the node)."""
        now = time.time()
        for item in nodelist:
            node_id = str(item["node_id"])
            client_id = self._client_id(node_id, item.get("client_id"))
            deadline = now + int(item.get("max_wait_time", 0))
            pilot = self.pilot_of(client_id)
            if pilot is None or pilot.state in FINAL_STATES:
                self._release(node_id, client_id, "no pilot on it")
                continue
            log.warning("draining pilot %s of %s: CloudLab takes it in %.0f s", pilot.id,
                        client_id, deadline - now)
            self.framework.drain_pilot(
                pilot, deadline, margin=self.margin,
                on_empty=lambda p, nid=node_id, cid=client_id: self._release(nid, cid, "drained"))

    def _release(self, node_id: str, client_id: str | None, why: str) -> None:
        """Release a revoked node early: the next countdown answer says max_wait_time 0,
        and a DeleteNodes goes at once (CloudLab may count down for up to
        ``notify_interval`` more otherwise)."""
        with self._rev_lock:
            if node_id in self.revocations.forced or node_id in self.revocations.early:
                return
            self.revocations.early.add(node_id)
        self._save()
        log.info("releasing %s (%s) early: %s", node_id, client_id, why)
        self.end_delete([{"node_id": node_id, "client_id": client_id}])
        # not on the caller's thread: that may be the CM's own NotifyDeletePending call
        threading.Thread(target=self._delete_released, args=(node_id,),
                         name=f"release-{node_id}", daemon=True).start()

    def _delete_released(self, node_id: str) -> None:
        rec = self.state.find_node(node_id)
        cm = next((c for c in self.cms if rec is not None and c.url == rec.cm), None)
        if rec is None or rec.gone_at is not None or cm is None:
            return
        try:
            with self.rlock:
                cm.delete_nodes([rec.client_id])
        except ElasticSliceError as err:
            log.info("DeleteNodes of %s refused (%s): the countdown answer releases it",
                     rec.client_id, one_line(err))
        self.wake("update_sliver_status")

    def _note_forced(self, node_id: str) -> None:
        with self._rev_lock:
            rev = self.revocations
            if node_id not in rev.seen or node_id in rev.early or node_id in rev.forced:
                return
            rev.forced.add(node_id)
        self._save()

    def _save(self) -> None:
        with self._rev_lock:
            text = self.revocations.to_json()
        try:
            self.state.set_meta(_META, text)
        except Exception as err:  # counts are for reports; never fail a notice for them
            log.warning("cannot save the revocation counts: %s", err)

    # ------------------------------------------------------------------ idle scale-down
    def node_view(self, view: NodeView) -> NodeView:
        """The policy's view of a node, with ``busy`` and ``idle_since`` from its pilot (a
        node without a live pilot stays unknown: never idle)."""
        pilot = self.pilot_of(view.client_id)
        if pilot is None or pilot.state in FINAL_STATES:
            return view
        return dataclasses.replace(view, busy=pilot.busy, idle_since=pilot.idle_since)

    def decide(self) -> Decision:
        observed = actions.observe(self)
        observed = dataclasses.replace(observed,
                                       nodes=tuple(self.node_view(n) for n in observed.nodes))
        decision = decide(observed, self.policy)
        self.last_observed, self.last_decision = observed, decision
        return decision

    def delete_nodes(self, cm: Any = None) -> Any:
        """Give back what the policy chose; each victim's pilot is taken out first, so a
        unit that reached it meanwhile is requeued, never lost."""
        deleted = 0
        dead = self.dead_agents()
        for c in self._cms(cm):
            victims = list(self.should_delete_nodes(c) or [])
            held = self.state.nodes(c.url)
            mine = [r.client_id for r in held
                    if r.client_id in dead and r.client_id not in victims]
            # never every node of the sliver (CloudLab refuses): the replacement comes first
            mine = mine[:max(0, len(held) - len(victims) - 1)]
            if mine:
                log.warning("giving back %s: the node agent died and did not come back",
                            " ".join(mine))
            if victims or mine:
                for cid in victims + mine:
                    self._lose(cid, "given back")
                deleted += actions.delete(self, c, victims + mine)
        return deleted

    # ------------------------------------------------------------------ figures
    def stats(self) -> dict[str, Any]:
        """revocations, early_releases, forced_releases, nodes_peak, node_seconds."""
        with self._rev_lock:
            rev = self.revocations
            counts = {"revocations": len(rev.seen), "early_releases": len(rev.early),
                      "forced_releases": len(rev.forced)}
        now = self.clock()
        spans = [(r.added_at or now, r.gone_at or now)
                 for r in self.state.nodes(include_gone=True)]
        events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans],
                        key=lambda e: (e[0], e[1]))
        held = peak = 0
        for _, step in events:
            held += step
            peak = max(peak, held)
        return {**counts, "nodes_peak": peak,
                "node_seconds": round(sum(max(0.0, b - a) for a, b in spans), 1)}
