"""The seed's client endpoints: CloudLab's delete countdown answered early once the delete
commands finish, commands killed at the deadline, values stored, every malformed notice a
BADARGS with one line; over real TLS, and end to end with a running emulator."""
from __future__ import annotations

import logging
import threading
import xmlrpc.client
from pathlib import Path
from typing import Any

import pytest

from elasticslice.config import load_config
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.managers.endpoint import (MAX_NODES, DeleteNotice, ElasticSliceClientEndpoint,
                                            ResourceValue, SimpleElasticSliceClientEndpoint,
                                            parse_nodelist)
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.endpoint import BadArgs
from tests.helpers import process_alive, wait_for
from tests.elasticslice.emulator.helpers import REQUEST
from tests.elasticslice.rpc.endpointkit import CM_URN, Callers, call, post, serving


class Commands:
    """A helper whose delete commands are given per test; records each call."""

    def __init__(self, *commands: str) -> None:
        self.commands = list(commands)
        self.calls: list[list[dict[str, Any]]] = []

    def get_delete_commands(self, nodelist: list[dict[str, Any]]) -> list[str]:
        self.calls.append(nodelist)
        return self.commands


class Recording(SimpleElasticSliceClientEndpoint):
    """What a manager does with the hooks: remember them."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.events: list[tuple[str, Any]] = []

    def on_delete_pending(self, nodes: list[DeleteNotice]) -> None:
        self.events.append(("pending", nodes))

    def on_delete_complete(self, nodes: list[DeleteNotice]) -> None:
        self.events.append(("complete", nodes))

    def on_resource_values(self, values: list[ResourceValue]) -> None:
        self.events.append(("values", values))

    def on_delete_finished(self, node_ids: list[str], outcome: str) -> None:
        self.events.append(("finished", (node_ids, outcome)))

    def outcomes(self) -> list[Any]:
        return [v for k, v in self.events if k == "finished"]


def gated(gate: Path) -> str:
    """A delete command that waits (at most two minutes) until the test creates ``gate``."""
    return f"i=0; while [ ! -e {gate} ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done"


def notice(*nodes: tuple[str, int]) -> dict[str, Any]:
    return {"nodelist": [{"node_id": n, "client_id": f"c-{n}", "max_wait_time": w}
                         for n, w in nodes]}


def waits(answer: dict[str, Any]) -> dict[str, int]:
    assert answer["code"] == GeniCode.SUCCESS
    return {n["node_id"]: n["max_wait_time"] for n in answer["value"]}


@pytest.fixture
def endpoints() -> Any:
    made: list[SimpleElasticSliceClientEndpoint] = []

    def make(*commands: str, **kw: Any) -> tuple[Recording, Commands]:
        helper = Commands(*commands)
        ep = Recording(helper, **kw)
        made.append(ep)
        return ep, helper
    yield make
    for ep in made:
        ep.shutdown_deletes()


# -- parse_nodelist: every malformed shape is one line naming the item and key ------------
BAD = [
    ("pending", ["nodelist"], "params must be a struct"),
    ("pending", {}, "nodelist: expected an array of structs, got nothing"),
    ("pending", {"nodelist": {"node_id": "a"}}, "nodelist: expected an array of structs, got dict"),
    ("pending", {"nodelist": ["pc1"]}, "nodelist[0]: expected a struct, got str"),
    ("pending", {"nodelist": [{"max_wait_time": 5}]}, "nodelist[0].node_id: expected a non-empty"),
    ("pending", {"nodelist": [{"node_id": 7, "max_wait_time": 5}]}, "got int 7"),
    ("pending", {"nodelist": [{"node_id": "  ", "max_wait_time": 5}]}, "nodelist[0].node_id"),
    ("pending", {"nodelist": [{"node_id": "x" * 257, "max_wait_time": 5}]}, "at most 256"),
    ("pending", {"nodelist": [{"node_id": "a", "max_wait_time": 5},
                              {"node_id": "a", "max_wait_time": 5}]}, "nodelist[1].node_id: 'a' appears twice"),
    ("pending", {"nodelist": [{"node_id": "a", "client_id": 3, "max_wait_time": 5}]}, "nodelist[0].client_id"),
    ("pending", {"nodelist": [{"node_id": "a"}]}, "nodelist[0].max_wait_time: expected whole seconds >= 0, got nothing"),
    ("pending", {"nodelist": [{"node_id": "a", "max_wait_time": "5"}]}, "got str '5'"),
    ("pending", {"nodelist": [{"node_id": "a", "max_wait_time": -1}]}, "got int -1"),
    ("pending", {"nodelist": [{"node_id": "a", "max_wait_time": 2.5}]}, "got float 2.5"),
    ("pending", {"nodelist": [{"node_id": "a", "max_wait_time": True}]}, "got bool True"),
    ("complete", {"nodelist": [{"node_id": "a", "max_wait_time": []}]}, "max_wait_time"),
    ("values", {"nodelist": [{"node_id": "a"}]}, "nodelist[0].value: expected a number from 0 to 1, got nothing"),
    ("values", {"nodelist": [{"node_id": "a", "value": 1.5}]}, "got float 1.5"),
    ("values", {"nodelist": [{"node_id": "a", "value": -0.1}]}, "got float -0.1"),
    ("values", {"nodelist": [{"node_id": "a", "value": float("nan")}]}, "got float nan"),
    ("values", {"nodelist": [{"node_id": "a", "value": "0.5"}]}, "got str '0.5'"),
    ("values", {"nodelist": [{"node_id": "a", "value": False}]}, "got bool False"),
    ("values", {"nodelist": [{"node_id": "a", "value": 0.5, "component_urn": 5}]}, "component_urn"),
    ("values", {"nodelist": [{"node_id": f"n{i}", "value": 0.5} for i in range(MAX_NODES + 1)]},
     f"nodelist: {MAX_NODES + 1} nodes, at most {MAX_NODES}"),
]


@pytest.mark.parametrize("kind, params, message", BAD)
def test_malformed_nodelists_are_badargs_naming_item_and_key(kind, params, message):
    with pytest.raises(BadArgs) as err:
        parse_nodelist(params, kind=kind)
    assert message in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_wellformed_nodelists_keep_extra_keys_and_optional_ones():
    nodes = parse_nodelist({"nodelist": [{"node_id": "pc1", "max_wait_time": 0, "extra": [1]}]},
                           kind="pending")
    assert nodes == [{"node_id": "pc1", "max_wait_time": 0, "extra": [1]}]
    assert parse_nodelist({"nodelist": [{"node_id": "pc1"}]}, kind="complete") == \
        [{"node_id": "pc1"}]
    values = parse_nodelist({"nodelist": [{"node_id": "pc1", "value": 1}]}, kind="values")
    assert values == [{"node_id": "pc1", "value": 1.0}]
    assert parse_nodelist({"nodelist": []}, kind="values") == []


def test_malformed_params_over_tls_are_badargs_and_the_endpoint_keeps_serving(
        emulator_pki, tmp_path, endpoints):
    ep, helper = endpoints("exec sleep 300")  # killed by the fixture's shutdown_deletes
    cm = Callers(emulator_pki, tmp_path).cm()
    with serving(emulator_pki, ep) as server:
        for method in ("NotifyDeletePending", "NotifyDeleteComplete", "SetResourceValues"):
            for params in ({}, {"nodelist": "pc1"}, {"nodelist": [0]},
                           {"nodelist": [{"node_id": ["x"], "value": 2}]}):
                answer = call(server.url, cm, method, params)
                assert answer["code"] == GeniCode.BADARGS, (method, params, answer)
                assert answer["output"].startswith(f"{method}: nodelist")
        assert helper.calls == [] and ep.events == []  # nothing acted on bad input
        # a <nil/> client_id is as if absent: it must not make the answer unsendable
        nil = xmlrpc.client.dumps(({"nodelist": [{"node_id": "pc9", "client_id": None,
                                                  "max_wait_time": 30}]},),
                                  "NotifyDeletePending", allow_none=True).encode()
        _, body = post(server.port, cm, nil)
        (answer,), _ = xmlrpc.client.loads(body)
        assert answer["code"] == 0 and answer["value"] == [{"node_id": "pc9",
                                                             "max_wait_time": 30}]
        assert waits(call(server.url, cm, "NotifyDeletePending", notice(("pc1", 30)))) == \
            {"pc1": 30}


# -- the delete countdown --------------------------------------------------------------------
def test_the_countdown_is_answered_early_once_the_delete_commands_finish(endpoints, tmp_path):
    gate, ran = tmp_path / "gate", tmp_path / "ran"
    ep, helper = endpoints(f'echo "$ELASTICSLICE_DELETE_NODES" > {ran}',
                           gated(gate))
    first = ep.NotifyDeletePending(notice(("pc1", 60), ("pc2", 60)))
    assert waits(first) == {"pc1": 60, "pc2": 60}  # answered at once, commands still running
    assert ep.has_pending_deletes() and not ep.delete_finished("pc1")
    wait_for(ran.exists, timeout=30, what="the first delete command")
    assert ran.read_text().split() == ["pc1", "pc2"]
    assert len(helper.calls) == 1  # delete_in_group: one job for the notice's nodes
    assert waits(ep.NotifyDeletePending(notice(("pc1", 59), ("pc2", 59)))) == \
        {"pc1": 59, "pc2": 59}
    gate.touch()
    wait_for(lambda: ep.delete_finished("pc2"), timeout=30, what="the delete to finish")
    assert ep.outcomes() == [(["pc1", "pc2"], "done")]
    third = ep.NotifyDeletePending(notice(("pc1", 58), ("pc2", 58)))
    assert waits(third) == {"pc1": 0, "pc2": 0}
    assert third["value"][0]["client_id"] == "c-pc1"  # a copy of the list, client_id kept
    assert len(helper.calls) == 1  # the countdown never starts a second delete
    assert [k for k, _ in ep.events].count("pending") == 3
    assert ep.NotifyDeleteComplete(notice(("pc1", 0), ("pc2", 0)))["code"] == 0
    assert not ep.has_pending_deletes()
    assert ep.pending_delete_notices() == []


@pytest.mark.slow
def test_delete_commands_are_killed_when_the_deadline_passes(endpoints, tmp_path):
    pidfile = tmp_path / "pid"
    ep, _ = endpoints(f"echo $$ > {pidfile}; exec sleep 300", "touch never-runs")
    ep.NotifyDeletePending(notice(("pc1", 2)))
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30,
             what="the command to start")
    pid = int(pidfile.read_text())
    wait_for(lambda: ep.outcomes(), timeout=60, what="the deadline kill")
    assert ep.outcomes() == [(["pc1"], "killed")]
    wait_for(lambda: not process_alive(pid), timeout=30, what="the command's process to go")
    assert waits(ep.NotifyDeletePending(notice(("pc1", 0)))) == {"pc1": 0}


@pytest.mark.slow
def test_a_shorter_countdown_moves_the_kill_earlier(endpoints, tmp_path):
    pidfile = tmp_path / "pid"
    ep, _ = endpoints(f"echo $$ > {pidfile}; exec sleep 300")
    ep.NotifyDeletePending(notice(("pc1", 3600)))
    wait_for(pidfile.exists, timeout=30, what="the command to start")
    ep.NotifyDeletePending(notice(("pc1", 1)))  # CloudLab now wants it within a second
    wait_for(lambda: ep.outcomes(), timeout=60, what="the earlier kill")
    assert ep.outcomes() == [(["pc1"], "killed")]


def test_one_job_per_node_when_not_deleting_in_group(endpoints):
    ep, helper = endpoints("true", delete_in_group=False)
    ep.NotifyDeletePending(notice(("pc1", 30), ("pc2", 30)))
    wait_for(lambda: len(ep.outcomes()) == 2, timeout=30, what="two jobs")
    assert sorted(c[0]["node_id"] for c in helper.calls) == ["pc1", "pc2"]
    assert all(len(c) == 1 for c in helper.calls)


def test_max_wait_time_zero_means_gone_no_commands_and_answered_zero(endpoints, tmp_path):
    gate = tmp_path / "gate"
    ep, helper = endpoints(gated(gate))
    assert waits(ep.NotifyDeletePending(notice(("pc1", 0), ("pc2", 40)))) == \
        {"pc1": 0, "pc2": 40}
    gate.touch()
    wait_for(lambda: len(ep.outcomes()) == 2, timeout=30, what="pc2's delete")
    assert ep.outcomes() == [(["pc1"], "no-time"), (["pc2"], "done")]
    assert [[n["node_id"] for n in c] for c in helper.calls] == [["pc2"]]


def test_no_helper_releases_at_the_first_answer():
    ep = SimpleElasticSliceClientEndpoint()
    assert waits(ep.NotifyDeletePending(notice(("pc1", 30)))) == {"pc1": 0}


@pytest.mark.slow
def test_ten_thousand_nodes_fit_the_default_body_limit(emulator_pki, tmp_path):
    """The bounds agree: the largest nodelist accepted also fits in the largest body read."""
    ep = SimpleElasticSliceClientEndpoint()
    cm = Callers(emulator_pki, tmp_path).cm()
    urn = "urn:publicid:IDN+utah.cloudlab.us+node+"
    values = {"nodelist": [{"node_id": f"ms{i:05d}", "client_id": f"node-{i}", "value": 0.5,
                            "component_urn": urn + f"ms{i:05d}"} for i in range(MAX_NODES)]}
    with serving(emulator_pki, ep) as server:
        assert call(server.url, cm, "SetResourceValues", values)["code"] == 0
        answer = call(server.url, cm, "NotifyDeletePending",
                      notice(*[(f"ms{i:05d}", 600) for i in range(MAX_NODES)]))
    assert len(ep.resource_values()) == MAX_NODES
    assert set(waits(answer).values()) == {0}  # no helper: every node released at once


def test_pending_deletes_are_bounded():
    ep = SimpleElasticSliceClientEndpoint()
    many = [(f"pc{i}", 60) for i in range(MAX_NODES)]
    assert ep.NotifyDeletePending(notice(*many))["code"] == GeniCode.SUCCESS
    assert ep.NotifyDeletePending(notice(*many[:5]))["code"] == GeniCode.SUCCESS  # countdown
    with pytest.raises(BadArgs, match=f"more than {MAX_NODES} nodes would be pending"):
        ep.NotifyDeletePending(notice(("one-more", 60)))
    ep.NotifyDeleteComplete(notice(*many[:1]))
    assert waits(ep.NotifyDeletePending(notice(("one-more", 60)))) == {"one-more": 0}


def test_failing_commands_and_helpers_still_release(endpoints, caplog):
    caplog.set_level(logging.INFO, logger="elasticslice")
    ep, _ = endpoints("echo visible-output; exit 3 # token=SECRET-xyz")
    ep.NotifyDeletePending(notice(("pc1", 30)))
    wait_for(lambda: ep.outcomes(), timeout=30, what="the failed command")
    assert ep.outcomes() == [(["pc1"], "failed")]
    assert waits(ep.NotifyDeletePending(notice(("pc1", 29)))) == {"pc1": 0}
    assert "visible-output" in caplog.text and "exited 3" in caplog.text
    assert "SECRET-xyz" not in caplog.text  # the command line itself never reaches the log

    class Broken:
        def get_delete_commands(self, nodelist: list[dict[str, Any]]) -> list[str]:
            raise RuntimeError("helper bug")
    broken = Recording(Broken())
    assert waits(broken.NotifyDeletePending(notice(("pc2", 30)))) == {"pc2": 0}
    assert broken.outcomes() == [(["pc2"], "failed")]


def test_delete_complete_forgets_the_nodes_and_stops_their_commands(endpoints, tmp_path):
    pidfile = tmp_path / "pid"
    ep, _ = endpoints(f"echo $$ > {pidfile}; exec sleep 300")
    ep.NotifyDeletePending(notice(("pc1", 3600)))
    wait_for(pidfile.exists, timeout=30, what="the command to start")
    assert ep.NotifyDeleteComplete(notice(("pc1", 0), ("unknown", 0))) == \
        {"code": 0, "value": 0, "output": ""}
    wait_for(lambda: ep.outcomes(), timeout=30, what="the cancelled job")
    assert ep.outcomes() == [(["pc1"], "killed")]
    assert not ep.has_pending_deletes()
    assert [n.node_id for n in dict(ep.events)["complete"]] == ["pc1", "unknown"]


def test_set_resource_values_stores_and_hands_them_on(endpoints):
    ep, _ = endpoints()
    answer = ep.SetResourceValues({"nodelist": [
        {"node_id": "pc1", "value": 0.25, "client_id": "node-1",
         "component_urn": "urn:publicid:IDN+emulab.test+node+pc1"},
        {"node_id": "pc2", "value": 1}]})
    assert answer["code"] == GeniCode.SUCCESS
    assert ep.resource_values() == {
        "pc1": ResourceValue("pc1", 0.25, "node-1", "urn:publicid:IDN+emulab.test+node+pc1"),
        "pc2": ResourceValue("pc2", 1.0)}
    assert dict(ep.events)["values"] == list(ep.resource_values().values())


def test_a_failing_hook_never_costs_the_answer(caplog):
    class Bad(SimpleElasticSliceClientEndpoint):
        def on_delete_pending(self, nodes: list[DeleteNotice]) -> None:
            raise RuntimeError("state is locked")
    assert waits(Bad().NotifyDeletePending(notice(("pc1", 5)))) == {"pc1": 0}
    assert "on_delete_pending failed" in caplog.text


def test_the_stub_endpoint_checks_and_answers_success():
    stub = ElasticSliceClientEndpoint()
    assert stub.GetVersion() == {"code": 0, "value": "1.0", "output": "1.0"}
    assert stub.NotifyDeletePending(notice(("pc1", 5)))["code"] == 0
    assert stub.SetResourceValues({"nodelist": [{"node_id": "a", "value": 0.5}]})["code"] == 0
    with pytest.raises(BadArgs):
        stub.NotifyDeleteComplete({"nodelist": [{}]})


def test_many_concurrent_notices_never_block_the_handlers(endpoints, tmp_path):
    gate = tmp_path / "gate"
    ep, _ = endpoints(gated(gate), delete_in_group=False)
    nodes = [(f"pc{i}", 120) for i in range(50)]
    answers: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: answers.append(ep.NotifyDeletePending(
        notice(*nodes)))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(answers) == 4  # every handler returned while the commands wait on the gate
    assert ep.deletes_running() == 50
    gate.touch()
    wait_for(lambda: len(ep.outcomes()) == 50, timeout=120, what="all 50 deletes")
    assert set(waits(ep.NotifyDeletePending(notice(*nodes))).values()) == {0}


# -- end to end: a running emulator revokes a node ----------------------------------------------
def test_a_revocation_is_answered_and_the_node_released_early(emulator, tmp_path):
    marker = tmp_path / "deleted"
    ep = Recording(Commands(f'echo "$ELASTICSLICE_DELETE_CLIENT_IDS" >> {marker}'))
    config = load_config(emulator.config_path,
                         env={"ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp_path / "cache")})
    with ProtoGeniServer(config) as client:
        client.register_slice()
        client.create_sliver(REQUEST)
        cm = client.cm()
        cm_urn = cm.get_version()["urn"]
        assert cm_urn == CM_URN
        with serving(emulator.dir, ep, allowed_urns=[cm_urn]) as server:
            cm.set_slice_client_endpoint(server.url, "LIFO", 5)
            status = wait_for(lambda: _ready(client), timeout=60, what="the sliver ready")
            node = next(n for n in status.nodes if n.client_id == "n2")
            node_id = node.component_id.rsplit("+", 1)[-1]
            AdminClient(emulator.dir).call("Revoke", nodes=[node_id])
            wait_for(lambda: any(k == "complete" for k, _ in ep.events), timeout=60,
                     what="NotifyDeleteComplete")
            assert marker.read_text().split() == ["n2"]
            pending = [v for k, v in ep.events if k == "pending"]
            assert pending[0][0].node_id == node_id and pending[0][0].client_id == "n2"
            assert not ep.has_pending_deletes()
        report = AdminClient(emulator.dir).call("Report")
        assert [(r["node_id"], r["outcome"]) for r in report] == [(node_id, "early")]
        assert [n.client_id for n in client.sliver_status().nodes] == ["n1"]
    ep.shutdown_deletes()


def _ready(client: ProtoGeniServer) -> Any:
    status = client.sliver_status()
    return status if status.ready else None
