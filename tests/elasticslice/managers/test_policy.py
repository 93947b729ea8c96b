"""The scaling decision on its own: no server, no clock (time is an argument)."""
from __future__ import annotations

import doctest
import random

import pytest

from elasticslice.managers import policysim
from elasticslice.managers.policy import (
    Availability, Decision, NodeState, NodeView, Observed, PolicyConfig, decide, victim_order,
    wanted_nodes,
)
from elasticslice.managers.policysim import reversals, simulate

CM = "https://cm.a/cm"
CM2 = "https://cm.b/cm"
NOW = 10_000.0


def node(cid: str, *, cm: str = CM, state: NodeState = NodeState.READY, added: float = 0.0,
         **kw) -> NodeView:
    return NodeView(cid, cm, state, added, **kw)


def nodes(n: int, *, cm: str = CM, initial: int = 1, prefix: str = "n") -> tuple[NodeView, ...]:
    """n ready nodes at cm, the first ``initial`` of them from the sliver as created."""
    return tuple(node(f"{prefix}{i}", cm=cm, added=float(i), initial=i < initial)
                 for i in range(n))


def seen(held: tuple[NodeView, ...] = (), avail: dict | None = None, **kw) -> Observed:
    avail = {CM: (90, 100)} if avail is None else avail
    return Observed(now=kw.pop("now", NOW), nodes=held,
                    availability={cm: {"*": Availability(*a)} if isinstance(a, tuple) else a
                                  for cm, a in avail.items()}, **kw)


# --- NodeState -------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, state", [
    ("ready", NodeState.READY), ("READY", NodeState.READY), (" notready ", NodeState.NOTREADY),
    ("changing", NodeState.CHANGING), ("mixed", NodeState.CHANGING),
    ("failed", NodeState.FAILED), ("unknown", NodeState.NOTREADY), ("", NodeState.NOTREADY),
    (None, NodeState.NOTREADY), ("something-new", NodeState.NOTREADY),
])
def test_node_state_from_cm(raw, state):
    assert NodeState.from_cm(raw) is state


# --- growing ---------------------------------------------------------------------------------

def test_grows_to_maxthreshold_when_plenty_is_free():
    d = decide(seen(nodes(1), {CM: (80, 100)}), PolicyConfig(maxthreshold=10))
    assert d.add == {CM: 9} and not d.delete


def test_initial_nodes_count_towards_maxthreshold():
    d = decide(seen(nodes(10, initial=10)), PolicyConfig(maxthreshold=10))
    assert d.empty


def test_stops_when_available_fraction_is_below_the_minimum():
    d = decide(seen(nodes(2), {CM: (49, 100)}), PolicyConfig(percent_available_minimum=0.5))
    assert d.empty
    assert any("below 0.5" in r for r in d.reasons)


def test_add_never_takes_the_fraction_below_the_minimum():
    # 55 of 100 free, minimum 0.5: at most 5 more, so the CM still shows 50% free afterwards
    d = decide(seen(nodes(1), {CM: (55, 100)}), PolicyConfig(maxthreshold=50, max_add_per_cycle=50))
    assert d.add == {CM: 5}


def test_fraction_exactly_at_minimum_adds_nothing_more_but_is_not_scarce():
    cfg = PolicyConfig(maxthreshold=20, percent_available_minimum=0.3, enable_delete=True)
    d = decide(seen(nodes(5), {CM: (30, 100)}), cfg)   # 0.3 * 100 = 30.000000000000004
    assert d.empty


def test_below_minthreshold_adds_even_when_scarce():
    d = decide(seen((), {CM: (3, 100)}), PolicyConfig(minthreshold=2, maxthreshold=10))
    assert d.add == {CM: 2}


def test_below_minthreshold_ignores_cooldowns_and_per_cycle_limit():
    cfg = PolicyConfig(minthreshold=4, maxthreshold=10, max_add_per_cycle=1)
    d = decide(seen(nodes(1), {CM: (2, 100)}, last_add=NOW - 1, last_delete=NOW - 1), cfg)
    assert d.add == {CM: 2}   # never more than available, even to reach the minimum


def test_never_adds_more_than_available():
    d = decide(seen((), {CM: (1, 1)}), PolicyConfig(minthreshold=0, maxthreshold=10,
                                                    percent_available_minimum=0.0))
    assert d.add == {CM: 1}


def test_no_free_nodes_adds_nothing_even_below_minimum():
    d = decide(seen((), {CM: (0, 10)}), PolicyConfig(minthreshold=3))
    assert d.empty


