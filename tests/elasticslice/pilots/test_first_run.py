"""The pilots under CloudLab's own rules (docs/emulator.md, "CloudLab's rules, from its
source"): a stock-image node's startup runs as the experiment's user; a pilot node that
reboots mid-run rejoins with what it has (its environment, key and certificate) and no unit
is lost; a node booted from an image whose python3 is 3.10 (as UBUNTU22-64-STD's) gets the
wheelhouse of its own Python and runs units."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator.images import host_python
from elasticslice.emulator.nodefs import NodeDir
from troy import State
from tests.elasticslice.managers.helpers import admin, cm_nodes
from tests.elasticslice.pilots.helpers import (Run, assert_nothing_lost, closed_gate, node_of,
                                               ran_on, sleepers)
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


def runlogs(emulator: Any, node_id: str) -> str:
    """Every runlog of the node, oldest first (one a boot)."""
    node = NodeDir(emulator.dir / "nodes" / node_id)
    paths = (node.path / "runlogs").read_text().split()
    return "".join((node.root / p.lstrip("/")).read_text() for p in paths)


def test_a_rebooted_pilot_node_rejoins_with_what_it_has_and_nothing_is_lost(
        emulator, make_cluster, witness, tmp_path: Path) -> None:
    cluster = make_cluster(emulator, stock=True, maxthreshold=1, idle_timeout=None)
    gate = closed_gate(witness)
    run = Run(cluster, sleepers(witness, 2, 2.0, cores=4, gate=gate))  # one node's worth
    # its units started (busy alone: assigned, maybe not started yet on a loaded machine,
    # and Dask sends those again by itself: nothing requeued to see)
    wait_for(lambda: len(cluster.pilots()) == 1 and cluster.pilots()[0].busy and any(
        u.state is State.RUNNING for t in run.workload.tasks.values() for u in t.units),
        timeout=180, what="a busy pilot running units")
    victim = cluster.pilots()[0]
    node_id = node_of(cluster, victim.worker_name).node_id
    enrolled = cluster.enrolment.enrolled
    admin(emulator).call("Reboot", nodes=[node_id])
    # its agent died with the node's processes; the node boots again on its own disk and
    # its start script finds the environment, the key and a certificate still valid
    wait_for(lambda: any(p.worker_name == victim.worker_name and p.id != victim.id
                         for p in cluster.pilots()), timeout=180,
             what=f"{victim.worker_name}'s agent back after the reboot")
    gate.unlink()
    stats = assert_nothing_lost(cluster, run, witness, 2)
    assert stats["units_lost"] == 0 and stats["units_requeued"] >= 1, stats
    assert victim.worker_name in cm_nodes(emulator, tmp_path)  # rejoined, not replaced
    assert cluster.enrolment.enrolled == enrolled  # no second enrolment: it had its key
    said = runlogs(emulator, node_id)
    boots = said.count("returned ")  # runstartup's last line, once per boot that ended
    assert boots >= 1 and said.count("pilot environment: built in") == 1, said
    assert "pilot environment: /local/pilot/env is complete" in said, said
    assert not cluster.failures.all()


def test_a_node_of_a_python310_image_joins_as_a_pilot_and_runs_units(
        emulator, make_cluster, witness, tmp_path: Path) -> None:
    python = host_python("3.10")
    if python is None:
        pytest.skip("no Python 3.10 on this machine for an image like UBUNTU22-64-STD")
    added = CliRunner().invoke(cli, ["emulator", "image", "add", "--dir", str(emulator.dir),
                                     "UBUNTU22-LIKE", "--python", str(python)])
    assert added.exit_code == 0, added.output
    urn = added.output.split()[-1]  # "image NAME (python3 3.10, x86_64): URN"
    cluster = make_cluster(emulator, stock=True, disk_image=urn, maxthreshold=1,
                           idle_timeout=None, manager_options={"agent_timeout": 600.0})
    run = Run(cluster, sleepers(witness, 2, 0.5, cores=4))
    stats = assert_nothing_lost(cluster, run, witness, 2)
    assert stats["units_lost"] == 0
    (node,) = {n for nodes in ran_on(witness).values() for n in nodes}
    said = runlogs(emulator, node_of(cluster, node).node_id)
    assert "pilot environment: built in /local/pilot/env" in said, said
    built = re.search(r"pilot environment: built in \S+ in [\d.]+ s \((.*)\)", said)
    assert built is not None, said
    version = (Path(emulator.dir) / "nodes" / node_of(cluster, node).node_id / "root" /
               "local" / "pilot" / "env" / "pyvenv.cfg").read_text()
    assert re.search(r"^version(_info)? = 3\.10\.", version, re.M), version
