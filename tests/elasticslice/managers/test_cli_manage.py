"""`elasticslice manage [--once]` and `status [--json]`, in process and as real processes."""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.managers.state import ManagerState
from tests.helpers import REPO, process_alive, wait_for
from tests.elasticslice.managers.helpers import (cm_nodes, manager_config, managing)

FAST_CLIENT = {"ELASTICSLICE_RETRIES": "40", "ELASTICSLICE_RETRY_DELAY": "0.01",
               "ELASTICSLICE_RETRY_MAX_DELAY": "0.05", "ELASTICSLICE_TIMEOUT": "4"}


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_manage_once_runs_one_full_cycle_and_status_json_shows_it(
        emulator, tmp_path: Path) -> None:
    conf = manager_config(emulator, tmp_path)
    result = run("--config", str(conf), "manage", "--once")
    assert result.exit_code == 0, result.output
    assert sorted(cm_nodes(emulator, tmp_path)) == ["node-1", "node-2", "node-3"]
    result = run("--config", str(conf), "status", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"slice", "nodes", "to_release", "cycle", "sites"}
    assert data["to_release"] == []
    assert data["slice"]["urn"].endswith("+slice+" + "elastic") or data["slice"]["urn"]
    assert data["slice"]["expires"] and data["slice"]["slivers"][0]["expires"]
    assert sorted(n["client_id"] for n in data["nodes"]) == ["node-1", "node-2", "node-3"]
    node = data["nodes"][0]
    assert set(node) >= {"client_id", "node_id", "hostname", "state", "value",
                         "pending_delete"}
    assert set(data["cycle"]) == {
        "ensure_slice", "ensure_sliver", "update_sliver_status", "renew", "update_all",
        "update_available", "get_system_state", "add_nodes", "delete_nodes", "release_nodes",
        "set_system_state"}
    assert all(c["last_run"] and c["last_error"] is None for c in data["cycle"].values())
    text = run("--config", str(conf), "status")
    assert text.exit_code == 0 and "node-3" in text.output and "add_nodes" in text.output
    assert "to give back" not in text.output
    # a node asked to go back that the manager (stopped here) has not given back yet
    state = ManagerState.open(tmp_path / "state")
    node = next(n for n in state.nodes() if n.client_id == "node-3")
    state.to_release.ask(node.cm, "node-3", node_id=node.node_id, source="policy",
                         reason="idle 60 s", now=1_800_000_000.0)
    state.close()
    data = json.loads(run("--config", str(conf), "status", "--json").output)
    assert data["to_release"] == [{"cm": node.cm, "client_id": "node-3",
                                   "node_id": node.node_id, "source": "policy",
                                   "reason": "idle 60 s", "asked": "2027-01-15T08:00:00Z"}]
    text = run("--config", str(conf), "status").output
    assert "to give back 1" in text and "node-3" in text and "(policy): idle 60 s" in text


def test_status_without_state_is_one_line(emulator, tmp_path: Path) -> None:
    conf = manager_config(emulator, tmp_path)
    result = run("--config", str(conf), "status")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "no manager state" in result.output


def test_bad_manager_value_is_one_line_naming_key_and_file(emulator, tmp_path: Path) -> None:
    conf = manager_config(emulator, tmp_path, manager="minthreshold = lots\n")
    result = run("--config", str(conf), "manage", "--once")
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert "minthreshold" in result.output and str(conf) in result.output
    assert "Traceback" not in result.output


