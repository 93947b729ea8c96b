"""`elasticslice run`'s settings (--listen ... --endpoint-port): each from the command line,
else from the config file's key of the same name, else its default; a bad value is one line
naming the option, or the key and the file, exit 2, before anything is contacted or made;
what is chosen reaches ``ElasticCluster``. In-process (no CM is contacted: the config's CM
is on 127.0.0.1 and nothing gets that far), but for one real run against the box."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.commands.run import SETTINGS, resolve_settings
from elasticslice.config import default_listen, is_this_machine, load_config
from tests.elasticslice.helpers import FORKJOIN
from tests.helpers import spare_port

BOX_CM = "https://127.0.0.1:1/protogeni/xmlrpc/cm"


def config(tmp_path: Path, extra: str = "", cm: str = BOX_CM) -> Path:
    """A client config that loads (its certificate is never read here) plus ``extra``."""
    (tmp_path / "user.pem").write_text("not read by these tests\n")
    (tmp_path / "ca.pem").write_text("not read by these tests\n")
    path = tmp_path / "c.conf"
    path.write_text(f"[protogeni]\ncertificate = user.pem\nca_bundle = ca.pem\n"
                    f"cm_urls = {cm}\nsa_url = https://127.0.0.1:1/protogeni/xmlrpc/sa\n"
                    f"slice_name = s1\n{extra}")
    return path


def settings(path: Path, **given: Any) -> Any:
    return resolve_settings(load_config(path, env={}), given)


def run(path: Path, tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["-c", str(path), "run", str(FORKJOIN), "--state-dir",
                                    str(tmp_path / "d"), *args])


def test_defaults_without_options_or_config(tmp_path: Path) -> None:
    s = settings(config(tmp_path))
    assert (s.listen, s.public_url, s.image, s.hardware_type, s.node_cores) == \
        ("127.0.0.1", None, None, None, None)
    assert (s.margin, s.idle_timeout, s.agent_timeout, s.endpoint_port, s.max_nodes) == \
        (5.0, 60.0, 120.0, 0, 4)
    assert s.sources["margin"] == "default"
    assert s.sources["listen"] == "default: loopback, the CM runs on this machine"


def test_the_config_gives_each_setting_and_the_command_line_wins(tmp_path: Path) -> None:
    image = "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU24-64-STD"
    path = config(tmp_path, "[pilots]\nlisten = 127.0.0.2\n"
                            "public_url = http://ctl.example.org:8080/\n"
                            f"disk_image = {image}\n"
                            "hardware_type = m510\nnode_cores = 8\nmargin = 30\n"
                            "idle_timeout = never\nagent_timeout = 600\n"
                            "[endpoint]\nport = 8443\n[manager]\nmaxthreshold = 7\n")
    s = settings(path)
    assert (s.listen, s.public_url, s.hardware_type, s.node_cores) == \
        ("127.0.0.2", "http://ctl.example.org:8080", "m510", 8)
    assert s.image.endswith("//UBUNTU24-64-STD")
    assert (s.margin, s.idle_timeout, s.agent_timeout, s.endpoint_port, s.max_nodes) == \
        (30.0, math.inf, 600.0, 8443, 7)
    assert s.sources["listen"] == f"{path} [pilots] listen"
    assert s.sources["endpoint_port"] == f"{path} [endpoint] port"
    assert s.sources["max_nodes"] == f"{path} [manager] maxthreshold"
    s = resolve_settings(load_config(path, env={}), {
        "listen": "127.0.0.3", "public_url": "https://p.example.org/x", "image":
        "urn:publicid:IDN+utah.cloudlab.us+image+proj//MINE", "hardware_type": "xl170",
        "node_cores": "2", "margin": "1", "idle_timeout": "0", "agent_timeout": "5",
        "endpoint_port": "0"}, 3)
    assert (s.listen, s.public_url, s.hardware_type, s.node_cores, s.margin, s.idle_timeout,
            s.agent_timeout, s.endpoint_port, s.max_nodes) == \
        ("127.0.0.3", "https://p.example.org/x", "xl170", 2, 1.0, 0.0, 5.0, 0, 3)
    assert s.image.endswith("//MINE")
    assert s.sources["listen"] == "--listen" and s.sources["max_nodes"] == "--max-nodes"


def test_what_is_chosen_reaches_elastic_cluster(tmp_path: Path) -> None:
    """The contract's arguments, built as an ElasticCluster is (not started: no network)."""
    from elasticslice.pilots import ElasticCluster
    path = config(tmp_path, "[pilots]\nnode_cores = 3\nmargin = 12\nidle_timeout = 90\n"
                            "agent_timeout = 300\nhardware_type = d430\n"
                            "[endpoint]\nport = 9443\nurl = https://ctl.example.org:9443/\n"
                            "[manager]\nmaxthreshold = 6\nadd_cooldown = 20\n"
                            "interval.add_nodes = 7\n")
    s = settings(path, listen="127.0.0.1")
    args = s.cluster_arguments()
    assert "public_url" not in args          # only when set: works before and after it exists
    assert args["manager_options"]["agent_timeout"] == 300.0
    assert args["manager_options"]["endpoint"].url == "https://ctl.example.org:9443/"
    assert args["manager_options"]["endpoint"].port == 9443
    assert args["intervals"] == {"add_nodes": 7.0}
    cluster = ElasticCluster(object(), tmp_path / "state", **args)
    assert (cluster.listen, cluster.margin, cluster.node_cores, cluster.endpoint_port,
            cluster.hardware_type, cluster.maxthreshold) == ("127.0.0.1", 12.0, 3, 9443,
                                                             "d430", 6)
    assert cluster.policy.idle_timeout == 90.0 and cluster.policy.add_cooldown == 20.0
    assert cluster.intervals["add_nodes"] == 7.0
    assert args["metrics_port"] is None and cluster.metrics_port is None   # off by default
    port = settings(config(tmp_path, "[pilots]\nmetrics_port = 9464\n"))
    assert port.metrics_port == 9464 and port.sources["metrics_port"].endswith(
        "[pilots] metrics_port")
    assert settings(path, metrics_port="0").cluster_arguments()["metrics_port"] == 0
    never = settings(path, idle_timeout="off", public_url="http://ctl.example.org:8080")
    assert never.cluster_arguments()["idle_timeout"] is None   # ElasticCluster: never
    assert never.cluster_arguments()["public_url"] == "http://ctl.example.org:8080"


