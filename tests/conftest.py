"""Fixtures for the whole suite, and its two tiers.

Tiers: ``pytest -m "not slow"`` (``make test-fast``) runs the unit and in-process tests;
``make test`` runs everything, in parallel (pytest-xdist). A test is slow when it boots
something real: the emulator, a Dask cluster, node agents, the demo, a server in a doc block,
a subprocess of ours. It says so with ``pytest.mark.slow`` (on the test, or ``pytestmark`` on
its module); a test that asks for one of :data:`SLOW_FIXTURES` is marked slow here, whatever
its module says, so that the fast tier never boots an emulator by accident.

Fixtures here: ``emulator`` / ``emulator_factory`` (a running emulator per test, port 0),
``emulator_pki`` (its CA and certificates, made once per session), ``endpoint_factory`` (a
real HTTPS callback endpoint), ``cluster_ca`` (a cluster CA for Dask over TLS), ``repo_root``.
Helpers (``wait_for``, ``REPO``...) are in :mod:`tests.helpers`.
"""
from __future__ import annotations

import gc
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticslice.emulator import EmulatorServer, init_emulator
from tests.elasticslice.emulator.helpers import FAST, CallbackEndpoint, RunningEmulator
from tests.helpers import REPO

# Dask's event-loop watch (every 20 ms) and system monitor (every 0.5 s), in every Dask
# server of the suite and the processes it starts: sampled less often here (the cluster
# tests take ~10% less CPU); nothing the tests look at depends on them.
os.environ.setdefault("DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL", "1s")
os.environ.setdefault("DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL", "2s")
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL", "100ms")  # as agents
# a manager daemon whose run a test killed for good keeps its nodes a minute, not ten
os.environ.setdefault("ELASTICSLICE_ORPHAN_TIMEOUT", "60")
import dask.config  # noqa: E402 - after the variables it reads

dask.config.refresh()

# The dask framework's fork server, once a test's framework started it, serves every later
# framework of this test worker: Dask is imported once a worker, not once a framework
from troy.frameworks.dask import forkserver  # noqa: E402

forkserver.keep()

# A suite started in the background of a script (`make test &`, nohup) inherits SIGINT
# ignored, and so would every command the tests start: those whose Ctrl-C the tests check
# (the demo, elasticslice run, troy run) would never see it and the tests would wait for
# them. The tests play a terminal's Ctrl-C, which reaches a process that has the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Fixtures that start real servers, clusters or processes: a test using one is slow.
SLOW_FIXTURES = frozenset({
    "emulator", "emulator_factory", "endpoint_factory", "emu", "make_manager",
    "make_cluster", "dask_scheduler", "tls_framework", "hostile_emulator", "managed",
    "served_emulator", "dask_url",
})


# Where the longest tests live (whole workflows on elastic clusters, the demo, doc blocks,
# Dask's and Parsl's clusters): they start first on every worker (see below), so that the
# parallel run does not end waiting for one of them.
LONGEST_FIRST = ("tests/elasticslice/pilots/", "tests/elasticslice/test_run.py",
                 "tests/test_demo", "tests/test_docs", "tests/bench/",
                 "tests/elasticslice/test_dask_cluster.py",
                 "tests/elasticslice/test_parsl_provider.py")


