"""The hostile-input corpus: one emulator and one real `elasticslice manage` for the package.

Starting an emulator and a manager takes seconds, so the tests of tests/hostile share them and
each test checks, after its hostile call, that they still serve and that their state is what
it was (``ManagedSlice.assert_intact``).

``hostile_emulator``: a running emulator (package scope) with the session's PKI.
``managed``: a real `elasticslice manage` process on that emulator, with its callback endpoint
registered and 3 nodes held, logging with --debug (package scope).
Helpers (``corpus``, ``ManagedSlice``...) are in :mod:`tests.hostile.helpers`.
"""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticslice.emulator import EmulatorServer
from tests.elasticslice.emulator.helpers import FAST, RunningEmulator
from tests.elasticslice.managers.helpers import cm_nodes, manager_config, managing
from tests.helpers import wait_for
from tests.hostile.helpers import NODES, ManagedSlice


@pytest.fixture(scope="package")
def hostile_emulator(emulator_pki: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    directory = tmp_path_factory.mktemp("hostile") / "emu"
    shutil.copytree(emulator_pki, directory)
    server = EmulatorServer(directory, port=0, **FAST)
    server.start()
    yield RunningEmulator(directory, server)
    server.stop()


@pytest.fixture(scope="package")
def managed(hostile_emulator: RunningEmulator,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedSlice]:
    work = tmp_path_factory.mktemp("managed")
    conf = manager_config(hostile_emulator, work, endpoint="enabled = true\n")
    log = work / "manage.log"
    store = hostile_emulator.server.ctx.store
    with managing(conf, log, ELASTICSLICE_DEBUG="1") as proc:
        def registered() -> list:
            assert proc.poll() is None, log.read_text()[-3000:]
            return store.all_endpoints()
        (row,) = wait_for(registered, timeout=120, what="the endpoint registered")
        wait_for(lambda: sorted(cm_nodes(hostile_emulator, work)) == NODES, timeout=120,
                 what="3 nodes")
        managed = ManagedSlice(hostile_emulator, proc, conf, log, work, row.url)
        wait_for(lambda: sorted(n["client_id"] for n in managed.status()["nodes"]) == NODES,
                 timeout=60, what="3 nodes recorded")
        yield managed
