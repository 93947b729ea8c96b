"""Helpers for the tests of ``elasticslice run`` as a user runs it (a real subprocess
against a real emulator whose nodes start real agents): the command, what the run's Troy
store and manager state say, what the emulator's CM holds, the run's agents."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from elasticslice.emulator.adminclient import AdminClient
from elasticslice.managers.state import ManagerState
from tests.elasticslice.emulator.helpers import processes_with
from tests.helpers import WORKFLOWS, wait_for

FORKJOIN = WORKFLOWS / "helloworld-forkjoin-10-chameleon.json"   # 10 tasks of ~100 s
AGENT = "troy.frameworks.dask node"
RUN_TIMEOUT = 300


def pilot_image_config(emulator: Any, tmp: Path) -> Path:
    """The emulator's config with the lines it comments out taken in: pilot nodes boot the
    box's pilot image, which has the agent (``node_python``), instead of building it."""
    text = Path(emulator.config_path).read_text()
    path = tmp / "pilot-image.conf"
    path.write_text(text.replace("#   disk_image", "disk_image")
                    .replace("#   node_python", "node_python"))
    return path


def elasticslice(emulator: Any, tmp: Path, *args: str, stderr: Any = None,
                 stdout: Any = subprocess.PIPE, stock: bool = False) -> subprocess.Popen:
    """``elasticslice -c EMULATOR'S-CONFIG ARGS`` as a subprocess (text, no stdin). The
    nodes boot the box's pilot image, quick for the tests of what a run does once its pilots
    joined; ``stock``: the stock image, as the box's config says (nodes build the agent's
    environment, tests/elasticslice/pilots/test_secrets.py and the demo's tests)."""
    env = {**os.environ, "ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp / "cred-cache")}
    config = emulator.config_path if stock else pilot_image_config(emulator, tmp)
    return subprocess.Popen([sys.executable, "-m", "elasticslice.cli", "-c",
                             str(config), *args], env=env, stdout=stdout,
                            stderr=stderr if stderr is not None else subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)


def run_workflow(emulator: Any, tmp: Path, workflow: Path, state_dir: Path, log: Path,
                 *extra: str, stock: bool = False) -> subprocess.Popen:
    """``elasticslice run WORKFLOW --state-dir DIR`` (time scale 0.03, 2 nodes at most),
    its stderr appended to ``log``."""
    return elasticslice(emulator, tmp, "run", str(workflow), "--state-dir", str(state_dir),
                        "--time-scale", "0.03", "--max-nodes", "2", *extra,
                        stderr=open(log, "a"), stock=stock)


def run_forkjoin(emulator: Any, tmp: Path, state_dir: Path, log: Path,
                 *extra: str) -> subprocess.Popen:
    return run_workflow(emulator, tmp, FORKJOIN, state_dir, log, *extra)


def sleepers_workflow(path: Path, count: int, seconds: int = 600) -> Path:
    """A Troy JSON workflow of ``count`` one-core tasks that sleep ``seconds``: a run of it
    is still going whenever the test stops it."""
    path.write_text(json.dumps({"tasks": [
        {"id": f"sleep-{i}", "executable": "/bin/sleep", "arguments": [str(seconds)]}
        for i in range(count)]}))
    return path


def units(state_dir: Path) -> dict[str, tuple[str, float | None]]:
    """unit id -> (state, start) as the Troy store of the run says."""
    try:
        with sqlite3.connect(f"file:{state_dir / 'troy.db'}?mode=ro", uri=True,
                             timeout=5) as db:
            return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, state, start FROM units")}
    except sqlite3.Error:   # not made yet
        return {}


def unit_states(state_dir: Path) -> list[str]:
    return [s for s, _ in units(state_dir).values()]


def nodes_in_slices(emulator: Any) -> int:
    """How many nodes of the emulator's pool some slice holds."""
    pool = AdminClient(emulator.dir).call("Status")["pool"]
    return sum(row.get("slice", 0) for row in pool.values())


def tracked(state_dir: Path) -> list[str]:
    """The node_ids the run's manager holds, from its state."""
    state = ManagerState.read_only(state_dir / "state")
    try:
        return sorted(r.node_id for r in state.nodes())
    finally:
        state.close()


def ever_held(state_dir: Path) -> list[str]:
    """The client_ids the run's manager ever held (given back ones too), from its state."""
    state = ManagerState.read_only(state_dir / "state")
    try:
        return sorted(r.client_id for r in state.nodes(include_gone=True))
    finally:
        state.close()


def run_agents(state_dir: Path) -> list[int]:
    """The pids of the node agents of the run in ``state_dir`` (those of its scheduler)."""
    cluster = json.loads((state_dir / "cluster.json").read_text())
    return sorted(processes_with(f"{AGENT} {cluster['scheduler']} "))


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT,
         timeout: float = 120) -> str:
    """Send ``sig`` to the run and wait for it; its stdout."""
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=timeout)
    return out


def a_unit_running_since(state_dir: Path, since: float) -> bool:
    return any(s == "RUNNING" and (start or 0) > since for s, start in units(state_dir).values())


def wait_running_on_nodes(state_dir: Path, count: int) -> None:
    """Until ``count`` units run and the manager holds at least one node."""
    wait_for(lambda: unit_states(state_dir).count("RUNNING") >= count
             and (state_dir / "state" / "manager.db").exists() and tracked(state_dir),
             RUN_TIMEOUT, 0.2, what=f"{count} unit(s) running on nodes")