def test_unknown_availability_adds_nothing():
    d = decide(seen((), {}), PolicyConfig(minthreshold=0))
    assert d.empty


def test_max_add_per_cycle():
    d = decide(seen(nodes(1), {CM: (90, 100)}), PolicyConfig(maxthreshold=50, max_add_per_cycle=3))
    assert d.add == {CM: 3}


def test_add_cooldown_holds_back_the_next_add():
    cfg = PolicyConfig(add_cooldown=60)
    assert decide(seen(nodes(2), last_add=NOW - 59), cfg).empty
    assert decide(seen(nodes(2), last_add=NOW - 60), cfg).add == {CM: 8}


def test_no_add_within_delete_cooldown_of_last_delete():
    cfg = PolicyConfig(delete_cooldown=300)
    assert decide(seen(nodes(2), last_delete=NOW - 299), cfg).empty
    assert decide(seen(nodes(2), last_delete=NOW - 300), cfg).add


def test_cmlist_order_and_spill_over():
    avail = {CM: (55, 100), CM2: (90, 100)}
    d = decide(seen(nodes(1), avail), PolicyConfig(cmlist=(CM2, CM), maxthreshold=100,
                                                   max_add_per_cycle=100))
    assert d.add == {CM2: 40, CM: 5}
    d = decide(seen(nodes(1), avail), PolicyConfig(cmlist=(CM,), maxthreshold=100,
                                                   max_add_per_cycle=100))
    assert d.add == {CM: 5}


def test_without_cmlist_all_cms_in_availability_order():
    d = decide(seen(nodes(1), {CM: (51, 100), CM2: (60, 100)}), PolicyConfig(maxthreshold=5))
    assert d.add == {CM: 1, CM2: 3}


def test_nodetype_availability_is_used_and_falls_back_to_all_types():
    avail = {CM: {"*": Availability(90, 100), "d430": Availability(1, 10)}}
    assert decide(seen(nodes(1), avail), PolicyConfig(nodetype="d430")).empty
    assert decide(seen(nodes(1), avail), PolicyConfig(nodetype="m510")).add == {CM: 9}


def test_failed_pending_and_deleting_nodes_do_not_count_adding_does():
    held = (node("a", initial=True), node("b", state=NodeState.FAILED),
            node("c", pending_delete=True), node("d"))
    d = decide(seen(held, deleting=frozenset({"d"}), adding=2), PolicyConfig(maxthreshold=5))
    assert d.add == {CM: 2}   # counted: a + 2 in flight = 3


# --- demand ----------------------------------------------------------------------------------

def test_demand_none_grows_to_max():
    assert decide(seen(nodes(1), demand=None), PolicyConfig(maxthreshold=6)).add == {CM: 5}


def test_demand_is_clamped_between_thresholds():
    cfg = PolicyConfig(minthreshold=2, maxthreshold=6)
    assert decide(seen(nodes(1), demand=4), cfg).add == {CM: 3}
    assert decide(seen(nodes(1), demand=100), cfg).add == {CM: 5}
    assert decide(seen(nodes(1), demand=0), cfg).add == {CM: 1}
    assert decide(seen(nodes(4), demand=4), cfg).empty


def test_demand_below_count_without_enable_delete_keeps_nodes():
    d = decide(seen(nodes(6), demand=2), PolicyConfig(maxthreshold=10))
    assert d.empty


def test_demand_below_count_gives_back_the_surplus():
    cfg = PolicyConfig(maxthreshold=10, enable_delete=True, max_delete_per_cycle=5)
    d = decide(seen(nodes(6), demand=4), cfg)
    assert d.delete == {CM: ("n5", "n4")} and not d.add


def test_over_maxthreshold_gives_back_when_enabled():
    cfg = PolicyConfig(maxthreshold=3, enable_delete=True, max_delete_per_cycle=5)
    assert decide(seen(nodes(5)), cfg).delete == {CM: ("n4", "n3")}


# --- giving back -----------------------------------------------------------------------------

def scarce(**kw) -> PolicyConfig:
    return PolicyConfig(enable_delete=True, **kw)


def test_scarcity_gives_back_one_node():
    d = decide(seen(nodes(5), {CM: (30, 100)}), scarce())
    assert d.delete == {CM: ("n4",)} and not d.add
    assert any("below 0.40" in r for r in d.reasons)


def test_scarcity_without_enable_delete_keeps_everything():
    assert decide(seen(nodes(5), {CM: (0, 100)}), PolicyConfig()).empty