def _terminate(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, as systemd stops it: a clean exit, status 0."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def _alive(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is not None:
        pytest.fail(f"manage exited {proc.returncode}: {log.read_text()[-2000:]}")


def _open_intents(state_dir: Path) -> list[Any]:
    if not (state_dir / "manager.db").exists():
        return []
    try:
        state = ManagerState.read_only(state_dir)
    except Exception:  # created but not initialised yet
        return []
    try:
        return state.open_intents()
    except Exception:
        return []
    finally:
        state.close()


def _live_nodes(state_dir: Path) -> list[str]:
    state = ManagerState.read_only(state_dir)
    try:
        return sorted(n.client_id for n in state.nodes())
    finally:
        state.close()


def test_sigkill_mid_addnodes_then_restart_has_the_right_nodes_and_no_duplicates(
        emulator_factory, tmp_path: Path) -> None:
    # Every call is slowed, refused (BUSY) or unavailable (503): AddNodes takes time,
    # and a manager that rides the storm out still has to get everything right.
    emulator = emulator_factory(fault_rate=1.0, seed=4, slow_seconds=0.4,
                                boot_failure_rate=0.0)
    conf = manager_config(emulator, tmp_path,
                          manager="maxthreshold = 5\nmax_add_per_cycle = 2\n")
    state_dir = tmp_path / "state"
    log = tmp_path / "manage.log"
    with managing(conf, log, **FAST_CLIENT) as proc:
        def in_flight() -> list[Any]:
            _alive(proc, log)
            return _open_intents(state_dir)
        intents = wait_for(in_flight, timeout=120, interval=0.01, what="an AddNodes in flight")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert intents[0].kind == "add"
    # Restarted at once: the CM may still carry out the (slowed) call it was given, as
    # CloudLab may; the manager waits out the call timeout before adding again.
    with managing(conf, log, **FAST_CLIENT) as proc:
        def settled() -> bool:
            _alive(proc, log)
            if _open_intents(state_dir):
                return False
            held = cm_nodes(emulator, tmp_path)
            return len(held) == 5 and _live_nodes(state_dir) == sorted(held)
        wait_for(settled, timeout=180, interval=0.5, what="5 nodes, recorded, no intent open")
        _terminate(proc, log)
    held = cm_nodes(emulator, tmp_path)
    assert len(held) == len(set(held)) == 5
    assert _live_nodes(state_dir) == sorted(held)
    assert "Traceback" not in log.read_text()


def test_sigterm_stops_cleanly_and_removes_the_endpoint(emulator, tmp_path: Path) -> None:
    conf = manager_config(emulator, tmp_path, endpoint="enabled = true\n")
    log = tmp_path / "manage.log"
    store = emulator.server.ctx.store
    with managing(conf, log) as proc:
        wait_for(lambda: _alive(proc, log) or store.all_endpoints(), timeout=120, what="the endpoint registered")
        wait_for(lambda: len(cm_nodes(emulator, tmp_path)) == 3, timeout=120, what="3 nodes")
        # status reads the state while the daemon runs; a second manager is refused.
        wait_for(lambda: len(json.loads(run("--config", str(conf), "status", "--json")
                                        .output)["nodes"]) == 3, what="status: 3 nodes")
        second = run("--config", str(conf), "manage", "--once")
        assert second.exit_code == 1 and second.output.count("\n") == 1
        assert f"another manager (pid {proc.pid})" in second.output
        _terminate(proc, log)
    assert not process_alive(proc.pid)
    assert store.all_endpoints() == []
    assert "removed the endpoint" in log.read_text()
    assert _live_nodes(tmp_path / "state") == ["node-1", "node-2", "node-3"]


def test_the_systemd_unit_runs_manage_and_restarts_on_failure(tmp_path: Path) -> None:
    import configparser
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(REPO / "etc" / "elasticslice.service")
    service = unit["Service"]
    command = service["ExecStart"].split()
    assert command[-1] == "manage" and "--config" in command
    assert service["Restart"] == "on-failure" and service["KillSignal"] == "SIGTERM"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    # The command line it runs exists.
    result = run("manage", "--help")
    assert result.exit_code == 0 and "--once" in result.output


def test_the_code_blocks_of_docs_manager_md_run(emulator, tmp_path: Path,
                                                monkeypatch) -> None:
    import re

    from elasticslice.managers.config import load_manager_config
    text = (REPO / "docs" / "manager.md").read_text(encoding="utf-8")
    # The INI block is a valid [manager]/[endpoint] configuration.
    (ini,) = re.findall(r"```ini\n(.*?)```", text, flags=re.S)
    conf = tmp_path / "doc.conf"
    conf.write_text(emulator.config_path.read_text() + "\n" + ini)
    monkeypatch.setenv("HOME", str(tmp_path))
    mcfg = load_manager_config(conf, env={})
    assert mcfg.maxthreshold == 10 and mcfg.intervals["add_nodes"] == 300
    assert mcfg.tarballs == (("https://example.org/exp.tar.gz", "/"),)
    # The status example has the shape `status --json` prints.
    (doc,) = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    from elasticslice.commands.manage import status_data
    empty = ManagerState.in_memory()
    try:
        assert set(json.loads(doc)) == set(status_data(empty)) == {
            "slice", "nodes", "to_release", "cycle", "sites"}
    finally:
        empty.close()
    # The python blocks run.
    namespace: dict[str, Any] = {"__name__": "docs_manager"}
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        exec(compile(block, "docs/manager.md", "exec"), namespace)  # noqa: S102
    # The shell lines name commands that exist.
    for line in re.findall(r"```sh\n(.*?)```", text, flags=re.S)[0].splitlines():
        words = line.split("#")[0].split()
        assert run(*[w for w in words[1:] if not w.startswith("~")
                     and w != "--config"], "--help").exit_code == 0
