"""The pilot shape counts the built-in schedulers decide from (troy.frameworks.shapes):
they must follow every pilot change, or a scheduler would place units on pilots that are
gone, full or draining."""
from __future__ import annotations

from collections import Counter

import troy
from troy.frameworks.shapes import shape_of


def counted(fw) -> Counter:
    return Counter({s: n for s, n in fw._shapes._counts.items()})


def actual(fw) -> Counter:
    return Counter(shape_of(p) for p in fw.list_pilots())


def test_shape_counts_follow_reserve_release_drain_and_cancel(session):
    fw = session.add_framework("local", "shapes")
    pilots = [fw.submit_pilot({"size": 4}) for _ in range(5)]
    pilots[0]._reserve(3)
    pilots[1]._reserve(4)
    pilots[1]._release(1)
    pilots[2].draining = True
    pilots[3].backlog = 2
    pilots[4].cancel()
    assert counted(fw) == actual(fw)
    assert sum(counted(fw).values()) == 5
    accepting_free = sorted(s.free for s in counted(fw).elements() if s.accepting)
    assert accepting_free == [1, 1, 4]   # the draining and the canceled pilot take nothing


def test_late_binding_skips_a_framework_whose_pilots_are_all_draining(session):
    busy = session.add_framework("local", "draining")
    free = session.add_framework("local", "free")
    for p in [busy.submit_pilot({"size": 8}) for _ in range(3)]:
        p.draining = True
    free.submit_pilot({"size": 1})
    for name in ("first_fit", "backfill", "round_robin"):
        us = session.unit_service(name)
        fw, pilot = us.scheduler.schedule(us, troy.ComputeUnitDescription(
            executable="/bin/true"))
        assert (fw.name, pilot) == ("free", None), name
