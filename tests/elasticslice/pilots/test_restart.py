"""``ElasticCluster`` on a state dir that held a cluster before: a closed one (its nodes given
back) may move to another port; a crashed one must come back on its own port (its agents
rejoin there) or say why it cannot, in one line."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots import ElasticCluster
from elasticslice.pilots.restart import ClusterFile
from tests.elasticslice.managers.helpers import FAST_INTERVALS, client_for
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


def hold_port(host: str, port: int) -> socket.socket:
    """Listen on ``host:port``, as another program would: once the port's last user has
    closed it (a closed cluster's scheduler process may take a moment to end; its
    connections' TIME_WAIT does not count, SO_REUSEADDR as servers set it)."""
    def bound() -> socket.socket | None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            s.close()
            return None
        s.listen()
        return s
    return wait_for(bound, timeout=30, what=f"port {port} free to hold")


def test_a_closed_cluster_restarts_on_another_port_when_its_own_is_taken(
        emulator: Any, make_cluster: Any, tmp_path: Path) -> None:
    first = make_cluster(emulator, maxthreshold=1)
    state_dir, address = first.state_dir, first.framework.scheduler_address
    first.close()                                       # nodes given back: closed
    assert ClusterFile.load(state_dir).closed
    taken = hold_port(emulator.control_address, ClusterFile.load(state_dir).port)
    again = ElasticCluster(client_for(emulator, tmp_path / "c2"), state_dir, maxthreshold=1,
                           intervals=FAST_INTERVALS)
    try:
        again.start()
        assert again.resumed and again.restarts == 1
        assert again.framework.scheduler_address != address
        saved = json.loads((state_dir / "cluster.json").read_text())
        assert saved["scheduler"] == again.framework.scheduler_address and not saved["closed"]
    finally:
        again.close()
        again.server.close()
        taken.close()


def test_a_crashed_cluster_whose_port_is_taken_says_so_in_one_line(
        emulator: Any, tmp_path: Path) -> None:
    here = emulator.control_address  # where the cluster listens (the box config's)
    taken = hold_port(here, 0)
    port = taken.getsockname()[1]
    state_dir = tmp_path / "cluster"
    state_dir.mkdir()
    ClusterFile(f"tls://{here}:{port}", 1).save(state_dir)   # its process was SIGKILLed
    cluster = ElasticCluster(client_for(emulator, tmp_path / "c"), state_dir)
    try:
        with pytest.raises(ElasticSliceError) as err:
            cluster.start()
    finally:
        cluster.close()
        cluster.server.close()
        taken.close()
    assert str(err.value).startswith(f"{state_dir.resolve()}: cannot serve the Dask scheduler "
                                     f"on port {port} again (the nodes' agents rejoin "
                                     f"tls://{here}:{port}): ")
    assert "\n" not in str(err.value)
