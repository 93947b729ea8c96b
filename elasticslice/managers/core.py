"""The plain manager, composed of parts passed in: :class:`Manager`.

It keeps a slice alive (``ensure_slice``, ``ensure_sliver``, ``renew``), watches it
(``update_sliver_status``, ``update_all``, ``update_available``), grows and shrinks it
(``add_nodes``, ``delete_nodes``, as the pure policy in :mod:`.policy` decides) and answers
CloudLab's callbacks (``client_endpoint``). What it is given:

* ``policy``: a :class:`~.policy.PolicyConfig`, the one place of the thresholds;
* ``helper``: what a node is (the seed's helper methods: the RSpec, AddNodes' arguments,
  the delete commands, told of nodes that settled or went);
* ``hosted``: what the hosted system adds (:class:`~.hosted.HostedSystem`): its demand,
  how it sees the nodes, its listeners for node events;
* ``releaser``: what happens before a revoked node goes (a :class:`~.endpoint.Releaser`
  that calls :meth:`Manager.release_early` when the node's work is off it; None: the
  helper's delete commands).

Every node given back goes one way: asked in the state's ``to_release`` (a policy victim or
replaced node by ``delete_nodes``, a revoked node once its delete commands finished or it was
drained), then given back by the actuator on the cycle's ``release_nodes``, a job on a thread
of its own, woken at each ask. The work is done by small parts, each with explicit
collaborators, built in one place (:func:`~.parts.build_parts`: observer, actuator, renewer,
registrar, notice book, holdings, slice claim, cycle).

Callbacks never wait for the cycle (the endpoint takes the book's short lock only, no lock
a callback needs is held across an RPC, a back-off or a Dask round trip, and mail and the
helper's reactions run on threads of their own). The seed's classes are a facade over this
one (:mod:`.manager`); the pilots' and Parsl's managers are this one with their parts.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError, RPCError
from elasticslice.managers.background import Background
from elasticslice.managers.base import TrackedState
from elasticslice.managers import cycle as seed_cycle
from elasticslice.managers.endpoint import Releaser
from elasticslice.managers.hosted import HostedSystem
from elasticslice.managers.notify import Notifier
from elasticslice.managers.parts import PolicyField, build_parts
from elasticslice.managers.policy import Decision, Observed, PolicyConfig, decide, failure_pause
from elasticslice.managers.records import ReleaseSource
from elasticslice.managers.sites import SitesFailed
from elasticslice.managers.state import ManagerState
from elasticslice.rpc.codes import GeniCode

log = logging.getLogger("elasticslice.managers.manager")

#: the seed's classes where seed 004 documents them (``elasticslice.managers.core.X``): module
SEED_CLASSES = dict(
    ElasticSliceClientEndpoint="endpoint", SimpleElasticSliceClientEndpoint="endpoint",
    ElasticSliceHelper="helpers", PluginElasticSliceHelper="helpers",
    SimpleElasticSliceHelper="helpers", ElasticSliceManager="base",
    SimpleElasticSliceManager="manager")


def __getattr__(name: str) -> Any:
    if name not in SEED_CLASSES:   # imported when asked: the facade imports this module
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"elasticslice.managers.{SEED_CLASSES[name]}"), name)


class Manager:
    """The plain manager (the module's doc). Besides the parts: ``cms`` (the CMs to work at:
    CM objects of ``server``; None: all of them), ``order``/``intervals``/``reset_triggers``/
    ``retry_interval`` (the cycle: :mod:`.cycle`), ``state`` (a :class:`ManagerState`) or
    ``state_dir``, ``notifier`` (mail), renewal (``renew_hours``, ``renew_margin``),
    ``endpoint`` (an ``EndpointConfig``; None: no callback server), ``adopt`` (work on an
    existing slice this state directory did not create), ``clock``."""

    DEF_INTERVAL = seed_cycle.DEF_INTERVAL  # the cycle's one table (managers/cycle.py)
    # the seed's thresholds: the policy's config holds them, the manager reads through
    minthreshold = PolicyField()
    maxthreshold = PolicyField()
    percent_available_minimum = PolicyField()
    enable_delete = PolicyField()

    def __init__(self, server: Any, *, helper: Any, policy: PolicyConfig,
                 hosted: HostedSystem | None = None, releaser: Releaser | None = None,
                 cms: Sequence[Any] | None = None, order: Sequence[str] = seed_cycle.DEF_ORDER,
                 intervals: Mapping[str, float] | None = None,
                 reset_triggers: Mapping[str, Sequence[str]] | None = None,
                 retry_interval: float = 30, state: ManagerState | None = None,
                 state_dir: str | Path | None = None, notifier: Notifier | None = None,
                 renew_hours: float = 6.0, renew_margin: float = 3600.0, endpoint: Any = None,
                 delete_in_group: bool = True, delete_commands_timeout: float = 600.0,
                 clock: Callable[[], float] = time.time, adopt: bool = False) -> None:
        self.server = server
        self.node_helper = helper
        self.hosted = hosted if hosted is not None else HostedSystem()
        self.manage_order = list(order)
        if "release_nodes" not in self.manage_order:  # the one way back is always there
            after = self.manage_order.index("delete_nodes") + 1 \
                if "delete_nodes" in self.manage_order else len(self.manage_order)
            self.manage_order.insert(after, "release_nodes")
        self.manage_intervals = {**seed_cycle.DEF_INTERVALS, **(intervals or {})}
        self.method_reset_triggers = {k: list(v) for k, v in (
            reset_triggers if reset_triggers is not None
            else seed_cycle.RESET_TRIGGERS).items()}
        self.retry_interval = retry_interval
        self.clock = clock
        self.cms = list(cms) if cms else list(server.cms)
        self.cmlist = [c.url for c in self.cms]
        self.policy = dataclasses.replace(policy, cmlist=tuple(self.cmlist))
        self.renew_hours, self.renew_margin = renew_hours, renew_margin
        self.notifier = notifier if notifier is not None else Notifier(None)
        if state is None:
            if state_dir is None:
                raise ElasticSliceError("a manager needs a state_dir (or a state)")
            state = ManagerState.open(Path(state_dir).expanduser())
        self.state: Any = state if isinstance(state, TrackedState) else TrackedState(state)
        self._demand_nodes: int | None = None
        self.last_decision: Decision | None = None
        self.last_observed: Observed | None = None
        self._paused_after: float | None = None  # the failure the last add pause followed
        self._passes = 0
        # cycle methods run one at a time; no callback, drain or release ever takes it, nor
        # the cycle's methods apart (``release_nodes``) (the seed's per-instance RLock,
        # ``rlock``)
        self._methods_lock = self.rlock = threading.RLock()
        self._stop = threading.Event()
        self._started = False
        self._reconciled = False
        build_parts(self, server, helper=helper, hosted=self.hosted, endpoint=endpoint,
                    delete_in_group=delete_in_group,
                    delete_commands_timeout=delete_commands_timeout, adopt=adopt,
                    releaser=releaser)
        self.hosted.bind(self)
        helper.note_client_ids(r.client_id for r in self.state.nodes(include_gone=True))
        for intent in self.state.open_intents():
            helper.note_client_ids(intent.client_ids)

    # ------------------------------------------------------------------ revoked nodes
    def release_early(self, node_id: str, client_id: str | None, why: str) -> None:
        """A revoked node's work is off it (the releaser says so, from any thread): the next
        countdown answer says max_wait_time 0, and the node is asked in ``to_release``, which
        wakes the cycle's ``release_nodes``: its DeleteNodes goes at once, on the release
        job's own thread, never behind a slow AddNodes (CloudLab may count down for up to its
        notify interval more otherwise). Returns at once."""
        if self.notices.release([node_id], why):
            log.info("releasing %s (%s) early: %s", node_id, client_id, why)
            self._give_back_revoked([node_id], why)

    def resume_releases(self) -> int:
        """A manager started again while nodes of its were being released (its process was
        killed): the releases of the revocations not released yet, whose deadline is to
        come, start again (CloudLab's next notice for them is not new, so it would start
        nothing). How many; call it once the hosted system's pilots or blocks are known."""
        now = self.clock()
        revocations = [r for r in self.notices.open()
                       if r.released is None and r.deadline > now and r.client_id]
        if revocations:
            log.warning("%d revoked node(s) were draining when the manager stopped: their "
                        "drains start again", len(revocations))
            self.client_endpoint.releaser.start(revocations)
        return len(revocations)

    def _commands_finished(self, node_ids: list[str], outcome: str) -> None:
        """The delete commands of revoked nodes ended (the book released them): the nodes
        are given back, unless CloudLab takes them anyway (no time was left, or the
        commands were killed at the deadline or as the nodes went)."""
        if outcome in ("done", "failed"):
            self._give_back_revoked(node_ids, f"revoked, delete commands {outcome}")

    def _give_back_revoked(self, node_ids: list[str], why: str) -> None:
        recs = [r for r in (self.state.find_node(i) for i in node_ids)
                if r is not None and r.gone_at is None]
        self.actuator.ask_release(recs, ReleaseSource.NOTICE.value, why)

    # ------------------------------------------------------------------ small helpers
    def _now(self) -> float:
        return self.clock()  # the clock may be swapped after construction (tests do)

    def _cms(self, cm: Any = None) -> list[Any]:
        if cm is None:
            return list(self.cms)
        return [cm] if hasattr(cm, "url") else [self.server.cm(cm)]

    def _run_method(self, name: str) -> Any:
        if name not in self.manage_order:
            raise ElasticSliceError(f"unknown manager method {name!r}")
        try:
            if name in self.cycle.apart:  # never behind another (see Actuator.release)
                return getattr(self, name)()
            with self._methods_lock:
                return getattr(self, name)()
        except SitesFailed as err:  # what changed at the other CMs still wakes its methods
            if err.result:
                self.wake(*self.method_reset_triggers.get(name, ()))
            raise

    def _renew_margin(self) -> float:
        return max(self.renew_margin,
                   2 * self.manage_intervals.get("renew", 3600) + self.retry_interval)

    def _on_method_error(self, name: str, err: BaseException, failures: int) -> None:
        if failures == 1 or failures % 10 == 0:
            self.notify(f"{name} failed", f"{name} failed ({failures} in a row): {err}")

    def notify(self, subject: str, body: str) -> None:
        """Mail now (the cycle's thread may wait for the SMTP server)."""
        self.notifier.send(f"[elasticslice] {subject}", body)

    def notify_later(self, subject: str, body: str) -> None:
        """Mail from a thread that must not wait (a callback's)."""
        if self.notifier.enabled:
            self.mail.post(self.notify, subject, body)

    def wake(self, *methods: str) -> None:
        """Run these cycle methods now (events call this; it never waits)."""
        self.cycle.wake(*methods)

    @property
    def demand(self) -> int | None:
        """Nodes the hosted system wants (None: no opinion)."""
        return self.hosted.wanted(self.policy, self._demand_nodes)

    def set_demand(self, demand: int | None) -> None:
        """What the work wants (total nodes; None = no opinion): a demand change wakes
        add_nodes and delete_nodes."""
        changed = demand != self._demand_nodes
        self._demand_nodes = demand
        if changed:
            self.wake("add_nodes", "delete_nodes")

    @property
    def endpoint_server(self) -> Any:
        return self.registrar.endpoint_server if self.registrar else None

    @property
    def endpoint_url(self) -> str | None:
        return self.registrar.url if self.registrar else None

    @property
    def registered(self) -> set[str]:
        return self.registrar.registered if self.registrar else set()

    @property
    def availability(self) -> dict[str, Any]:
        return self.observer.availability

    # ------------------------------------------------------------------ seed methods
    def create_slice(self) -> Any:
        return self.actuator.create_slice()

    def ensure_slice(self) -> Any:
        return self.actuator.ensure_slice()

    def create_sliver(self, cm: Any = None) -> Any:
        return self.actuator.create_sliver(self._cms(cm)[0])

    def ensure_sliver(self, cm: Any = None) -> Any:
        def one(c: Any) -> int:
            created = self.actuator.ensure_sliver(c)
            if self.registrar is not None:
                self.registrar.register(c)
            return created
        try:
            return self.sites.each("ensure_sliver", self._cms(cm), one) or 0
        except Exception:
            self.hosted.adds_done()   # the nodes a failed CreateSliver asked for
            raise

    def update_sliver_status(self, cm: Any = None, force: bool = False) -> Any:
        if not self._reconciled or self.state.open_intents():
            self.reconcile()
        def one(c: Any) -> int:
            try:
                return self.observer.sliver_status(c)
            except RPCError as err:
                if err.code == GeniCode.SEARCHFAILED:   # our sliver is gone: make it again
                    self.wake("ensure_sliver")
                raise
        return self.sites.each("update_sliver_status", self._cms(cm), one) or 0

    def reconcile(self) -> int:
        """Close the open intents against the CMs' slivers (at start, after a crash)."""
        done = self.actuator.reconcile()
        self._reconciled = True
        if done and self.state.to_release.rows():  # rows that waited for it
            self.wake("release_nodes")
        return done

    def renew(self) -> Any:
        return self.renewer.renew()

    def update_all(self, cm: Any = None, force: bool = False,
                   lastFetchBefore: float | None = None) -> Any:  # noqa: N803 (seed name)
        self.sites.each("update_all", self._cms(cm),
                        lambda c: self.observer.resources(c, available=False))
        return None

    def update_available(self, cm: Any = None) -> Any:
        self.sites.each("update_available", self._cms(cm),
                        lambda c: self.observer.resources(c, available=True))
        return None

    def get_system_state(self) -> Any:
        """Pull the hosted system's state (its part's ``pull``; a seed subclass overrides
        this and calls :meth:`set_demand`)."""
        return self.hosted.pull()

    def set_system_state(self) -> Any:
        """Push CloudLab's resource values (``self.state.values()``) to the hosted system
        (its part's ``push``; a seed subclass overrides this)."""
        return self.hosted.push()

    def observe(self) -> Observed:
        """What the policy sees now (no RPC): the hosted system's demand and nodes."""
        return self.hosted.observe(self.observer, self._demand_nodes)

    def decide(self) -> Decision:
        """The policy's decision on what the manager observes now (no I/O)."""
        observed = self.observe()
        if len(self.cms) > 1:   # a CM backing off: the others grow instead
            observed = dataclasses.replace(observed, paused=self.sites.paused("add_nodes"))
        decision = decide(observed, self.policy)
        self.last_observed, self.last_decision = observed, decision
        pause = failure_pause(observed, self.policy)
        if pause > 0 and self._paused_after != observed.last_failed_at:
            self._paused_after = observed.last_failed_at  # said once a pause
            log.warning("%d added nodes in a row failed to start: no add for %.0f s (the "
                        "nodes' causes are above); then one more try", observed.failed_in_a_row,
                        pause)
        return decision

    def should_add_nodes(self, count: int = 0, cm: Any = None) -> Any:
        """How many nodes to add at ``cm`` (int), the AddNodes struct (dict), or None.
        With ``count`` > 0: ``count`` when the policy allows that many, else None."""
        allowed = self.decide().add.get(self._cms(cm)[0].url, 0)
        if count > 0:
            return count if allowed >= count else None
        return allowed or None

    def add_nodes(self, count: int = 0, cm: Any = None) -> Any:
        def one(c: Any) -> int:
            answer = self.should_add_nodes(count, c)
            if not answer:
                return 0
            args = answer if isinstance(answer, dict) \
                else self.node_helper.get_add_args(int(answer))
            return self.actuator.add(c, args) if args else 0
        try:
            return self.sites.each("add_nodes", self._cms(cm), one) or 0
        finally:  # failed, or some left out (too few free of the type)
            self.hosted.adds_done()

    def should_delete_nodes(self, cm: Any = None) -> Any:
        """The client_ids to give back at ``cm`` (what DeleteNodes takes), or None: the
        policy's victims and its replacements (added nodes that failed to boot)."""
        return self.decide().give_back(self._cms(cm)[0].url) or None

    def delete_nodes(self, cm: Any = None) -> Any:
        """The policy's victims and replaced nodes: the hosted system lets their work go,
        the helper's delete commands run, then they are asked to be given back
        (``release_nodes`` does it); how many were asked."""
        self.hosted.refresh()   # the victims among the idle as they are now

        def one(c: Any) -> int:
            victims = self.should_delete_nodes(c)
            if not victims:
                return 0
            self.hosted.before_give_back(list(victims))
            why = "; ".join(self.last_decision.reasons) if self.last_decision else ""
            return self.actuator.delete(c, victims, why)
        return self.sites.each("delete_nodes", self._cms(cm), one) or 0

    def release_nodes(self) -> Any:
        """Give back every node asked (the state's ``to_release``): the one way nodes go
        back, on a thread of the cycle's own (never behind a slow AddNodes); how many
        went. Then, when a revoked node went, the hosted system's ``release_wakes`` run."""
        done = self.actuator.release()
        if any(r.source == ReleaseSource.NOTICE.value for r in done):
            self.wake(*self.hosted.release_wakes)
        return len(done)

    # ------------------------------------------------------------------ running
    def manage_once(self, force: bool = False) -> dict[str, str | None]:
        """Every method once, in order; method -> its error (None when it worked). Raises
        when the slice is not this state directory's (see :class:`~.ownership.SliceClaim`)."""
        self.claim.claim()
        self._passes += 1
        self.observer.full_pass = self._passes
        try:
            return self.cycle.run_once()
        finally:
            self.observer.full_pass = 0

    def start(self) -> None:
        """Claim the slice, start the callback endpoint (registered at every CM) and the
        cycle: one full cycle at once, then each method at its interval."""
        if self._started:
            return
        self.claim.claim()
        self._started = True
        for part in self._threads():
            part.open()
        if self.registrar is not None:
            self.registrar.start()
        self.cycle.start(first_delay=0.0)

    def _threads(self) -> list[Background]:
        """The threads of the manager's own that callbacks hand work to."""
        return [self.events, self.mail, *self.hosted.threads()]

    def stop(self) -> None:
        """Stop the cycle, unregister and stop the endpoint, finish what callbacks started."""
        self._stop.set()
        if not self._started:
            return
        self._started = False
        self.cycle.stop()
        if self.registrar is not None:
            self.registrar.stop()
        self.client_endpoint.shutdown_deletes()
        for part in self._threads():
            part.close()

    def close(self) -> None:
        self.stop()
        for part in self._threads():  # a manager never started may have some too
            part.close()
        self.state.close()

    def stop_requested(self) -> None:
        """Ask :meth:`manage` to stop (safe from a signal handler)."""
        self._stop.set()

    def manage(self) -> None:
        """Run until :meth:`stop_requested` (a signal handler calls it) or :meth:`stop`."""
        self._stop.clear()
        self.start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()
