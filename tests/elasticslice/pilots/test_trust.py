"""Who may join the pilots, tried as an attacker would: a worker without a certificate of the
cluster CA (a stranger CA, even under a held node's name) is refused by the scheduler; a
worker with a valid certificate but a name the manager does not hold gets no units."""
from __future__ import annotations

from pathlib import Path

import pytest

from elasticslice.rpc.pki import make_ca
from troy import State
from troy.frameworks.dask.tls import DaskTLS
from tests.helpers import holds_for, wait_for
from tests.elasticslice.pilots.helpers import Run, ran_on, sleepers
from tests.troy.frameworks.nodes import member, node_agent, stop

pytestmark = pytest.mark.slow


def test_a_stranger_worker_is_refused_and_a_hostile_one_with_a_valid_certificate_gets_no_units(
        emulator, make_cluster, witness, tmp_path: Path) -> None:
    """One cluster, one attacker after the other (they were two tests, each with a cluster
    of its own): a worker without a certificate of the cluster CA, under a held node's name,
    never joins; then a worker with a valid certificate for a node the manager does not
    hold joins the scheduler and gets no unit."""
    cluster = make_cluster(emulator, maxthreshold=1, idle_timeout=None)
    wait_for(lambda: len(cluster.pilots()) == 1, timeout=120, what="the initial node's pilot")

    # 1. a certificate from another CA, for the name of a node the manager holds
    log = tmp_path / "stranger.log"
    stranger = member(tmp_path / "stranger", make_ca("stranger CA", key_type="ec"), "node-1")
    agent = node_agent(cluster.framework.scheduler_address, 8, stranger, log)
    try:
        wait_for(lambda: b"Waiting to connect" in log.read_bytes(), timeout=60,
                 what="the stranger trying to connect")
        def never_in() -> None:
            assert len(cluster.framework.workers_info()) == 1 and agent.poll() is None
            assert len(cluster.pilots()) == 1
        holds_for(never_in, 3.0)  # about 3 s of its retries
    finally:
        stop(agent)

    # 2. a valid certificate; node-x is not ours
    cert, key = cluster.ca.issue("node-x")
    hostile = DaskTLS(str(cluster.ca.ca_file), str(cert), str(key))
    agent = node_agent(cluster.framework.scheduler_address, 8, hostile, tmp_path / "x.log")
    try:
        wait_for(lambda: len(cluster.framework.workers_info()) == 2, timeout=60,
                 what="the hostile worker to join the scheduler")  # so the test can fail
        run = Run(cluster, sleepers(witness, 6, 0.5, cores=4))  # 24 cores, 8 ours
        assert run.wait() is State.DONE
        assert cluster.framework.find_pilot("node-x") is None
        assert len(cluster.pilots()) == 1
        ran = ran_on(witness)
        assert len(ran) == 6 and all(lines == ["node-1"] for lines in ran.values()), ran
    finally:
        stop(agent)
