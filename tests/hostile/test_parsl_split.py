"""``CloudLabProvider`` split by trust, tried the way an attacker and a crash would.

Parsl's DataFlowKernel unpickles what the nodes' worker pools send (results and exceptions
are pickles in Parsl's model), so the user's process is where a task on a node can make code
run. The provider keeps the CloudLab credentials and the CA's key out of it: its manager
daemon, another process, opens them alone, never loads Parsl, ZeroMQ or a pickler, holds no
connection to the interchange, and runs nothing a node or a stranger sends it. A SIGKILL of
that daemon while a revoked node drains costs no task, the new daemon finishes the drain
(the node still goes back early) and no node is left. A real Parsl workflow in a process of
its own (an audit hook logs what each process opens), against a real box.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.elasticslice.helpers import nodes_in_slices
from tests.elasticslice.managers.helpers import admin, reclaim_outcome
from tests.elasticslice.pilots.helpers import Witness, pilot_image
from tests.elasticslice.pilots.test_split import (opened_by, pickle_every_door, run_env,
                                                  tcp_sockets)
from tests.helpers import process_alive, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: the user's program: a Parsl workflow on a provider of the box; it writes what the test
#: needs to know (the interchange's ports) once the block runs its first tasks, and the
#: results at the end
WORKFLOW = textwrap.dedent('''
    import json, os, sys, time
    import parsl
    from parsl import python_app
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from elasticslice.parsl import CloudLabProvider
    from tests.elasticslice.managers.helpers import FAST_INTERVALS
    from tests.elasticslice.parslbox import apps

    config_path, state_dir, image, gate, out = sys.argv[1:6]
    provider = CloudLabProvider(config=config_path, state_dir=state_dir, init_blocks=1,
                                max_blocks=2, disk_image=image, node_python="python3",
                                margin=1.0, status_polling_interval=0.5,
                                intervals={**FAST_INTERVALS, "renew": 600.0})
    executor = HighThroughputExecutor(
        label="cloudlab", address=provider.address, provider=provider,
        max_workers_per_node=2, poll_period=100, heartbeat_period=2,
        heartbeat_threshold=120, interchange_launch_cmd=provider.interchange_launch_cmd)
    config = Config(executors=[executor], retries=2, strategy_period=0.5,
                    run_dir=state_dir + "-runinfo")
    square = python_app(apps()[0])
    with parsl.load(config):
        futures = [square(i, gate) for i in range(4)]
        while sum(m["tasks"] for m in executor.connected_managers()) < 2:
            time.sleep(0.2)   # the first block's node runs two; two wait
        busy = {str(m["block_id"]) for m in executor.connected_managers() if m["tasks"]}
        nodes = [n for b in provider.book.blocks.values() if b.block_id in busy
                 for n in b.nodes]
        with open(out + ".running.part", "w") as f:   # whole, once the test sees it
            json.dump({"ports": [executor.worker_port], "busy": nodes}, f)
        os.replace(out + ".running.part", out + ".running")
        results = [f.result(timeout=600) for f in futures]
    provider.close()
    with open(out, "w") as f:
        json.dump({"results": results, "stats": provider.stats()}, f)
''')


def test_the_provider_s_credentials_are_its_daemon_s_alone_and_a_daemon_killed_costs_nothing(
        emulator_factory: Any, tmp_path: Path) -> None:
    emulator = emulator_factory(max_wait=120, notify_interval=0.3)
    env = run_env(tmp_path, audit=True)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT)])
    script, out, state_dir = tmp_path / "workflow.py", tmp_path / "out.json", tmp_path / "p"
    script.write_text(WORKFLOW)
    witness = Witness(emulator.control_address)
    gate = witness.gate()
    marker = tmp_path / "pickle-ran"
    user = subprocess.Popen(
        [sys.executable, str(script), str(emulator.config_path), str(state_dir),
         pilot_image(emulator), gate.url, str(out)], env=env, cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "stderr.log", "w"))
    daemons = []
    try:
        running = Path(f"{out}.running")
        wait_for(lambda: running.exists() or user.poll() is not None, 300,
                 what="the block running two tasks")
        assert user.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
        told = json.loads(running.read_text())
        interchange = set(told["ports"])
        daemon = int((state_dir / "state" / "manage.lock").read_text())
        daemons.append(daemon)
        assert daemon != user.pid and process_alive(daemon)
        sockets = tcp_sockets(daemon)
        # the daemon holds no connection to (nor listener of) Parsl's interchange
        assert interchange and all(not {local, remote} & interchange
                                   for local, remote, _ in sockets), (interchange, sockets)
        # what a node or a stranger reaches of the daemon: its channel (a pickle is no hello;
        # a second provider is refused anyway) and every port it listens on
        pickle_every_door(state_dir, sockets, emulator.control_address, marker)
        # CloudLab wants a busy node back; while its block drains (its tasks held on the
        # gate), the daemon dies: the provider starts another, which finishes the drain
        node = next(r for r in _held(state_dir) if r.client_id == told["busy"][0])
        admin(emulator).call("Revoke", nodes=[node.node_id])
        log = state_dir / "daemon.log"
        wait_for(lambda: "draining" in log.read_text(), 60, what="the block draining")
        os.kill(daemon, signal.SIGKILL)
        wait_for(lambda: _serving(state_dir) not in (None, daemon), 120,
                 what="a new manager daemon")
        daemons.append(_serving(state_dir))
        wait_for(lambda: "drains start again" in log.read_text(), 60,
                 what="the new daemon resuming the drain")
        assert user.poll() is None and reclaim_outcome(emulator, node.node_id) is None
        gate.open()
        wait_for(lambda: reclaim_outcome(emulator, node.node_id), 120,
                 what="the reclamation to end")
        user.wait(timeout=600)
    finally:
        if user.poll() is None:
            user.kill()
            user.wait()
        witness.close()
        if user.returncode != 0:   # a daemon waiting for a provider that is not coming back
            for pid in daemons:    # would keep the nodes until its own timeout
                if pid is not None and process_alive(pid):
                    os.kill(pid, signal.SIGTERM)
    assert user.returncode == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    done = json.loads(out.read_text())
    assert [r[0] for r in done["results"]] == [i * i for i in range(4)]
    # the revoked node ran the tasks it held (Parsl retries none: none was lost) and went
    # back early
    assert reclaim_outcome(emulator, node.node_id) == "early"
    assert node.client_id in [r[1] for r in done["results"]], done["results"]
    assert (done["stats"]["revocations"], done["stats"]["early_releases"]) == (1, 1), done
    assert not marker.exists(), marker.read_text()
    wait_for(lambda: not any(process_alive(p) for p in daemons), 60,
             what="the daemons to end with the provider")
    assert nodes_in_slices(emulator) == 0   # the slice went back: no node left
    # who opened what: the CloudLab key and passphrase, the CA's key
    emu = Path(emulator.config_path).parent
    secrets = {str(emu / "user.pem"), str(emu / "password"), str(state_dir / "pki" / "ca.key")}
    theirs = set().union(*(opened_by(tmp_path, p) for p in daemons))
    mine = set(opened_by(tmp_path, user.pid))
    assert secrets <= set(opened_by(tmp_path, daemons[0])), sorted(secrets - theirs)
    assert not secrets & mine, sorted(secrets & mine)
    # the daemons never loaded Parsl, ZeroMQ or a pickler of Parsl's: they cannot decode
    # what a worker pool sends
    foreign = [p for p in theirs if "elasticslice/parsl/" not in p and any(
        part in p for part in ("/parsl/", "/zmq/", "/dill/", "/cloudpickle/"))]
    assert not foreign, sorted(foreign)[:20]
    assert any("/site-packages/parsl/" in p for p in mine)   # the audit hook sees imports


def _held(state_dir: Path) -> list[Any]:
    """The nodes the provider's daemon holds (its state, read-only)."""
    from elasticslice.managers.state import ManagerState
    state = ManagerState.read_only(state_dir / "state")
    try:
        return [r for r in state.nodes() if r.gone_at is None]
    finally:
        state.close()


def _serving(state_dir: Path) -> int | None:
    """The pid of the daemon holding the state directory's lock (None: none, or dead)."""
    try:
        pid = int((state_dir / "state" / "manage.lock").read_text())
    except (OSError, ValueError):
        return None
    return pid if process_alive(pid) else None
