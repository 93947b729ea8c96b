"""Security, as an attacker tries it, against the running manager and emulator of the package:
a second user of the same CA and a stranger CA at the callback endpoint, what listens where,
what reaches the logs, who may read the files that hold secrets."""
from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import xmlrpc.client
from pathlib import Path

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.rpc.endpoint import ProtoGeniClientServerEndpoint
from tests.helpers import REPO, wait_for
from tests.elasticslice.rpc.endpointkit import Callers, post, serving
from tests.hostile.helpers import NODES, ManagedSlice, describe
from tests.hostile import netstat
from tests.hostile.netstat import listening, reachable_from_outside


def _notices(node_id: str) -> list[bytes]:
    item = {"node_id": node_id, "client_id": NODES[0], "max_wait_time": 0}
    return [xmlrpc.client.dumps(({"nodelist": [item]},), method).encode()
            for method in ("NotifyDeletePending", "NotifyDeleteComplete")]


def test_a_second_user_of_the_same_ca_cannot_take_the_managers_nodes(
        managed: ManagedSlice) -> None:
    d = managed.emulator.dir
    result = CliRunner().invoke(cli, ["emulator", "add-user", "--dir", str(d), "eve"])
    assert result.exit_code == 0, result.output
    pem, password = re.search(r"certificate and key: (\S+) \(passphrase in (\S+)\)",
                              result.output).groups()
    eve = ssl.create_default_context(cafile=str(d / "ca.pem"))
    eve.load_cert_chain(pem, password=Path(password).read_text().strip())
    node_id = next(n["node_id"] for n in managed.status()["nodes"]
                   if n["client_id"] == NODES[0])
    callers = Callers(d, managed.work)
    for who, ctx in [("eve", eve), ("the user", callers.user()),
                     ("a certificate without URN", callers.no_urn())]:
        for body in _notices(node_id):
            told = describe(*post(managed.port, ctx, body))
            assert told.startswith("code 3: only the CM"), (who, told)
    managed.assert_intact()


@pytest.mark.parametrize("who", ["stranger", "user_signed_cm", "anonymous"])
def test_a_stranger_never_gets_past_tls_to_the_managers_endpoint(
        managed: ManagedSlice, who: str) -> None:
    ctx = getattr(Callers(managed.emulator.dir, managed.work), who)()
    for body in _notices("pc-any"):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            post(managed.port, ctx, body)
    managed.assert_intact()


def test_the_manager_and_the_emulator_listen_where_only_this_machine_reaches(
        managed: ManagedSlice) -> None:
    manager = listening(managed.proc.pid, children=True)
    assert ("127.0.0.1", managed.port) in manager
    emulator = listening(os.getpid())
    assert ("127.0.0.1", managed.emulator.server.port) in emulator
    assert reachable_from_outside({a for a, _ in manager | emulator}) == set(), manager | emulator


def test_an_endpoint_address_set_in_the_config_is_where_it_listens(
        emulator_pki, monkeypatch: pytest.MonkeyPatch) -> None:
    # the check above can fail: listening elsewhere is seen (and only when configured)
    with serving(emulator_pki, ProtoGeniClientServerEndpoint(), host="0.0.0.0") as server:
        assert ("0.0.0.0", server.port) in listening(os.getpid())
    assert reachable_from_outside({"0.0.0.0", "127.0.0.1"}) == {"0.0.0.0"}
    # an address of the box's range that no box's firewall keeps to this machine (read
    # once: the parallel suite's boxes take any of the 64 control networks, 100.127.0.0/16
    # too, and let them go)
    rules = netstat._ruleset()
    monkeypatch.setattr(netstat, "_ruleset", lambda: rules)
    free = [f"100.{64 + k}.255.1" for k in range(63, -1, -1)
            if f"ip daddr 100.{64 + k}.0.0/16 iifname" not in rules]
    assert free and reachable_from_outside({free[0]}) == {free[0]}


def _secrets(d: Path) -> list[str]:
    """What must never be logged: the passphrase, every line of the private keys, and the
    signatures of the credentials the client cached."""
    found = [(d / "password").read_text().strip(), "PRIVATE KEY"]
    for pem in [*d.glob("*-key.pem"), d / "user.pem"]:
        text = pem.read_text()
        key = text[text.index("-----BEGIN"):] if "KEY-----" in text else text
        found += [line for line in key[key.index("KEY-----"):].splitlines()
                  if len(line) >= 40]
    for cached in (d / "credentials").rglob("*"):
        if cached.is_file():
            found += re.findall(r"<SignatureValue>\s*(\S{40})", cached.read_text())
    return found


def test_passphrases_keys_and_credentials_never_reach_the_debug_logs(
        managed: ManagedSlice) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICSLICE")}
    outputs = [managed.log.read_text()]
    for command in (["getversion"], ["sliver-status"], ["resolve"], ["discover"]):
        run = subprocess.run([sys.executable, "-m", "elasticslice.cli", "--debug", "--config",
                              str(managed.emulator.config_path), *command],
                             capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout + run.stderr)
    logs = "\n".join(outputs)
    assert "DEBUG" in logs and "SliverStatus" in logs  # they did log, at length
    secrets = _secrets(managed.emulator.dir)
    assert any("SignatureValue" in p.read_text() for p in
               (managed.emulator.dir / "credentials").rglob("*") if p.is_file())
    leaked = [s for s in secrets if s in logs]
    assert leaked == []


def test_files_holding_keys_passphrases_or_credentials_are_readable_by_the_owner_only(
        managed: ManagedSlice) -> None:
    d = managed.emulator.dir
    needles = [b"PRIVATE KEY", (d / "password").read_bytes().strip(), b"signed-credential"]
    exposed, holding = [], []
    for root in (d, managed.work):
        for path in root.rglob("*"):
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            if any(needle in data for needle in needles):
                holding.append(path)
                if path.stat().st_mode & 0o077:
                    exposed.append(f"{oct(path.stat().st_mode & 0o777)} {path}")
    assert len(holding) >= 5  # keys, passphrase, cached credentials at least
    assert exposed == []


@pytest.mark.slow
def test_the_dask_scheduler_workers_and_a_node_agent_without_host_listen_on_loopback_only(
        tmp_path: Path) -> None:
    # broke: the node agent given no HOST listened on every interface (0.0.0.0 and ::)
    from elasticslice.rpc.pki import make_ca
    from tests.troy.frameworks.nodes import member, node_agent, running_pilot, stop
    from troy.frameworks.dask import DaskFramework
    ca = make_ca("hostile cluster CA", key_type="ec")
    fw = DaskFramework("tls", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                       tls=member(tmp_path / "control", ca, "control"))
    fw.start()
    agent = None
    try:
        running_pilot(fw, 1)
        agent = node_agent(fw.scheduler_address, 2, member(tmp_path / "n", ca, "node"),
                           tmp_path / "agent.log")
        wait_for(lambda: len(fw.workers_info()) == 2, 60, what="the node agent's worker")
        port = int(fw.scheduler_address.rsplit(":", 1)[1])
        ours = listening(os.getpid(), children=True)
        assert ("127.0.0.1", port) in ours
        assert reachable_from_outside({a for a, _ in ours}) == set(), ours
    finally:
        if agent is not None:
            stop(agent)
        fw.close()
