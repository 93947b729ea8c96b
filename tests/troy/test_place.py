"""The placement rule (``troy.place``): units that end together share pilots, long units
expose no more pilots than the work needs, and units without a hint go best fit."""
from __future__ import annotations

import math

import pytest

from troy.place import Budget, Slot, choose, exposed, long_budget

NOW, HORIZON = 1000.0, 300.0


def put(slots: list[Slot], runtime: float | None, cores: int = 1,
        budget: Budget | None = None) -> str | None:
    """Place one unit: its slot's key (None: it waits), ``slots`` updated."""
    end = None if runtime is None else NOW + runtime
    got = choose(slots, cores, end, now=NOW, horizon=HORIZON,
                 budget=None if budget is None else (lambda: budget))
    if got is None:
        return None
    i = slots.index(got)
    new_end = math.inf if end is None else end
    slots[i] = Slot(got.key, got.size, got.free - cores,
                    new_end if got.end is None else max(got.end, new_end))
    return got.key


def empty(*keys: str, size: int = 4) -> list[Slot]:
    return [Slot(k, size, size) for k in keys]


def test_a_unit_goes_where_the_work_ends_latest_at_or_after_its_own_end():
    slots = [Slot("soon", 4, 2, NOW + 10), Slot("later", 4, 1, NOW + 2000),
             Slot("just_after", 4, 3, NOW + 1000), Slot("idle", 4, 4)]
    assert put(list(slots), 900.0) == "just_after"     # the closest end at or after its own
    assert put(list(slots), 5.0) == "soon"             # short work with short work
    assert put(list(slots), 3000.0) == "later"         # else the latest end before it
    # best fit would take "later" (the fewest free cores) for each of them
    assert put(list(slots), None) == "later"


def test_long_units_land_together_and_nodes_fill_before_another_opens():
    """Longest first onto four empty 4-core nodes: the long ones fill one node, then the
    next; short ones fill the cores left before they open a node; an idle node stays idle."""
    slots = empty("a", "b", "c", "d")
    placed = [put(slots, r) for r in (1800.0, 1700.0, 1600.0, 1500.0, 1400.0, 1300.0)]
    assert placed == ["a"] * 4 + ["b"] * 2
    assert [put(slots, r) for r in (20.0, 10.0, 10.0)] == ["b", "b", "c"]
    assert put(slots, 15.0) == "c"                    # with the work that ends about then
    assert put(slots, 1200.0) == "c"                  # the latest end before its own
    assert [s.key for s in slots if exposed(s, NOW, HORIZON)] == ["a", "b", "c"]
    assert slots[-1] == Slot("d", 4, 4)


def test_a_node_with_only_short_work_is_left_out_of_the_long_work():
    """A long unit takes the exposed node's last core, not the roomier node whose work all
    ends within the horizon; over the budget it waits rather than expose that node."""
    slots = [Slot("short", 4, 3, NOW + 30), Slot("long", 4, 1, NOW + 1500)]
    assert put(list(slots), 1000.0, budget=Budget(4.0, 2000.0)) == "long"
    full = [Slot("short", 4, 3, NOW + 30), Slot("long", 4, 0, NOW + 1500)]
    assert put(list(full), 1000.0, budget=Budget(4.0, 2000.0)) is None
    # within the budget (another node's worth of cores) it exposes the short node
    assert put(list(full), 1000.0, budget=Budget(8.0, 2000.0)) == "short"
    # a unit as long as all the work takes never waits: the work ends with it
    assert put(list(full), 2000.0, budget=Budget(4.0, 2000.0)) == "short"
    # without a budget the rule only matches ends
    assert put(list(full), 1000.0) == "short"


def test_without_hints_it_is_best_fit_as_before():
    slots = [Slot("roomy", 8, 6, NOW + 5000), Slot("tight", 4, 1, NOW + 10),
             Slot("tight_too", 4, 1), Slot("idle", 4, 4)]
    assert put(list(slots), None) == "tight"          # the fewest free cores; ties: first
    assert put(list(slots), None, cores=2) == "idle"
    assert put(list(slots), None, cores=7) is None
    assert choose([], 1, None, now=NOW, horizon=HORIZON) is None


@pytest.mark.parametrize("work,cores,longest,want", [
    (16_000.0, 16, 0.0, (4.0, 1000.0)),      # 4,000 core-s long over 1,000 s: 4 cores
    (16_000.0, 16, 2000.0, (2.0, 2000.0)),   # the longest unit sets the span
    (4_000.0, 16, 0.0, (16.0, 250.0)),       # all of it long: every core
])
def test_long_budget_is_the_long_work_over_the_span_of_all(work, cores, longest, want):
    b = long_budget(4_000.0, work, cores, longest)
    assert (b.cores, b.span) == want
    assert long_budget(0.0, 0.0, 0) == Budget(0.0, 0.0)