def test_hysteresis_band_neither_adds_nor_deletes():
    for free in (41, 45, 49):
        assert decide(seen(nodes(5), {CM: (free, 100)}), scarce()).empty, free


def test_victims_lowest_value_first_then_newest():
    held = (node("init", initial=True, added=0), node("old", added=1, value=0.9),
            node("cheap", added=2, value=0.1), node("new", added=5),
            node("newer", added=6), node("mid", added=3, value=0.5))
    cfg = scarce(max_delete_per_cycle=10, minthreshold=1)
    d = decide(seen(held, {CM: (0, 100)}), cfg)
    assert d.delete == {CM: ("cheap", "mid", "old", "newer", "new")}
    assert [n.client_id for n in victim_order(held[1:])][:2] == ["cheap", "mid"]


def test_never_gives_back_initial_pending_deleting_or_busy_nodes():
    held = (node("init", initial=True), node("pend", added=9, pending_delete=True),
            node("going", added=8), node("busy", added=7, busy=True), node("free", added=1))
    d = decide(seen(held, {CM: (0, 100)}, deleting=frozenset({"going"})),
               scarce(max_delete_per_cycle=10, minthreshold=0))
    assert d.delete == {CM: ("free",)}


def test_never_below_minthreshold():
    cfg = scarce(minthreshold=3, max_delete_per_cycle=10)
    assert decide(seen(nodes(5), {CM: (0, 100)}), cfg).delete == {CM: ("n4", "n3")}
    assert decide(seen(nodes(3), {CM: (0, 100)}), cfg).empty


def test_max_delete_per_cycle_and_delete_cooldown():
    cfg = scarce(max_delete_per_cycle=2, delete_cooldown=300)
    assert decide(seen(nodes(6), {CM: (0, 100)}), cfg).delete == {CM: ("n5", "n4")}
    assert decide(seen(nodes(6), {CM: (0, 100)}, last_delete=NOW - 299), cfg).empty
    assert decide(seen(nodes(6), {CM: (0, 100)}, last_delete=NOW - 300), cfg).delete


def test_no_delete_within_add_cooldown_of_last_add():
    cfg = scarce(add_cooldown=60)
    assert decide(seen(nodes(6), {CM: (0, 100)}, last_add=NOW - 30), cfg).empty


def test_scarcity_only_takes_nodes_at_the_scarce_cm():
    held = nodes(3, cm=CM, prefix="a") + nodes(3, cm=CM2, initial=0, prefix="b")
    d = decide(seen(held, {CM: (90, 100), CM2: (10, 100)}), scarce(max_delete_per_cycle=5))
    assert d.delete == {CM2: ("b2", "b1", "b0")}


def test_no_add_anywhere_while_a_cm_is_scarce():
    held = nodes(2, cm=CM, prefix="a") + nodes(2, cm=CM2, initial=0, prefix="b")
    avail = {CM: (90, 100), CM2: (10, 100)}
    d = decide(seen(held, avail, last_delete=NOW - 10), scarce())
    assert d.empty and "no add while a delete is wanted" in d.reasons
    # ... but when nothing there could be given back, growth elsewhere goes on
    held = nodes(2, cm=CM, prefix="a") + nodes(1, cm=CM2, prefix="b")
    assert decide(seen(held, avail), scarce(maxthreshold=4)).add == {CM: 1}


def test_idle_timeout_only_gives_back_nodes_idle_that_long():
    held = (node("i", initial=True), node("fresh", added=5, idle_since=NOW - 10),
            node("stale", added=1, idle_since=NOW - 700), node("unknown", added=9),
            node("busy", added=8, busy=True, idle_since=NOW - 9999))
    cfg = scarce(idle_timeout=600, max_delete_per_cycle=5)
    assert decide(seen(held, demand=1), cfg).delete == {CM: ("stale",)}
    assert decide(seen(held, demand=1), scarce(max_delete_per_cycle=5)).delete == {
        CM: ("unknown", "fresh", "stale")}


def test_never_both_add_and_delete():
    held = nodes(3, cm=CM, prefix="a") + nodes(3, cm=CM2, initial=0, prefix="b")
    for a in range(0, 101, 10):
        for b in range(0, 101, 10):
            for demand in (None, 1, 4, 8):
                d = decide(seen(held, {CM: (a, 100), CM2: (b, 100)}, demand=demand),
                           scarce(maxthreshold=8))
                assert not (d.add and d.delete)
                assert all(v > 0 for v in d.add.values())


