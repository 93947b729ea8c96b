"""``CloudLabCluster``: Dask's idiom over the elastic slice. Fast: its arguments and the
demand-source arithmetic. Slow: one cluster lifetime against the box with real workers on
emulated nodes (one boot of the box for all of it: adapt grows it for client.map and for a
dask.array reduction, a revoked busy node is retired by Dask and goes back early, idle it
shrinks to the minimum without flapping, scale(3) holds, the dashboard answers, close()
gives the nodes back)."""
from __future__ import annotations

import dataclasses
import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from elasticslice.dask import CloudLabCluster
from elasticslice.managers.policy import PolicyConfig, wanted_nodes
from elasticslice.pilots.watch import extra_demand
from troy.frameworks.dask.framework import scheduler_workers
from tests.elasticslice.gates import gated
from tests.elasticslice.managers.helpers import FAST_INTERVALS, FAST_POLICY, admin, \
    reclaim_outcome
from tests.elasticslice.pilots.helpers import Witness, pilot_image
from tests.helpers import wait_for
from tests.hostile.netstat import listening, reachable_from_outside
from tests.screenshots import Page, browser, has_colour

#: the dashboard's "Tasks Processing" bars
PROCESSING_BLUE = "#0000ff"


# ---------------------------------------------------------------- fast: arguments ----------
@pytest.mark.parametrize("options, message", [
    ({"minimum": 0}, "minimum: expected an integer >= 1, got 0"),
    ({"maximum": "4"}, "maximum: expected an integer >= 1, got '4'"),
    ({"minimum": 3, "maximum": 2}, "minimum 3 is more than maximum 2"),
    ({"cores": 0}, "cores: expected an integer >= 1, got 0"),
    ({"memory": "lots"}, "memory: expected bytes or a size such as '64 GiB', got 'lots'"),
    ({"security": False}, "security: the scheduler speaks TLS only"),
    ({"image": "a", "disk_image": "b"}, "give image or disk_image, not both"),
    ({"maxthreshold": 3}, "maxthreshold: give it as maximum instead"),
])
def test_bad_arguments_are_one_clear_line_before_anything_starts(options: dict[str, Any],
                                                                   message: str) -> None:
    with pytest.raises(ValueError, match="^CloudLabCluster: ") as err:
        CloudLabCluster(**options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_config_comes_from_elasticslice_config_as_on_the_command_line(
        tmp_path: Path, monkeypatch) -> None:
    from elasticslice.dask import open_server
    from elasticslice.errors import ConfigError
    missing = tmp_path / "nowhere.conf"
    monkeypatch.setenv("ELASTICSLICE_CONFIG", str(missing))
    with pytest.raises(ConfigError, match="config file not found") as err:
        open_server(None)
    assert str(missing) in str(err.value)


def test_memory_is_recorded_in_bytes() -> None:
    from elasticslice.dask import _memory
    assert _memory("2 GiB") == 2 * 2**30 and _memory(1000) == 1000 and _memory(None) is None


def test_extra_demand_sums_cores_and_nodes_each_in_its_unit() -> None:
    assert extra_demand([]) == (0, 0.0)
    assert extra_demand([(3, "cores"), (2, "nodes")]) == (3, 2.0)
    assert extra_demand([(2.5, "cores"), (1.2, "nodes"), (1, "nodes")]) == (3, 2.2)
    # nothing asked, or a source with no opinion: nothing
    assert extra_demand([(0, "nodes"), (None, "cores"), (-2, "nodes")]) == (0, 0.0)


def test_dask_s_target_in_nodes_is_nodes_before_any_node_told_its_size() -> None:
    """Broke: before a node joined, a target of 4 nodes counted 4 cores of an unknown node
    size, and the policy asked for minthreshold (1) nodes, then 3 more once the first told
    its size. Nodes are summed in nodes, in the policy."""
    config = PolicyConfig(minthreshold=1, maxthreshold=8)
    assert wanted_nodes(config, cores=0, extra_nodes=4) == 4
    assert wanted_nodes(config, cores=0, extra_nodes=4, cores_per_node=16) == 4
    assert wanted_nodes(config, cores=20, cores_per_node=8, extra_nodes=1.5) == 3 + 2
    assert wanted_nodes(config, cores=5, extra_nodes=2) == 2   # unknown size: at least 1
    assert wanted_nodes(config, cores=None) is None             # no opinion at all


# ---------------------------------------------------------------- slow: the box ------------

SLACK = 0.5   # seconds from a decision to its call beginning (the cycle's thread)


def direction_changes(steps: list[tuple[float, int]]) -> list[float]:
    """When the node count's direction changed, from (time, +1/-1) steps in time order."""
    out, last = [], 0
    for at, step in steps:
        if last and step != last:
            out.append(at)
        last = step
    return out


def test_direction_changes_are_counted_where_the_count_turns() -> None:
    assert direction_changes([(1, 1), (2, 1), (3, -1), (4, -1), (5, 1)]) == [3, 5]
    assert direction_changes([(1, -1)]) == []


class OpenedHere:
    """The files this process opens while started (an audit hook: it stays, idle, after)."""

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.on = False

    def start(self) -> OpenedHere:
        import sys

        def hook(event: str, args: tuple) -> None:
            if self.on and event == "open" and args and isinstance(args[0], (str, bytes)):
                self.paths.add(os.path.abspath(os.fsdecode(args[0])))
        sys.addaudithook(hook)
        self.on = True
        return self

    def stop(self) -> None:
        self.on = False


def revoke_a_busy_added_node(client: Any, cluster: CloudLabCluster, emulator: Any,
                             initial: str) -> str:
    """Revoke (as CloudLab's admin) an added node whose Dask worker runs a task now; its
    node_id once the reclamation ended."""
    def busy_added() -> str | None:
        names = {w: i["name"] for w, i in scheduler_workers(client).items()}
        for addr, keys in client.processing().items():
            if keys and names.get(addr) not in (None, initial):
                return str(names[addr])
        return None
    name = str(wait_for(busy_added, timeout=120, what="a busy added node"))
    assert cluster.nodes() > 1                      # grown past one node
    manager = cluster.manager   # the daemon's state, read-only
    [node_id] = [r.node_id for r in manager.state.nodes() if r.client_id == name]
    admin(emulator).call("Revoke", nodes=[node_id])
    wait_for(lambda: reclaim_outcome(emulator, node_id), timeout=60,
             what="the reclamation to end")
    return node_id


@pytest.mark.slow
def test_a_dask_user_gets_cloudlab_elastically(emulator_factory, tmp_path: Path,
                                               monkeypatch) -> None:
    """One cluster's life as a Dask user lives it: adapt grows it for client.map and for a
    dask.array reduction, a node revoked mid-computation is retired by Dask and goes back
    early with the right results, idle it shrinks to the minimum although the client keeps
    its results (broke: Dask's target never let a worker holding data go), scale(3) holds
    3 nodes, the dashboard answers, close() gives the nodes back."""
    import dask.array as da
    import numpy as np
    from dask.distributed import Client
    emulator = emulator_factory(max_wait=30, notify_interval=0.3)
    monkeypatch.setenv("ELASTICSLICE_CREDENTIAL_CACHE_DIR", str(tmp_path / "cache"))
    witness = Witness(emulator.control_address)
    opened = OpenedHere().start()   # what this process (the Dask user's) opens
    cooldown = 3.0
    policy = dataclasses.replace(FAST_POLICY, add_cooldown=cooldown, delete_cooldown=cooldown,
                                 max_delete_per_cycle=1)
    cluster = CloudLabCluster(config=emulator.config_path, state_dir=tmp_path / "dask",
                              maximum=4, disk_image=pilot_image(emulator),
                              node_python="python3", intervals=FAST_INTERVALS, margin=1.0,
                              policy=policy, idle_timeout=1.0)

    try:
        with Client(cluster) as client:
            cluster.adapt(minimum=1, maximum=4, target_duration="1s")
            manager = cluster.manager
            # the slice's first node (the manager's first cycle makes the slice, after start)
            initial = wait_for(manager.state.nodes, timeout=120,
                               what="the slice's first node")[0].client_id  # type: ignore[index]
            revoked = []

            # client.map of 64 tasks
            gate = witness.gate("map")
            squares = client.map(lambda i, url=gate.url, ran=witness.url: gated(
                i * i, url, f"{ran}/ran/{i}"), range(64))
            revoked.append(revoke_a_busy_added_node(client, cluster, emulator, initial))
            gate.open()
            assert client.gather(squares) == [i * i for i in range(64)]

            # a dask.array reduction: 64 blocks of ones, doubled on the nodes, summed
            gate = witness.gate("array")
            blocks = da.ones((64, 1000), chunks=(1, 1000)).map_blocks(
                lambda b, url=gate.url: gated(b * 2, url), meta=np.empty((0, 0)))
            total = client.compute(blocks.sum())
            revoked.append(revoke_a_busy_added_node(client, cluster, emulator, initial))
            if browser():   # what the user watches meanwhile (docs/dask-dashboard.png)
                with Page(cluster.dashboard_link) as page:
                    wait_for(lambda: page.evaluate("window.Bokeh ? Bokeh.documents.length "
                                                   ": 0"), 60, what="the dashboard's plots")
                    shot = tmp_path / "dask-dashboard.png"
                    wait_for(lambda: has_colour(page.screenshot(shot), PROCESSING_BLUE),
                             30, what="the dashboard showing the tasks processing")
            gate.open()
            assert total.result() == 2 * 64 * 1000
            assert [reclaim_outcome(emulator, n) for n in revoked] == ["early", "early"]

            # idle (the client still holds its results): back to the minimum, each node
            # given back once its worker retired, the results only it held moved to the
            # others first: none is computed again (broke: the manager daemon gave the
            # node back while Dask still copied)
            runs = witness.ran()
            wait_for(lambda: cluster.nodes() == 1 and len(scheduler_workers(client))
                     == 1, timeout=120, what="back to one node")
            assert sorted(client.gather(squares))[-1] == 63 * 63  # its data moved, kept
            assert witness.ran() == runs

            # a loaded machine's bokeh may take its time to render the page
            with urllib.request.urlopen(cluster.dashboard_link, timeout=60) as page:
                assert page.status == 200
            # the dashboard (no authentication of its own) is on loopback only, as is
            # everything this process and its children listen on: a stranger on another
            # address of this machine finds nothing
            dash = urllib.parse.urlsplit(cluster.dashboard_link)
            here = listening(os.getpid(), children=True)
            assert ("127.0.0.1", dash.port) in here
            assert reachable_from_outside({ip for ip, _ in here}) == set(), here
            logs = cluster.get_logs(workers=False)
            assert "Scheduler" in logs and "Manager" in logs

            # scale(3): three nodes, held while idle
            cluster.scale(3)
            wait_for(lambda: len(scheduler_workers(client)) == 3, timeout=120,
                     what="three workers")
            def delete_rounds() -> int:
                return manager.state.cycle_log.records()["delete_nodes"].runs
            runs = delete_rounds()
            wait_for(lambda: delete_rounds() >= runs + 20,
                     timeout=60, what="twenty more delete_nodes rounds")
            assert cluster.nodes() == 3 and len(scheduler_workers(client)) == 3
        stats = manager.stats()
        assert (stats["revocations"], stats["early_releases"], stats["forced_releases"]) == \
            (2, 2, 0)
        # the policy's own steps (the revocations are CloudLab's), as decided: at most one
        # direction change per cooldown. Read from the intent log (an AddNodes or a
        # DeleteNodes begins right after its decision), not from the nodes' added_at and
        # gone_at, which come after the CM's call: a DeleteNodes slow under load made a
        # delete look 3 s later than it was decided. SLACK: the release job starts on the
        # cycle's thread a moment after the decision that asked for it.
        client_of = {r.node_id: r.client_id for r in manager.state.nodes(include_gone=True)}
        early = {client_of.get(n) for n in revoked}
        steps = sorted((i.created, 1 if i.kind == "add" else -1)
                       for i in manager.state.intents() for c in i.client_ids
                       if i.kind == "add" or c not in early)
        changes = direction_changes(steps)
        assert all(b - a >= cooldown - SLACK for a, b in zip(changes, changes[1:])), steps
    finally:
        cluster.close()
        opened.stop()
        witness.close()
    status = admin(emulator).call("Status")      # close() gave the nodes back
    assert status["slivers"] == [] and sum(row["slice"] for row in status["pool"].values()) == 0
    # the user's process, whose Dask client unpickles what workers send, never opened the
    # CloudLab key, its passphrase or the cluster CA's key: the manager daemon did
    emu = Path(emulator.config_path).parent
    secrets = {str(emu / "user.pem"), str(emu / "password"),
               str((tmp_path / "dask" / "pki" / "ca.key").resolve())}
    assert not secrets & opened.paths, sorted(secrets & opened.paths)
    assert any(p.endswith("scheduler-tls.json") for p in opened.paths)   # it saw opens
