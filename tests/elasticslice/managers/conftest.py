"""Managers against a running emulator (real TLS, real callbacks), with fast settings.

``make_manager(emulator, **options)``: a ``SimpleElasticSliceManager`` for the emulator's
user with a ``SimpleElasticSliceHelper`` (one initial PC), state under the test's tmp dir,
no cooldowns, short intervals; closed at the end of the test.
``admin(emulator)``: the emulator's admin client (``load``, ``revoke``, ``report``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticslice.config import load_config
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.managers import SimpleElasticSliceHelper, SimpleElasticSliceManager
from elasticslice.managers.policy import PolicyConfig
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.transport import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.05)
FAST_POLICY = PolicyConfig(add_cooldown=0.0, delete_cooldown=0.0, max_add_per_cycle=10,
                           max_delete_per_cycle=10)
FAST_INTERVALS = {m: 0.3 for m in SimpleElasticSliceManager.DEF_ORDER}


def client_for(emulator: Any, cache: Path, retry: RetryPolicy = FAST_RETRY) -> ProtoGeniServer:
    config = load_config(emulator.config_path,
                         env={"ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(cache)})
    return ProtoGeniServer(config, retry=retry)


PATIENT_RETRY = RetryPolicy(attempts=80, base_delay=0.01, max_delay=0.05)


def cm_nodes(emulator: Any, tmp_path: Path) -> list[str]:
    """The client_ids the emulator's CM holds in the sliver (a fresh client, patient enough
    for an emulator that faults every call)."""
    with client_for(emulator, tmp_path / f"look-cache-{id(emulator)}", PATIENT_RETRY) as look:
        return [n.client_id for n in look.sliver_status().nodes]


@pytest.fixture
def make_manager(tmp_path: Path) -> Iterator[Callable[..., SimpleElasticSliceManager]]:
    made: list[SimpleElasticSliceManager] = []

    def make(emulator: Any, *, helper: Any = None, policy: PolicyConfig | None = None,
             state_dir: Path | None = None, **options: Any) -> SimpleElasticSliceManager:
        server = client_for(emulator, tmp_path / "cache")
        options.setdefault("manage_intervals", FAST_INTERVALS)
        options.setdefault("retry_interval", 0.2)
        options.setdefault("maxthreshold", 4)
        manager = SimpleElasticSliceManager(
            server, helper=helper or SimpleElasticSliceHelper(num_pcs=1),
            policy=policy or FAST_POLICY, state_dir=state_dir or tmp_path / "state", **options)
        made.append(manager)
        return manager

    yield make
    for manager in reversed(made):
        manager.close()
        manager.server.close()


def admin(emulator: Any) -> AdminClient:
    return AdminClient(emulator.dir)


def with_policy(**changes: Any) -> PolicyConfig:
    return dataclasses.replace(FAST_POLICY, **changes)