def test_decision_empty_and_totals():
    d = Decision(add={CM: 2, CM2: 1}, reasons=("x",))
    assert not d.empty and d.add_total == 3 and d.delete_total == 0
    assert Decision().empty


# --- demand in cores, agents, replacements ---------------------------------------------------

def test_wanted_nodes_from_cores_is_pure_and_rounds_up():
    cfg = PolicyConfig(minthreshold=1, lookahead=0.5)
    assert wanted_nodes(cfg) is None                            # no opinion
    assert wanted_nodes(cfg, nodes=3, cores=100) == 3           # stated in nodes first
    assert wanted_nodes(cfg, cores=0) == 0
    assert wanted_nodes(cfg, cores=24, cores_per_node=8) == 3
    assert wanted_nodes(cfg, cores=25, cores_per_node=8) == 4
    assert wanted_nodes(cfg, cores=8, waiting_cores=16, cores_per_node=8) == 2  # half of 16
    assert wanted_nodes(cfg, cores=5) == 1   # no node told its size yet: the first will


def test_demand_in_cores_drives_decide():
    cfg = PolicyConfig(maxthreshold=6)
    d = decide(seen(nodes(1), demand_cores=24, cores_per_node=8), cfg)
    assert d.add == {CM: 2} and "wanted 3" in d.reasons[0]


def test_a_node_without_its_agent_does_not_count_and_is_replaced():
    cfg = PolicyConfig(maxthreshold=4, agent_grace=15, agent_timeout=120)
    held = (node("a", initial=True), node("b", agentless_since=NOW - 20, had_agent=True),
            node("c", agentless_since=NOW - 20),     # never joined, within agent_timeout
            node("d", agentless_since=NOW - 5, had_agent=True))  # within the grace
    d = decide(seen(held, demand=4), cfg)
    assert d.add == {CM: 1} and d.replace == {CM: ("b",)}
    assert d.give_back(CM) == ["b"]
    # CloudLab is taking it anyway: no replacement is given back
    held = (node("a", initial=True),
            node("b", agentless_since=NOW - 20, had_agent=True, pending_delete=True))
    assert decide(seen(held, demand=2), cfg).replace == {}


def test_replacements_never_take_the_last_node_of_a_cm():
    cfg = PolicyConfig(maxthreshold=2, agent_grace=1)
    only = (node("a", initial=True, agentless_since=NOW - 50, had_agent=True),)
    d = decide(seen(only, demand=1), cfg)
    assert d.replace == {} and d.add == {CM: 1}   # the replacement first
    two = only + (node("b"),)
    assert decide(seen(two, demand=1), cfg).replace == {CM: ("a",)}


def test_added_nodes_that_failed_are_replaced_initial_ones_are_not():
    held = (node("a", initial=True, state=NodeState.FAILED), node("b", state=NodeState.FAILED),
            node("c"))
    d = decide(seen(held), PolicyConfig(maxthreshold=3))
    assert d.replace == {CM: ("b",)} and d.add == {CM: 2}


# --- no flapping: the virtual-clock simulation ----------------------------------------------

def oscillating(amplitude: int, seed: int, base: int = 50, total: int = 100):
    """Other tenants' load wobbling randomly around ``base`` nodes (of ``total``)."""
    rng = random.Random(seed)
    cache: dict[float, int] = {}

    def load(now: float) -> dict[str, int]:
        if now not in cache:
            cache[now] = max(0, min(total, base + rng.randint(-amplitude, amplitude)))
        return {CM: cache[now]}
    return load


@pytest.mark.parametrize("seed", range(20))
def test_availability_oscillating_inside_the_band_never_flaps(seed):
    # the fraction free wobbles around the 0.5 minimum by less than the 0.1 hysteresis
    cfg = PolicyConfig(maxthreshold=40, enable_delete=True, max_add_per_cycle=5)
    run = simulate(cfg, {CM: 100}, other_load=oscillating(4, seed, base=45),
                   initial={CM: 1}, step=30, duration=6 * 3600)
    assert not reversals(run)
    assert all(not s.decision.delete for s in run)
    assert run[-1].count > 1   # it did grow when there was room


