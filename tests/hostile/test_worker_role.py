"""A unit is no cluster member, and the node it runs on reaches no further than itself.

An ordinary task on a real node agent (a worker-role certificate) inherits none of Dask's
TLS variables; even with the node's key file (a unit can read it), it is refused
``Client.run``, ``run_on_scheduler``, submitting a task, ``scatter``, plugins and a direct
``run`` on another node's worker, and no code of it runs in the control process (its marker
file is never written)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask import DaskFramework
from tests.helpers import REPO
from tests.troy.frameworks.nodes import member, nodes

pytestmark = pytest.mark.slow


def test_a_unit_on_a_node_cannot_act_as_a_client(tmp_path: Path, cluster_ca) -> None:  # noqa: ANN001
    fw = DaskFramework("hostile", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                       tls=member(tmp_path / "control", cluster_ca, "control"))
    fw.start()
    try:
        with nodes(fw, cluster_ca, tmp_path / "nodes", ["node-1", "node-2"]):
            home = tmp_path / "nodes" / "node-1"   # the node's own files, as the unit finds them
            other = fw.find_pilot("node-2").native_id
            marker, out, env = tmp_path / "marker", tmp_path / "attack.json", tmp_path / "env"
            script = (f"env > {env}; cd {REPO} && exec {sys.executable} -m "
                      f"tests.troy.frameworks.test_guard {home / 'ca.pem'} "
                      f"{home / 'node-1.pem'} {home / 'node-1-key.pem'} "
                      f"{fw.scheduler_address} {other} {marker} > {out}")
            u = fw.submit_unit(CUD(executable="/bin/sh", arguments=["-c", script]),
                               fw.find_pilot("node-1"))
            assert u.wait(120) is State.DONE, u.result
            assert not [line for line in env.read_text().splitlines()
                        if line.startswith("DASK_DISTRIBUTED__COMM__")]
            attempts = json.loads(out.read_text())
            assert {"client", "run_function", "broadcast", "scatter", "worker run",
                    "register_worker_plugin", "register-client"} <= set(attempts)
            assert all(v.startswith("refused") for v in attempts.values()), attempts
            assert not marker.exists()
            # and the node is still a pilot that runs units
            v = fw.submit_unit(CUD(executable="/bin/true"), fw.find_pilot("node-1"))
            assert v.wait(60) is State.DONE
    finally:
        fw.close()