@pytest.mark.parametrize("option, value, says", [
    ("--listen", "ctl.example.org", "--listen ctl.example.org: not an IP address"),
    ("--listen", "0.0.0.0", "--listen 0.0.0.0: 0.0.0.0 is no address nodes can reach"),
    ("--public-url", "http://x.org/a?b=1", "--public-url http://x.org/a?b=1: not an http(s) URL"),
    ("--public-url", "file:///tmp", "--public-url file:///tmp: not an http(s) URL"),
    ("--image", "UBUNTU22", "--image UBUNTU22: disk image 'UBUNTU22' is"),
    ("--hardware-type", "m510;rm", "--hardware-type m510;rm: invalid hardware type"),
    ("--node-cores", "0", "--node-cores 0: must be 1 to 4096"),
    ("--margin", "soon", "--margin soon: not a number of seconds"),
    ("--idle-timeout", "-1", "--idle-timeout -1: must be 0 to"),
    ("--agent-timeout", "nan", "--agent-timeout nan: must be 0 to"),
    ("--endpoint-port", "70000", "--endpoint-port 70000: must be 0 to 65535"),
    ("--metrics-port", "70000", "--metrics-port 70000: must be 0 to 65535"),
    ("--metrics-port", "prom", "--metrics-port prom: not a port number: 'prom'"),
])
def test_a_bad_option_is_one_line_exit_2_and_nothing_made(tmp_path: Path, option: str,
                                                          value: str, says: str) -> None:
    result = run(config(tmp_path), tmp_path, option, value)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {says}"), result.output
    assert "Traceback" not in result.output and not (tmp_path / "d").exists()


@pytest.mark.parametrize("section, line, key, says", [
    ("pilots", "listen = nowhere", "pilots.listen", "not an IP address: 'nowhere'"),
    ("pilots", "public_url = ftp://x.org/", "pilots.public_url", "not an http(s) URL"),
    ("pilots", "node_cores = many", "pilots.node_cores", "not an integer: 'many'"),
    ("pilots", "margin = -5", "pilots.margin", "must be 0 to"),
    ("pilots", "idle_timeout = later", "pilots.idle_timeout", "not a number of seconds"),
    ("pilots", "agent_timeout = 0.5", "pilots.agent_timeout", "must be at least 1 second"),
    ("pilots", "hardware_type = m 510", "pilots.hardware_type", "invalid hardware type"),
    ("pilots", "disk_image = IMG", "pilots.disk_image", "disk image 'IMG' is"),
    ("pilots", "metrics_port = -1", "pilots.metrics_port", "must be 0 to 65535"),
    ("pilots", "listne = 10.0.0.1", "listne", "unknown key in [pilots]"),
    ("endpoint", "port = http", "endpoint.port", "not an integer: 'http'"),
    ("manager", "maxthreshold = 0", "maxthreshold", "must be at least 1"),
])
def test_a_bad_config_value_names_the_key_and_the_file_exit_2(
        tmp_path: Path, section: str, line: str, key: str, says: str) -> None:
    path = config(tmp_path, f"[{section}]\n{line}\n")
    result = run(path, tmp_path)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: [{key}] "), result.output
    assert says in lines[0] and not (tmp_path / "d").exists()


