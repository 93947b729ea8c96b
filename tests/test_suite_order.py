"""The suite's own order under pytest-xdist (tests/conftest.py): every worker starts on its
share of the longest tests."""
from __future__ import annotations

from tests.conftest import dealt, xdist_chunks


def test_the_shares_are_xdists():
    assert xdist_chunks(1685, 6) == [280, 281, 281, 281, 281, 281]
    assert sum(xdist_chunks(7, 3)) == 7


def test_each_worker_starts_on_its_share_of_the_long_tests_then_the_quick_ones():
    long, middle, quick = ([f"{kind}{i}" for i in range(n)]
                           for kind, n in (("L", 10), ("M", 7), ("Q", 20)))
    order = dealt([long, middle, quick], 3)
    assert sorted(order) == sorted(long + middle + quick)
    shares, start = [], 0
    for size in xdist_chunks(len(order), 3):
        shares.append(order[start:start + size])
        start += size
    for share in shares:
        kinds = [t[0] for t in share]
        assert kinds == sorted(kinds, key="LMQ".index)      # long, then middle, then quick
        assert 3 <= kinds.count("L") <= 4                    # the long ones spread evenly
    assert [s[0] for s in shares] == ["L0", "L1", "L2"]      # longest first on each worker