def xdist_chunks(count: int, workers: int) -> list[int]:
    """How many of ``count`` tests pytest-xdist's work stealing hands each of ``workers``
    at the start: in order, each the pending tests over the workers left."""
    sizes = []
    for left in range(workers, 0, -1):
        sizes.append((count - sum(sizes)) // left)
    return sizes


def dealt(groups: list[list[Any]], workers: int,
          key: Callable[[Any], Any] | None = None) -> list[Any]:
    """The tests of ``groups`` (longest kind first) in the order that starts each xdist
    worker on its share of every group, longest first: the work-stealing scheduler hands
    the workers consecutive runs of the collection and steals from their ends, so sorting
    the whole collection longest-first put every long test on the first worker or two, and
    the ones stolen last started near the end of the run.

    Tests with the same ``key`` (not None: :func:`shared_fixture_key`, the module or
    package whose fixtures they share) are dealt as one, one after the other in one share,
    where the first of them would go: pytest sets a module's fixture up again each time a
    worker comes back to the module, and dealt one by one round the workers, the 7 tests
    of tests/hostile/test_starvation.py set its flood of 1,100 connections up 7 times
    (17.4 s of CPU in a run, 1.7 s one after the other)."""
    key = key or (lambda test: None)
    count = sum(map(len, groups))
    sizes = xdist_chunks(count, workers)
    bundles: dict[Any, list[Any]] = {}
    units: list[list[list[Any]]] = [[] for _ in groups]
    for kind, group in zip(units, groups):
        for test in group:
            k = key(test)
            if k is None:
                kind.append([test])
            elif k in bundles:
                bundles[k].append(test)     # with the first of its kind, whatever its group
            else:
                bundles[k] = [test]
                kind.append(bundles[k])
    chunks: list[list[Any]] = [[] for _ in sizes]

    def room(c: int) -> int:
        return sizes[c] - len(chunks[c])

    k = 0
    for kind in units[:-1]:
        for unit in kind:                   # dealt round the workers with room for it
            fits = [c for c in ((k + s) % workers for s in range(workers))
                    if room(c) >= len(unit)]
            if fits:
                chunks[fits[0]].extend(unit)
                k = fits[0] + 1
                continue
            rest = list(unit)               # room nowhere for all of it: where there is most
            for c in sorted(range(workers), key=room, reverse=True):
                take = room(c)
                chunks[c].extend(rest[:take])
                rest = rest[take:]
            k += 1
    quick = iter([test for unit in units[-1] for test in unit])  # the quick ones fill each share
    for c, chunk in enumerate(chunks):
        chunk.extend(next(quick) for _ in range(room(c)))
    return [test for chunk in chunks for test in chunk]


def shared_fixture_key(item: pytest.Item) -> str | None:
    """Where the module- or package-scoped fixtures ``item`` uses live (its module, or the
    package of the widest), or None: tests with one are best run one after the other."""
    info = getattr(item, "_fixtureinfo", None)
    module = item.nodeid.split("::")[0]
    found: str | None = None
    for name in getattr(info, "names_closure", ()):
        defs = info.name2fixturedefs.get(name)
        if not defs or defs[-1].scope not in ("package", "module", "class"):
            continue
        if defs[-1].scope == "package":
            return defs[-1].baseid or module
        found = module
    callspec = getattr(item, "callspec", None)   # tests/troy/frameworks: the module's
    if found is None and callspec is not None and callspec.params.get("framework") == "dask":
        found = module                           # scheduler, asked for by `framework`
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = pytest.mark.slow
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(slow)

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is None:
            return 2
        where = item.nodeid
        return 0 if where.startswith(LONGEST_FIRST) else 1
    items.sort(key=weight)  # stable: the same order on every worker
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:   # (the same on every worker: the controller checks)
        groups = [[i for i in items if weight(i) == w] for w in (0, 1, 2)]
        items[:] = dealt(groups, workers, key=shared_fixture_key)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (every test module, Dask, Parsl, the project) lives the whole
    session: out of the garbage collector's sight, its oldest generation is not walked over
    again and again while the tests allocate."""
    gc.freeze()


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def emulator_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One initialised emulator directory per session (CA, certificates, user.pem)."""
    return init_emulator(tmp_path_factory.mktemp("emulator-pki") / "emu", port=0)


@pytest.fixture
def emulator_factory(emulator_pki: Path, tmp_path: Path
                     ) -> Iterator[Callable[..., RunningEmulator]]:
    """``make(**options)``: a started emulator on 127.0.0.1 port 0 with fast boots (0.2 s)
    and other :class:`EmulatorServer` options (``fault_rate``, ``seed``, ``max_wait``,
    ``notify_interval``, ``inventory``...); stopped at the end of the test."""
    started: list[EmulatorServer] = []

    def make(**options: Any) -> RunningEmulator:
        directory = tmp_path / f"emu{len(started)}"
        shutil.copytree(emulator_pki, directory)
        server = EmulatorServer(directory, port=0, **{**FAST, **options})
        server.start()
        started.append(server)
        return RunningEmulator(directory, server)

    yield make
    for server in reversed(started):
        server.stop()


@pytest.fixture
def emulator(emulator_factory: Callable[..., RunningEmulator]) -> RunningEmulator:
    """A fresh emulator per test: ``.dir``, ``.url``, ``.config_path`` (a client config that
    works as is) and ``.server``."""
    return emulator_factory()


@pytest.fixture
def endpoint_factory(tmp_path: Path) -> Iterator[Callable[..., CallbackEndpoint]]:
    """``make(emulator, early=True, user_cert=False)``: a real HTTPS client endpoint that
    records the emulator's callbacks; closed at the end of the test."""
    made: list[CallbackEndpoint] = []

    def make(emu: RunningEmulator, early: bool = True, user_cert: bool = False
             ) -> CallbackEndpoint:
        ep = CallbackEndpoint(emu.dir, tmp_path, early=early, user_cert=user_cert)
        made.append(ep)
        return ep

    yield make
    for ep in made:
        ep.close()


@pytest.fixture
def cluster_ca() -> tuple[bytes, bytes]:
    """A cluster CA (certificate, key) for Dask over mutual TLS, one per test: an agent left
    retrying a port another test's scheduler then takes must not be let in there."""
    from elasticslice.rpc.pki import make_ca
    return make_ca("test cluster CA", key_type="ec")