@pytest.mark.parametrize("seed", range(20))
def test_wild_oscillation_reverses_at_most_once_per_cooldown(seed):
    cfg = PolicyConfig(maxthreshold=40, enable_delete=True, max_delete_per_cycle=3)
    run = simulate(cfg, {CM: 100}, other_load=oscillating(40, seed), initial={CM: 1},
                   demand=lambda now: None, step=10, duration=6 * 3600)
    assert reversals(run)   # the load really swings both ways ...
    for before, after in reversals(run):   # ... but the policy follows it only slowly
        assert after - before >= min(cfg.add_cooldown, cfg.delete_cooldown)
    # a reversal from delete to add waits out the delete cooldown
    seq = [(s.now, bool(s.decision.add)) for s in run if not s.decision.empty]
    for (t0, add0), (t1, add1) in zip(seq, seq[1:]):
        if not add0 and add1:
            assert t1 - t0 >= cfg.delete_cooldown


def test_the_flap_check_catches_a_policy_without_hysteresis_or_cooldowns():
    cfg = PolicyConfig(maxthreshold=40, enable_delete=True, max_add_per_cycle=5, hysteresis=0,
                       add_cooldown=0, delete_cooldown=0)
    run = simulate(cfg, {CM: 100}, other_load=oscillating(4, 0, base=45), initial={CM: 1},
                   step=30, duration=6 * 3600)
    assert len(reversals(run)) > 10


def test_simulation_grows_then_gives_back_when_other_tenants_arrive():
    cfg = PolicyConfig(maxthreshold=10, enable_delete=True)

    def load(now: float) -> dict[str, int]:
        return {CM: 0 if now < 3600 else 85}
    run = simulate(cfg, {CM: 100}, other_load=load, initial={CM: 1}, duration=3 * 3600)
    at = {s.now: s.count for s in run}
    assert at[3540] == 10
    assert at[3 * 3600] == 1 + 0   # all added nodes given back; the initial one stays
    assert all(s.count >= cfg.minthreshold for s in run)


def test_simulation_follows_demand_with_boot_delay():
    cfg = PolicyConfig(maxthreshold=10, enable_delete=True, max_delete_per_cycle=2)
    run = simulate(cfg, {CM: 100}, demand=lambda now: 6 if now < 1800 else 2,
                   initial={CM: 1}, boot_delay=120, duration=3600)
    at = {s.now: s.count for s in run}
    assert at[600] == 6 and at[3600] == 2


def test_policysim_doctest():
    assert doctest.testmod(policysim).failed == 0


# --- nodes that keep failing to start ---------------------------------------------------------

def test_adds_pause_after_nodes_fail_to_start_in_a_row_and_the_pause_doubles():
    """A broken image or wheelhouse: every node added fails its startup. Without a pause the
    policy replaced them as fast as the CM answered (200 boots in a test run)."""
    config = PolicyConfig(minthreshold=2, maxthreshold=4, failure_backoff=60.0,
                          failure_backoff_max=200.0)
    held = nodes(1)
    assert decide(seen(held, failed_in_a_row=2, last_failed_at=NOW - 1), config).add == {CM: 3}
    paused = decide(seen(held, failed_in_a_row=3, last_failed_at=NOW - 1), config)
    assert not paused.add  # even below minthreshold: another node would fail the same way
    assert any("3 added nodes in a row failed to start: no add for 59s" in r
               for r in paused.reasons)
    assert decide(seen(held, failed_in_a_row=3, last_failed_at=NOW - 61), config).add == {CM: 3}
    assert not decide(seen(held, failed_in_a_row=4, last_failed_at=NOW - 61), config).add
    assert decide(seen(held, failed_in_a_row=4, last_failed_at=NOW - 121), config).add
    assert not decide(seen(held, failed_in_a_row=9, last_failed_at=NOW - 199), config).add
    assert decide(seen(held, failed_in_a_row=9, last_failed_at=NOW - 201), config).add  # max
    off = PolicyConfig(minthreshold=2, maxthreshold=4, failures_before_backoff=0)
    assert decide(seen(held, failed_in_a_row=50, last_failed_at=NOW), off).add == {CM: 3}


def test_a_node_whose_startup_failed_is_replaced_even_of_the_sliver_as_created():
    """Its startup command exited non-zero: it runs nothing of the experiment. A node of the
    created sliver whose *boot* failed stays (as before); never the last node."""
    held = (node("a", initial=True, state=NodeState.FAILED, startup_failed=True),
            node("b", initial=True, state=NodeState.FAILED), node("c"))
    assert decide(seen(held), PolicyConfig(maxthreshold=3)).replace == {CM: ("a",)}
    alone = (node("a", initial=True, state=NodeState.FAILED, startup_failed=True),)
    assert not decide(seen(alone), PolicyConfig(maxthreshold=3)).replace
