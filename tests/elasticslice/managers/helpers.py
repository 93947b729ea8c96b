"""Helpers for the manager tests (and the pilots' and hostile tests that build on them): a
client for the emulator's user, fast policies and intervals, what the CM holds, the admin
client, other tenants' load, how a reclamation ended, a real `elasticslice manage`."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from elasticslice.config import load_config
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.managers import SimpleElasticSliceManager
from elasticslice.managers.policy import PolicyConfig
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.transport import RetryPolicy
from tests.helpers import REPO, wait_for

FAST_RETRY = RetryPolicy(attempts=12, base_delay=0.01, max_delay=0.05)
FAST_POLICY = PolicyConfig(add_cooldown=0.0, delete_cooldown=0.0, max_add_per_cycle=10,
                           max_delete_per_cycle=10)
#: Every method of the cycle each 0.3 s, but for the full advertisement (``update_all``: a
#: 70-node DiscoverResources), the slice's and the sliver's existence checks: each of those
#: RPCs costs the test's process and the box's CM CPU and tells a test nothing new every
#: 0.3 s (a cluster of the tests idled at 0.12 s of CPU a second, 0.05 with these);
#: ``release_nodes`` is woken at each node asked to go, its interval a fallback.
FAST_INTERVALS = {**{m: 0.3 for m in SimpleElasticSliceManager.DEF_ORDER},
                  "update_all": 10.0, "ensure_slice": 3.0, "ensure_sliver": 3.0,
                  "update_available": 1.0, "release_nodes": 3.0}


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


def admin(emulator: Any) -> AdminClient:
    return AdminClient(emulator.dir)


def with_policy(**changes: Any) -> PolicyConfig:
    return dataclasses.replace(FAST_POLICY, **changes)


POOL = 70  # nodes in the emulator's default inventory


def tenant_nodes(emulator: object) -> int:
    pool = admin(emulator).call("Status")["pool"]
    return sum(row.get("tenant", 0) for row in pool.values())


def load(emulator: object, busy: int) -> None:
    """Other tenants want ``busy`` nodes; wait until they hold them."""
    admin(emulator).call("SetLoad", busy=busy)
    wait_for(lambda: tenant_nodes(emulator) == busy, timeout=30,
             what=f"tenants holding {busy} nodes")


def reclaim_outcome(emulator: Any, node_id: str) -> str | None:
    """How the emulator's reclamation of ``node_id`` ended (early, forced...), None while
    it goes on."""
    rows = [r for r in admin(emulator).call("Report") if r["node_id"] == node_id]
    outcome = rows[-1]["outcome"] if rows else None
    return outcome if outcome not in (None, "", "pending") else None


def manager_config(emulator: Any, tmp_path: Path, manager: str = "",
                   endpoint: str = "") -> Path:
    """The emulator's client config plus [manager] (test defaults, then ``manager``'s
    ``key = value`` lines) and [endpoint] (``endpoint``; default: disabled)."""
    keys = {"state_dir": str(tmp_path / "state"), "maxthreshold": "3", "add_cooldown": "0",
            "retry_interval": "0.2"}
    for method in ("ensure_slice", "ensure_sliver", "update_sliver_status",
                   "update_available", "add_nodes", "delete_nodes"):
        keys[f"interval.{method}"] = "0.3"
    for line in manager.splitlines():
        key, _, value = line.partition("=")
        keys[key.strip()] = value.strip()
    text = emulator.config_path.read_text() + "\n[manager]\n"
    text += "".join(f"{k} = {v}\n" for k, v in keys.items())
    text += f"\n[endpoint]\n{endpoint or 'enabled = false'}\n"
    path = tmp_path / "manager.conf"
    path.write_text(text)
    return path


def start_manage(conf: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """A real `elasticslice manage` process, its output appended to ``log``."""
    environ = {k: v for k, v in os.environ.items() if k != "PROTOGENI_PASSPHRASE"}
    environ.update(PYTHONPATH=str(REPO), **env)
    return subprocess.Popen([sys.executable, "-m", "elasticslice.cli", "--config", str(conf),
                             "manage"], stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            env=environ, cwd=str(REPO))


@contextlib.contextmanager
def managing(conf: Path, log: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A real `elasticslice manage` for the block; killed if the block left it running."""
    proc = start_manage(conf, log, **env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
