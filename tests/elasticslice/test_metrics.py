"""The manager's Prometheus metrics, scraped from the real HTTP endpoint (in-process: a real
manager on a real SQLite state, real CM calls over TLS to a scripted server)."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticslice.config import ClientConfig
from elasticslice.errors import ElasticSliceError
from elasticslice.managers import SimpleElasticSliceHelper, SimpleElasticSliceManager
from elasticslice.metrics import MetricsError, MetricsServer, ManagerMetrics, serve_metrics
from elasticslice.rpc.client import ProtoGeniServer
from tests.elasticslice.rpc.tlsserver import Pki, ScriptedServer
from tests.helpers import scrape_metrics as scrape
from tests.helpers import spare_port


class HostedSystemDown(SimpleElasticSliceManager):
    """A manager whose hosted system does not answer (get_system_state is the hook a
    hosted system overrides)."""

    def get_system_state(self) -> Any:
        raise ElasticSliceError("the hosted system does not answer")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def manager(certs: Pki, tmp_path: Path) -> Iterator[SimpleElasticSliceManager]:
    with ScriptedServer(certs) as cm:
        config = ClientConfig(certificate=certs.user, cm_urls=(cm.url,), ca_bundle=certs.ca,
                              retries=0, credential_cache_dir=tmp_path / "cache")
        server = ProtoGeniServer(config, passphrase=certs.PASSWORD)
        made = HostedSystemDown(server, helper=SimpleElasticSliceHelper(num_pcs=1),
                                state_dir=tmp_path / "state", email=False, maxthreshold=4)
        yield made
        made.close()
        server.close()


def test_the_endpoint_reports_nodes_notices_cycle_failures_and_cm_calls(
        manager: SimpleElasticSliceManager) -> None:
    now = manager.clock()
    cm = manager.cms[0].url
    for cid, node_id, state in (("node-1", "pc1", "ready"), ("node-2", "pc2", "changing"),
                                ("node-3", "pc3", "notready")):
        manager.state.upsert_node(cm, cid, now=now, node_id=node_id, state=state)
    manager.set_demand(3)
    manager.notices.pending([{"node_id": "pc1", "client_id": "node-1", "max_wait_time": 30}],
                            received=now)
    manager.notices.release(["pc1"], "drained")
    manager.state.revocations.finish("pc1", now=now + 1)
    assert manager.cycle.run_method("get_system_state") is False
    assert manager.cycle.run_method("get_system_state") is False
    assert manager.cycle.run_method("set_system_state") is True
    manager.cms[0].call("GetVersion")
    manager.cms[0].call("GetVersion")
    served = serve_metrics(manager)
    try:
        assert served.url.startswith("http://127.0.0.1:") and served.url.endswith("/metrics")
        got = scrape(served.url)
    finally:
        served.stop()
    assert got[("elasticslice_nodes_held", ())] == 3
    assert got[("elasticslice_nodes_wanted", ())] == 3
    assert got[("elasticslice_nodes_booting", ())] == 2
    assert got[("elasticslice_notices_total", ())] == 1
    assert got[("elasticslice_early_releases_total", ())] == 1
    assert got[("elasticslice_forced_releases_total", ())] == 0
    method = (("method", "get_system_state"),)
    assert got[("elasticslice_cycle_failures_total", method)] == 2
    assert ("elasticslice_cycle_last_success_age_seconds", method) not in got  # never ok
    ok = (("method", "set_system_state"),)
    assert got[("elasticslice_cycle_failures_total", ok)] == 0
    assert got[("elasticslice_cycle_last_success_age_seconds", ok)] >= 0
    calls = (("method", "GetVersion"),)
    assert got[("elasticslice_cm_call_duration_seconds_count", calls)] == 2
    assert got[("elasticslice_cm_call_duration_seconds_bucket",
                (("le", "+Inf"), ("method", "GetVersion")))] == 2
    assert got[("elasticslice_cm_call_duration_seconds_sum", calls)] > 0
    assert not any(name.startswith("elasticslice_units_") for name, _ in got)  # no session
    # per CM, labelled by its short name (here the one CM's host)
    from elasticslice.managers.sites import cm_name
    site = (("cm", cm_name(cm)),)
    assert got[("elasticslice_cm_nodes_held", site)] == 3
    assert got[("elasticslice_cm_nodes_booting", site)] == 2
    assert got[("elasticslice_cm_early_releases_total", site)] == 1
    # no secret in any label: only method names and CM names
    assert {k for _, labels in got for k, _ in labels} <= {"method", "le", "cm"}
    assert {v for _, labels in got for k, v in labels if k == "cm"} == {cm_name(cm)}


def test_two_managers_in_one_process_have_registries_of_their_own(
        manager: SimpleElasticSliceManager) -> None:
    units = {"queued": 5, "running": 2, "requeued": 1, "lost": 0}
    # a spare port: once given back, no other test's server takes it (port 0 binds do)
    first = serve_metrics(manager, units=lambda: units, port=spare_port())
    url = first.url
    second = serve_metrics(lambda: None)  # a cluster between two managers: empty, answers
    try:
        assert first.bound_port != second.bound_port
        got = scrape(first.url)
        assert got[("elasticslice_units_queued", ())] == 5
        assert got[("elasticslice_units_running", ())] == 2
        assert got[("elasticslice_units_requeued_total", ())] == 1
        assert got[("elasticslice_units_lost_total", ())] == 0
        assert scrape(second.url) == {}
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(first.url.replace("/metrics", "/"), timeout=10)
        assert err.value.code == 404
    finally:
        first.stop()
        second.stop()
    with pytest.raises(urllib.error.URLError):   # stop() closed it
        urllib.request.urlopen(url, timeout=10)


def test_a_port_taken_or_out_of_range_is_one_line_naming_it() -> None:
    registry = ManagerMetrics(lambda: None).registry()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsError) as err:
            MetricsServer(registry, port=port).start()
    message = str(err.value)
    assert message.startswith(f"metrics endpoint 127.0.0.1:{port}: cannot listen: ")
    assert "\n" not in message
    with pytest.raises(MetricsError, match=r"^metrics port 70000: must be 0 to 65535$"):
        MetricsServer(registry, port=70000).start()


def test_manage_serves_the_metrics_port_its_config_names_and_runs_on_when_taken(
        manager: SimpleElasticSliceManager, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    from elasticslice.commands.manage import serve_manager_metrics
    from elasticslice.managers.config import load_manager_config
    port = spare_port()
    (tmp_path / "m.conf").write_text(f"[manager]\nmetrics_port = {port}\n")
    manager.config = load_manager_config(tmp_path / "m.conf", env={})
    served = serve_manager_metrics(manager)
    try:
        assert served.url == f"http://127.0.0.1:{port}/metrics"
        assert capsys.readouterr().err == f"metrics: {served.url}\n"
        assert ("elasticslice_nodes_held", ()) in scrape(served.url)
        assert serve_manager_metrics(manager) is None       # taken: one line, no endpoint
        err = capsys.readouterr().err
        assert err.startswith(f"warning: metrics endpoint 127.0.0.1:{port}: cannot listen: ")
        assert err.count("\n") == 1
    finally:
        served.stop()
    manager.config = None                                   # no key: off
    assert serve_manager_metrics(manager) is None


def test_a_bad_manager_metrics_port_names_the_key_and_the_file(tmp_path: Path) -> None:
    from elasticslice.errors import ConfigError
    from elasticslice.managers.config import load_manager_config
    (tmp_path / "m.conf").write_text("[manager]\nmetrics_port = 70000\n")
    with pytest.raises(ConfigError, match=r"\[metrics_port\]"):
        load_manager_config(tmp_path / "m.conf", env={})
