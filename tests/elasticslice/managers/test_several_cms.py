"""The manager over several CMs (issue 37 item 2): a box of two clusters (utah, wisc: one
SA, a CM each), the real client over TLS, real SQLite. One box for the module, a slice of
its own per test. Each test asserts on what the CMs hold and what the user sees."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticslice.config import load_config
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.managers import SimpleElasticSliceHelper, SimpleElasticSliceManager
from elasticslice.managers.config import EndpointConfig
from elasticslice.managers.sites import SitesFailed
from elasticslice.errors import RPCError
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.credential import expires_of
from tests.elasticslice.emulator.helpers import RunningEmulator, cluster_box
from tests.elasticslice.managers.helpers import FAST_INTERVALS, FAST_RETRY, with_policy
from tests.helpers import REPO, wait_for

pytestmark = pytest.mark.slow  # a box of two clusters, managers that grow at both


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with cluster_box(tmp_path_factory.mktemp("box") / "emu") as running:
        yield running


def client(box: RunningEmulator, slice_name: str, cache: Path) -> ProtoGeniServer:
    config = load_config(box.config_path,
                         env={"ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(cache)})
    return ProtoGeniServer(dataclasses.replace(config, slice_name=slice_name),
                           retry=FAST_RETRY)


@pytest.fixture
def manager_of(box: RunningEmulator, tmp_path: Path) -> Iterator[Any]:
    made: list[SimpleElasticSliceManager] = []

    def make(slice_name: str, **options: Any) -> SimpleElasticSliceManager:
        options.setdefault("manage_intervals", FAST_INTERVALS)
        options.setdefault("retry_interval", 0.2)
        manager = SimpleElasticSliceManager(
            client(box, slice_name, tmp_path / f"cache-{len(made)}"),
            helper=SimpleElasticSliceHelper(num_pcs=1), policy=with_policy(),
            state_dir=tmp_path / f"state-{len(made)}", **options)
        made.append(manager)
        return manager

    yield make
    for manager in reversed(made):
        manager.close()
        manager.server.close()


def held(box: RunningEmulator, slice_name: str, cache: Path) -> dict[str, list[str]]:
    """What each CM's sliver holds (a fresh client): cluster name -> client_ids."""
    out: dict[str, list[str]] = {}
    with client(box, slice_name, cache) as look:
        for i, name in enumerate(("utah", "wisc")):
            try:
                out[name] = sorted(n.client_id for n in look.cm(i).sliver_status().nodes)
            except RPCError as err:   # no sliver there
                if err.code != GeniCode.SEARCHFAILED:
                    raise
                out[name] = []
    return out


def by_cm(manager: Any) -> dict[str, list[str]]:
    """The nodes the manager's state holds, by cluster name."""
    out: dict[str, list[str]] = {"utah": [], "wisc": []}
    for rec in manager.state.nodes():
        out["wisc" if "/cluster/wisc/" in rec.cm else "utah"].append(rec.client_id)
    return {k: sorted(v) for k, v in out.items()}