def test_help_explains_each_option_with_its_config_key() -> None:
    text = " ".join(CliRunner().invoke(cli, ["run", "--help"], terminal_width=200)
                    .output.split())
    for name, (section, key, _default, _help) in SETTINGS.items():
        option = "--" + name.replace("_", "-")
        assert option in text and f"Config [{section}] {key}." in text, option
    assert "Config [manager] maxthreshold" in text


def test_listen_defaults_to_loopback_for_the_box_and_to_a_routed_address_otherwise(
        tmp_path: Path) -> None:
    assert default_listen([BOX_CM]) == "127.0.0.1"
    assert default_listen(["https://localhost:12369/protogeni/xmlrpc/cm"]) == "127.0.0.1"
    # a CM elsewhere (TEST-NET-3): the address of the interface routed there, which is this
    # machine's and not loopback; loopback only when no route leads there at all
    chosen = default_listen(["https://203.0.113.7:12369/protogeni/xmlrpc/cm"])
    assert is_this_machine(chosen)
    s = settings(config(tmp_path, cm="https://203.0.113.7:12369/protogeni/xmlrpc/cm"))
    assert s.listen == chosen
    assert s.sources["listen"] == ("default: the address that routes to the CM"
                                   if chosen != "127.0.0.1" else
                                   "default: loopback, no route to the CM's host was found")
    s = settings(config(tmp_path, cm="https://cm.invalid:12369/protogeni/xmlrpc/cm"))
    assert s.listen == "127.0.0.1"   # doctor says so: loopback against a CM elsewhere
    assert s.sources["listen"] == "default: loopback, no route to the CM's host was found"


def test_a_run_uses_what_the_options_and_the_config_say(emulator: Any, tmp_path: Path
                                                        ) -> None:
    """A real run against the box (slow): the endpoint it registers is on --endpoint-port,
    and its run.log names each setting with where it came from."""
    import os
    import subprocess
    import sys
    port = spare_port()  # not one a port 0 bind gave back: another test's server takes those
    metrics = next(p for p in iter(spare_port, None) if p != port)
    conf = tmp_path / "elasticslice.conf"
    conf.write_text(emulator.config_path.read_text().replace(
        "[pilots]\n", "[pilots]\nmargin = 7\nhardware_type = m510\n", 1))
    state = tmp_path / "run"
    chain = FORKJOIN.parent / "helloworld-chain-5-chameleon.json"
    env = {**os.environ, "ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp_path / "cred-cache")}
    done = subprocess.run([sys.executable, "-m", "elasticslice.cli", "-c", str(conf), "run",
                           str(chain), "--state-dir", str(state), "--time-scale", "0.01",
                           "--max-nodes", "1", "--endpoint-port", str(port),
                           "--node-cores", "1", "--metrics-port", str(metrics),
                           "--report", str(tmp_path / "report.json")], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("DONE: 5/5 tasks done")
    # the metrics URL, named once; the report's timeline: from the run's start, by node
    assert done.stderr.count(f"metrics: http://127.0.0.1:{metrics}/metrics\n") == 1, \
        done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    first = min(t["start"] for t in report["tasks"])
    assert report["timeline"]["started"] < first
    assert [v["node"] for v in report["timeline"]["pilots"].values()] == ["node-1"]
    log = (state / "run.log").read_text()
    here = emulator.control_address  # the box's config says listen there
    daemon = (state / "daemon.log").read_text()   # the manager's: the manager daemon's log
    assert f"registered the endpoint https://{here}:{port}/ at" in daemon, daemon[-3000:]
    for said in (f"endpoint_port {port} (--endpoint-port)", "node_cores 1 (--node-cores)",
                 f"margin 7.0 ({conf} [pilots] margin)",
                 f"hardware_type 'm510' ({conf} [pilots] hardware_type)",
                 "max_nodes 1 (--max-nodes)", "idle_timeout 60.0 (default)",
                 f"metrics_port {metrics} (--metrics-port)",
                 f"listen '{here}' ({conf} [pilots] listen)" if here != "127.0.0.1" else
                 "listen '127.0.0.1' (default: loopback, the CM runs on this machine)"):
        assert said in log, said
