"""Managers against a running emulator (real TLS, real callbacks), with fast settings.

``make_manager(emulator, **options)``: a ``SimpleElasticSliceManager`` (or a subclass,
``cls=``) for the emulator's user with a ``SimpleElasticSliceHelper`` (one initial PC),
state under the test's tmp dir, no cooldowns, short intervals; closed at the end of the test. Helpers are in
:mod:`tests.elasticslice.managers.helpers`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticslice.managers import SimpleElasticSliceHelper, SimpleElasticSliceManager
from elasticslice.managers.policy import PolicyConfig
from tests.elasticslice.managers.helpers import FAST_INTERVALS, FAST_POLICY, client_for


@pytest.fixture
def make_manager(tmp_path: Path) -> Iterator[Callable[..., SimpleElasticSliceManager]]:
    made: list[SimpleElasticSliceManager] = []

    def make(emulator: Any, *, helper: Any = None, policy: PolicyConfig | None = None,
             state_dir: Path | None = None, cls: type = SimpleElasticSliceManager,
             **options: Any) -> SimpleElasticSliceManager:
        server = client_for(emulator, tmp_path / "cache")
        options.setdefault("manage_intervals", FAST_INTERVALS)
        options.setdefault("retry_interval", 0.2)
        options.setdefault("maxthreshold", 4)
        manager = cls(
            server, helper=helper or SimpleElasticSliceHelper(num_pcs=1),
            policy=policy or FAST_POLICY, state_dir=state_dir or tmp_path / "state", **options)
        made.append(manager)
        return manager

    yield make
    for manager in reversed(made):
        manager.close()
        manager.server.close()