def test_a_slice_of_two_cms_holds_a_sliver_at_each_grows_and_renews_both(
        box, manager_of, tmp_path: Path) -> None:
    manager = manager_of("two", maxthreshold=3, renew_hours=6, renew_margin=7 * 3600)
    assert [u.split("/cluster/")[1].split("/")[0] for u in manager.cmlist] == ["utah", "wisc"]
    errors = manager.manage_once()
    assert [m for m, e in errors.items() if e] == []
    on_cms = held(box, "two", tmp_path / "look")
    assert on_cms == {"utah": ["node-1", "node-3"], "wisc": ["node-2"]}
    assert by_cm(manager) == on_cms   # the state's rows are keyed by CM, as the CMs hold
    assert {s.cm for s in manager.state.slivers()} == set(manager.cmlist)
    # created for 6 h, then renewed (margin 7 h) at the SA and at both CMs: past 7 h
    with client(box, "two", tmp_path / "fresh") as look:
        for i in (0, 1):
            left = expires_of(look.cm(i).get_sliver()).timestamp() - manager.clock()
            assert left > 7 * 3600, (i, left)
    # metrics labelled by CM
    from prometheus_client.exposition import generate_latest

    from elasticslice.metrics import ManagerMetrics
    text = generate_latest(ManagerMetrics(manager).registry()).decode()
    assert 'elasticslice_cm_nodes_held{cm="utah"} 2.0' in text
    assert 'elasticslice_cm_nodes_held{cm="wisc"} 1.0' in text
    assert 'elasticslice_cm_notices_total{cm="wisc"} 0.0' in text
    # the per-CM seed methods answer per CM
    wisc = manager.cms[1]
    assert manager.get_node_status("node-2", cm=wisc) is not None
    assert manager.get_node_status("node-2", cm=manager.cms[0]) is None


def test_a_busy_cm_delays_growth_only_there_while_the_other_grows(
        box, manager_of, tmp_path: Path) -> None:
    """wisc first in cmlist and its AddNodes BUSY: utah grows instead, in the same run;
    wisc's sliver and status go on, and its AddNodes is left alone until its retry."""
    manager = manager_of("busy", maxthreshold=3, cmlist=["wisc", "utah"], retry_interval=60)
    assert manager.cmlist[0].endswith("/cluster/wisc/protogeni/xmlrpc/cm")
    box.server.pressure.set(busy={"wisc/AddNodes": 1.0})
    try:
        manager.ensure_slice()
        manager.ensure_sliver()
        manager.update_available()
        # the policy's first pick, wisc, answers BUSY: tried twice, not the client's 12
        # times (its back-off retries it, the other CMs do not wait out its retries) ...
        with pytest.raises(SitesFailed, match="wisc: .*BUSY.*gave up after 2 attempts") \
                as failed:
            manager.add_nodes()
        assert failed.value.result == 1   # ... and utah grew in the same run instead
        on_cms = held(box, "busy", tmp_path / "look")
        assert len(on_cms["utah"]) == 2 and on_cms["wisc"] == ["node-1"], on_cms
        assert by_cm(manager) == on_cms
        assert box.server.pressure.busy_answers("AddNodes") > 0
        manager.update_sliver_status()    # wisc's other methods go on (raises if not)
        manager.ensure_sliver()
        assert manager.sites.paused("add_nodes") == {manager.cmlist[0]}
        assert manager.add_nodes() == 0   # at the wanted count: nothing asked of wisc
        assert held(box, "busy", tmp_path / "look") == on_cms
    finally:
        box.server.pressure.relieve()


CM_CALLS = ("GetVersion", "Resolve", "GetSliver", "CreateSliver", "SliverStatus",
            "RenewSlice", "DiscoverResources", "AddNodes", "DeleteNodes")


def test_a_cm_that_answers_nothing_but_busy_delays_only_its_own_share(
        box, manager_of, tmp_path: Path) -> None:
    """wisc answers BUSY to every call (as good as down): every method still does utah's
    share, each failure names wisc alone, the slice grows at utah; once wisc answers again
    its sliver is made."""
    manager = manager_of("down", maxthreshold=3, cmlist=["wisc", "utah"], retry_interval=0.01)
    box.server.pressure.set(busy={f"wisc/{m}": 1.0 for m in CM_CALLS})
    try:
        errors = {m: e for m, e in manager.manage_once().items() if e}
    finally:
        box.server.pressure.relieve()
    assert {"ensure_sliver", "update_sliver_status", "update_available",
            "update_all"} <= set(errors), errors
    for method, error in errors.items():
        assert "at 1 CM(s): wisc: " in error and "utah" not in error, (method, error)
    assert held(box, "down", tmp_path / "look") == {"utah": ["node-1", "node-2", "node-3"],
                                                    "wisc": []}
    wait_for(lambda: not manager.sites.paused("ensure_sliver"), timeout=10,
             what="wisc's back-off to pass")
    assert [m for m, e in manager.manage_once().items() if e] == []
    assert held(box, "down", tmp_path / "look")["wisc"] == ["node-4"]
    assert {s.cm for s in manager.state.slivers()} == set(manager.cmlist)


