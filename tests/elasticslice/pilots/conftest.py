"""Elastic clusters against a running emulator: nodes are real Troy node agents (Dask workers
over TLS) started by the emulated nodes' startup commands.

``make_cluster(emulator, **options)``: a started :class:`ElasticCluster` for the emulator's
user (fast cycle, no cooldowns, a 1 s drain margin), closed at the end of the test. Its nodes
boot the box's pilot image, which has the agent (``node_python``): quick, for the many tests
about what happens after a pilot joined; ``stock=True`` boots the stock image as ``run`` and
the demo do (each node builds the agent's environment from the wheelhouse).
The cluster listens where the box's config says (``[pilots] listen``: its control address).
``witness``: a :class:`~tests.elasticslice.pilots.helpers.Witness` units report to (nodes see
none of the host's files), at the control address of the test's ``emulator``;
``witness_for(emulator)`` makes one for an emulator of ``emulator_factory``. Helpers
(``Run``, ``sleepers``, ``assert_nothing_lost``...) are in
:mod:`tests.elasticslice.pilots.helpers`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticslice.pilots import ElasticCluster
from tests.elasticslice.managers.helpers import FAST_INTERVALS, FAST_POLICY, client_for
from tests.elasticslice.pilots.helpers import Witness, pilot_image


@pytest.fixture
def witness_for() -> Iterator[Callable[[Any], Witness]]:
    """``witness_for(emulator)``: a :class:`Witness` at the emulator's control address."""
    made: list[Witness] = []

    def make(emulator: Any) -> Witness:
        made.append(Witness(emulator.control_address))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def witness(emulator: Any, witness_for: Callable[[Any], Witness]) -> Witness:
    """Where units on the test's ``emulator``'s nodes say where they ran and ask whether a
    gate is open."""
    return witness_for(emulator)


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., ElasticCluster]]:
    made: list[ElasticCluster] = []

    def make(emulator: Any, stock: bool = False, **options: Any) -> ElasticCluster:
        server = client_for(emulator, tmp_path / f"cache{len(made)}")
        if not stock:
            options.setdefault("disk_image", pilot_image(emulator))
            options.setdefault("node_python", "python3")
        # 8-core nodes, as the tests count cores (a node of no type may be any: the CM's
        # choice); added ones by the names of free m510s (AddNodes has no hardware type)
        options.setdefault("hardware_type", "m510")
        options.setdefault("intervals", FAST_INTERVALS)
        options.setdefault("margin", 1.0)
        options.setdefault("policy", dataclasses.replace(FAST_POLICY, max_delete_per_cycle=1))
        cluster = ElasticCluster(server, tmp_path / f"cluster{len(made)}", **options)
        made.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in reversed(made):
        cluster.close()
        cluster.server.close()
