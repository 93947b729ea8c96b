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


def test_tests_sharing_a_module_s_fixture_go_together_to_one_worker():
    """Dealt one by one round the workers, each worker set a module's fixture up for its
    share of the module's tests (and again each time it came back to the module)."""
    long = [f"L{i}" for i in range(6)]
    middle = [f"M{i}" for i in range(9)] + [f"F{i}" for i in range(5)]   # F: one fixture
    quick = [f"Q{i}" for i in range(12)] + ["FQ"]                       # FQ: it too
    order = dealt([long, middle, quick], 3,
                  key=lambda t: "f" if t.startswith("F") else None)
    assert sorted(order) == sorted(long + middle + quick)
    together = [i for i, t in enumerate(order) if t.startswith("F")]
    assert together == list(range(together[0], together[0] + 6))   # one after the other
    shares, start = [], 0
    for size in xdist_chunks(len(order), 3):
        shares.append(order[start:start + size])
        start += size
    assert sum(any(t.startswith("F") for t in share) for share in shares) == 1
    assert [s[0] for s in shares] == ["L0", "L1", "L2"]      # longest first on each worker
    # a bundle larger than any share's room is split where there is most room
    big = dealt([[], [f"F{i}" for i in range(8)], [f"Q{i}" for i in range(4)]], 3,
                key=lambda t: "f" if t.startswith("F") else None)
    assert sorted(big) == sorted([f"F{i}" for i in range(8)] + [f"Q{i}" for i in range(4)])


def test_the_shared_fixture_key_is_the_module_or_the_package():
    from tests.conftest import shared_fixture_key

    class Defs:
        def __init__(self, scope, baseid=""):
            self.scope, self.baseid = scope, baseid

    class Info:
        def __init__(self, **defs):
            self.names_closure = list(defs)
            self.name2fixturedefs = {name: [d] for name, d in defs.items()}

    class Item:
        def __init__(self, info, params=None):
            self.nodeid = "tests/x/test_y.py::test_z"
            self._fixtureinfo = info
            if params is not None:
                self.callspec = type("C", (), {"params": params})()

    assert shared_fixture_key(Item(Info(tmp_path=Defs("function")))) is None
    assert shared_fixture_key(Item(Info(a=Defs("session"), b=Defs("module")))) == \
        "tests/x/test_y.py"
    assert shared_fixture_key(Item(Info(b=Defs("module"), c=Defs("package", "tests/x")))) \
        == "tests/x"
    assert shared_fixture_key(Item(Info(), {"framework": "dask"})) == "tests/x/test_y.py"
    assert shared_fixture_key(Item(Info(), {"framework": "local"})) is None