def test_a_cm_that_is_down_delays_only_its_own_share(box, tmp_path: Path) -> None:
    """wisc's CM does not answer at all (nothing listens where the config says it is): the
    slice grows at utah, each failing method names wisc, and wisc is left alone until its
    back-off passes (not asked again in the next run)."""
    from tests.helpers import spare_port
    config = load_config(box.config_path,
                         env={"ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp_path / "cache")})
    port = box.url.split(":")[2].split("/")[0]
    dead = [u if "/cluster/wisc/" not in u else u.replace(f":{port}/", f":{spare_port()}/")
            for u in config.cm_urls]
    config = dataclasses.replace(config, slice_name="dead", cm_urls=tuple(dead))
    manager = SimpleElasticSliceManager(
        ProtoGeniServer(config, retry=FAST_RETRY), helper=SimpleElasticSliceHelper(num_pcs=1),
        policy=with_policy(), state_dir=tmp_path / "state", manage_intervals=FAST_INTERVALS,
        retry_interval=60, maxthreshold=2, cmlist=[dead[1], dead[0]])
    try:
        errors = {m: e for m, e in manager.manage_once().items() if e}
        assert {"ensure_sliver", "update_sliver_status", "update_available"} <= set(errors)
        assert all("at 1 CM(s): wisc: " in e for e in errors.values()), errors
        assert held(box, "dead", tmp_path / "look")["utah"] == ["node-1", "node-2"]
        assert manager.sites.paused("ensure_sliver") == {dead[1]}
        # the next run leaves wisc alone (its back-off): nothing fails, utah's share is done
        assert [m for m, e in manager.manage_once().items() if e] == []
        # and status says what fails at wisc meanwhile
        from elasticslice.commands.manage import status_data
        failing = status_data(manager.state)["sites"]["wisc"]["failing"]
        assert {"ensure_sliver", "update_sliver_status", "update_available"} <= set(failing)
        assert failing["ensure_sliver"]["retry_at"] > manager.clock()
        assert "failing" not in status_data(manager.state)["sites"]["utah"]
    finally:
        manager.close()
        manager.server.close()


def test_a_notice_from_wisc_is_answered_and_released_at_wisc(
        box, manager_of, tmp_path: Path) -> None:
    manager = manager_of("notice", maxthreshold=3, cmlist=["wisc", "utah"],
                         endpoint=EndpointConfig())
    manager.start()
    wait_for(lambda: sum(r.state == "ready" for r in manager.state.nodes()) == 3
             and len(manager.registered) == 2, timeout=60,
             what="3 ready nodes and the endpoint registered at both CMs")
    assert by_cm(manager) == {"utah": ["node-2"], "wisc": ["node-1", "node-3"]}
    victim = manager.state.node(manager.cmlist[0], "node-3")
    wisc = AdminClient(box.dir, cluster="wisc")
    wisc.call("Revoke", nodes=[victim.node_id])

    def outcome() -> str | None:
        rows = [r for r in wisc.call("Report") if r["node_id"] == victim.node_id]
        return rows[-1]["outcome"] if rows and rows[-1]["outcome"] not in ("", "pending") \
            else None
    wait_for(outcome, timeout=60, what="wisc's reclamation to end")
    assert outcome() == "early"
    wait_for(lambda: manager.state.node(manager.cmlist[0], "node-3").gone_at is not None,
             timeout=30, what="node-3 gone")
    # our answer (max_wait_time 0) let wisc take it early; our DeleteNodes of it, if it came
    # first, went to wisc with wisc's credential: nothing failed, nothing is left to give back
    assert manager.state.node(manager.cmlist[0], "node-3").gone_reason in (
        "released early", "taken back by CloudLab")
    wait_for(lambda: not manager.state.to_release.rows(), timeout=30, what="no release left")
    assert manager.cycle.methods["release_nodes"].failures_total == 0
    assert manager.notices.counts()["early"] == 1
    on_cms = held(box, "notice", tmp_path / "look")
    assert "node-3" not in on_cms["wisc"] and on_cms["utah"] == ["node-2"]
    manager.stop()


def cm_context(box: RunningEmulator, cluster: str) -> ssl.SSLContext:
    """What the cluster's CM presents when it calls a client endpoint."""
    ctx = ssl.create_default_context(cafile=str(box.dir / "ca.pem"))
    ctx.load_cert_chain(str(box.dir / "cms" / cluster / "cm.pem"),
                        str(box.dir / "cms" / cluster / "cm-key.pem"))
    return ctx


def test_a_notice_counts_only_from_the_cm_that_holds_the_node(box, manager_of) -> None:
    """utah's CM (a trusted caller) naming a node held at wisc changes nothing: answered
    max_wait_time 0 as for any node not ours there; the same notice from wisc counts."""
    manager = manager_of("caller", maxthreshold=2, endpoint=EndpointConfig())
    manager.start()
    wait_for(lambda: len(manager.registered) == 2 and len(manager.state.nodes()) == 2,
             timeout=60, what="a node at each CM and the endpoint registered at both")
    rec = manager.state.node(manager.cmlist[1], "node-2")   # wisc's
    item = {"node_id": rec.node_id, "client_id": "node-2", "max_wait_time": 300}
    for cluster in ("utah", "wisc"):
        proxy = xmlrpc.client.ServerProxy(manager.endpoint_url,
                                          context=cm_context(box, cluster))
        try:
            answer = proxy.NotifyDeletePending({"nodelist": [item]})
        finally:
            proxy("close")()
        assert answer["code"] == 0
        waits = {n["node_id"]: n["max_wait_time"] for n in answer["value"]} \
            if isinstance(answer["value"], list) else {}
        if cluster == "utah":
            assert waits.get(rec.node_id, 0) == 0
            assert manager.state.pending_deletes() == []
            assert manager.notices.counts()["revocations"] == 0
    # from wisc: a revocation of wisc's node, kept until its commands finish
    assert [(p.cm, p.node_id) for p in manager.state.pending_deletes()] == [
        (manager.cmlist[1], rec.node_id)]
    manager.stop()


def manage_conf(box: RunningEmulator, tmp_path: Path, slice_name: str) -> Path:
    text = box.config_path.read_text().replace("slice_name = elastic",
                                               f"slice_name = {slice_name}")
    text += (f"\n[manager]\nstate_dir = {tmp_path / 'state'}\nmaxthreshold = 4\n"
             "add_cooldown = 0\nretry_interval = 0.2\npercent_available_minimum = 0\n"
             "cmlist = wisc, utah\n"
             + "".join(f"interval.{m} = 0.3\n" for m in (
                 "update_sliver_status", "update_available", "add_nodes", "delete_nodes"))
             + "\n[endpoint]\nenabled = false\n")
    path = tmp_path / "manager.conf"
    path.write_text(text)
    return path


def manage(conf: Path, log: Path) -> subprocess.Popen[bytes]:
    environ = {k: v for k, v in os.environ.items() if k != "PROTOGENI_PASSPHRASE"}
    environ["PYTHONPATH"] = str(REPO)
    return subprocess.Popen([sys.executable, "-m", "elasticslice.cli", "--config", str(conf),
                             "manage"], stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            env=environ, cwd=str(REPO))


def cli(conf: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "elasticslice.cli", "--config", str(conf),
                          *args], capture_output=True, check=True, cwd=str(REPO),
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    return out.stdout.decode()


def status(conf: Path) -> dict[str, Any]:
    return json.loads(cli(conf, "status", "--json"))


def test_manage_sigkilled_resumes_with_both_slivers_and_adds_nothing_twice(
        box, tmp_path: Path) -> None:
    conf = manage_conf(box, tmp_path, "killed")
    log = tmp_path / "manage.log"
    proc = manage(conf, log)
    try:
        def four() -> bool:
            try:
                return sum(len(v) for v in held(box, "killed", tmp_path / "l1").values()) == 4
            except RPCError:   # no slice or sliver yet
                return False
        wait_for(four, timeout=60, what="4 nodes over the two CMs")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = held(box, "killed", tmp_path / "l2")
    assert before["utah"] and before["wisc"], before   # a sliver at each
    restarted = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    proc = manage(conf, log)

    def resumed() -> bool:   # (a manager just started has run no method yet: no entry)
        seen = status(conf)
        slivers = (seen.get("slice") or {}).get("slivers") or []
        adds = (seen.get("cycle") or {}).get("add_nodes") or {}
        return bool(slivers) and all(s["status"] == "exists" for s in slivers) and \
            (adds.get("last_ok") or "") > restarted
    try:
        wait_for(resumed, timeout=60,
                 what="the restarted manager to find both slivers and decide on adds")
        seen = status(conf)
    finally:
        proc.terminate()
        proc.wait(30)
    assert held(box, "killed", tmp_path / "l3") == before   # nothing added twice, none lost
    assert sorted((n["cm"].split("/cluster/")[1].split("/")[0], n["client_id"])
                  for n in seen["nodes"]) == sorted(
        (cm, cid) for cm, cids in before.items() for cid in cids)
    assert "Traceback" not in log.read_text()
    # what a user sees: status and nodes name each node's CM
    assert {name: site["nodes"] for name, site in seen["sites"].items()} == {
        cm: len(cids) for cm, cids in before.items()}
    text = cli(conf, "status").splitlines()
    rows = [line.split()[:2] for line in text if line.startswith("  ") and "node-" in line]
    assert sorted(rows) == sorted([cm, cid] for cm, cids in before.items() for cid in cids)
    assert any(line.startswith("nodes   4  utah 1") and "wisc 3" in line for line in text)
    table = cli(conf, "nodes").splitlines()
    assert table[0].split()[:2] == ["CM", "CLIENT_ID"]
    assert sorted(line.split()[:2] for line in table[1:]) == sorted(rows)


def test_each_cm_is_sent_a_request_whose_every_node_is_bound_to_it(box, manager_of) -> None:
    """CM v2's convention for a slice across CMs (PROTOCOL.md): the CreateSliver at each CM
    carries the helper's request with every node's ``component_manager_id`` that CM's URN
    (what is sent on the wire, read as it goes; each CM's sliver then holds its node)."""
    from elasticslice.rspec.safexml import parse_xml
    m = manager_of("bound")
    sent: list[tuple[str, str]] = []
    call = m.server.transport.call

    def watched(url: str, method: str, params: Any = None, **kw: Any) -> Any:
        if method == "CreateSliver":
            sent.append((url, params["rspec"]))
        return call(url, method, params, **kw)

    m.server.transport.call = watched
    m.ensure_slice()
    m.ensure_sliver()
    assert sorted("wisc" if "/cluster/wisc/" in url else "utah" for url, _ in sent) == \
        ["utah", "wisc"]
    for url, rspec in sent:
        site = "wisc" if "/cluster/wisc/" in url else "utah"
        nodes = [n for n in parse_xml(rspec) if n.tag.endswith("}node")]
        assert nodes and all(n.get("component_manager_id") ==
                             f"urn:publicid:IDN+{site}.emulab.test+authority+cm" for n in nodes)
