"""``[manager]`` and ``[endpoint]``: every key, defaults, env overrides, one-line errors."""
from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from elasticslice.errors import ConfigError
from elasticslice.managers.config import (
    DEF_INTERVALS, DEF_ORDER, ENDPOINT_KEYS, MANAGER_KEYS, EmailConfig, EndpointConfig,
    ManagerConfig, load_manager_config,
)
from elasticslice.managers.policy import PolicyConfig

CM_URLS = ("https://www.utah.cloudlab.us:12369/protogeni/xmlrpc/cm",
           "https://www.wisc.cloudlab.us:12369/protogeni/xmlrpc/cm",
           "https://www.clemson.cloudlab.us:12369/protogeni/xmlrpc/cm")


def write(tmp_path: Path, manager: str = "", endpoint: str | None = None) -> Path:
    text = "[protogeni]\ncm_urls = https://cm.example/cm\n"
    if manager is not None:
        text += "[manager]\n" + manager + "\n"
    if endpoint is not None:
        text += "[endpoint]\n" + endpoint + "\n"
    path = tmp_path / "elasticslice.conf"
    path.write_text(text)
    return path


def load(tmp_path: Path, manager: str = "", endpoint: str | None = None,
         env: dict[str, str] | None = None) -> ManagerConfig:
    return load_manager_config(write(tmp_path, manager, endpoint), env=env or {})


def bad(tmp_path: Path, key: str, manager: str = "", endpoint: str | None = None,
        env: dict[str, str] | None = None) -> str:
    """The error for a bad value: one line naming the key and the file."""
    with pytest.raises(ConfigError) as info:
        load(tmp_path, manager, endpoint, env)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'elasticslice.conf'}: [{key}] "), message
    return message


def test_missing_sections_mean_defaults(tmp_path):
    cfg = load_manager_config(write(tmp_path, manager=None), env={})
    assert cfg == ManagerConfig(path=tmp_path / "elasticslice.conf")
    assert (cfg.minthreshold, cfg.maxthreshold, cfg.percent_available_minimum,
            cfg.enable_delete, cfg.retry_interval) == (1, 10, 0.5, False, 30.0)
    assert cfg.intervals == DEF_INTERVALS
    assert cfg.state_dir == Path("~/.protogeni/elasticslice-state").expanduser()
    assert cfg.email == EmailConfig() and not cfg.email.enabled
    assert cfg.endpoint == EndpointConfig() and cfg.endpoint.address == "127.0.0.1"
    assert cfg.policy() == PolicyConfig()


def test_every_manager_key(tmp_path):
    (tmp_path / "smtp.pw").write_text("secret\n")
    cfg = load(tmp_path, """
minthreshold = 2
maxthreshold = 20
percent_available_minimum = 0.25
enable_delete = yes
retry_interval = 12.5
nodetype = d430
cmlist = wisc, 0
num_pcs = 3
image_urn = urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU22-64-STD
startup_command = /local/run.sh --fast
tarballs = https://example.org/app.tar.gz /
    https://example.org/data.tgz /
node_prefix = worker
lan_prefix = net
num_lans = 2
multiplex_lans = true
state_dir = state
renew_hours = 12
renew_margin = 7200
idle_timeout = 900
add_cooldown = 5
delete_cooldown = 30
max_add_per_cycle = 4
max_delete_per_cycle = 2
hysteresis = 0.05
delete_in_group = false
email = on
email_to = ops@example.org, me@example.org
email_from = manager@example.org
smtp_host = 127.0.0.1
smtp_port = 2525
smtp_starttls = true
smtp_username = me
smtp_password_file = smtp.pw
interval.add_nodes = 30
interval.get_system_state = 15
""")
    assert (cfg.minthreshold, cfg.maxthreshold, cfg.percent_available_minimum) == (2, 20, 0.25)
    assert cfg.enable_delete and cfg.retry_interval == 12.5 and cfg.nodetype == "d430"
    assert cfg.cmlist == ("wisc", "0") and cfg.num_pcs == 3
    assert cfg.image_urn.endswith("UBUNTU22-64-STD")
    assert cfg.startup_command == "/local/run.sh --fast"
    assert cfg.tarballs == (("https://example.org/app.tar.gz", "/"),
                            ("https://example.org/data.tgz", "/"))
    assert (cfg.node_prefix, cfg.lan_prefix, cfg.num_lans, cfg.multiplex_lans) == (
        "worker", "net", 2, True)
    assert cfg.state_dir == tmp_path / "state"
    assert (cfg.renew_hours, cfg.renew_margin, cfg.idle_timeout) == (12.0, 7200.0, 900.0)
    assert (cfg.add_cooldown, cfg.delete_cooldown, cfg.max_add_per_cycle,
            cfg.max_delete_per_cycle, cfg.hysteresis, cfg.delete_in_group) == (
        5.0, 30.0, 4, 2, 0.05, False)
    assert cfg.email == EmailConfig(True, ("ops@example.org", "me@example.org"),
                                    "manager@example.org", "127.0.0.1", 2525, True, "me",
                                    tmp_path / "smtp.pw")
    assert cfg.intervals == {**DEF_INTERVALS, "add_nodes": 30.0, "get_system_state": 15.0}
    assert "secret" not in repr(cfg)
    policy = cfg.policy(CM_URLS)
    assert policy == PolicyConfig(2, 20, 0.25, True, "d430", (CM_URLS[1], CM_URLS[0]), 4, 5.0,
                                  30.0, 2, 0.05, 900.0)


def test_every_endpoint_key(tmp_path):
    (tmp_path / "srv.pem").write_text("x")
    (tmp_path / "srv.key").write_text("x")
    (tmp_path / "pw").write_text("x")
    cfg = load(tmp_path, endpoint="""
address = 127.0.0.1
port = 8443
url = https://ctl.example.org:8443/
cm_urn = urn:publicid:IDN+utah.cloudlab.us+authority+cm
certificate = srv.pem
keyfile = srv.key
passphrase_file = pw
enabled = false
""")
    assert cfg.endpoint == EndpointConfig("127.0.0.1", 8443, "https://ctl.example.org:8443/",
                                          "urn:publicid:IDN+utah.cloudlab.us+authority+cm",
                                          tmp_path / "srv.pem", tmp_path / "srv.key",
                                          tmp_path / "pw", False)


def test_environment_overrides(tmp_path):
    cfg = load(tmp_path, "maxthreshold = 5\n", "port = 1\n", env={
        "ELASTICSLICE_MAXTHRESHOLD": "7", "ELASTICSLICE_INTERVAL_ADD_NODES": "2",
        "ELASTICSLICE_ENDPOINT_PORT": "9000", "ELASTICSLICE_SLICE_NAME": "other-tool",
        "ELASTICSLICE_ENABLE_DELETE": ""})
    assert cfg.maxthreshold == 7 and cfg.intervals["add_nodes"] == 2.0
    assert cfg.endpoint.port == 9000 and not cfg.enable_delete


def test_bad_value_from_the_environment_names_the_variable(tmp_path):
    msg = bad(tmp_path, "maxthreshold", env={"ELASTICSLICE_MAXTHRESHOLD": "many"})
    assert "$ELASTICSLICE_MAXTHRESHOLD" in msg
    msg = bad(tmp_path, "endpoint.port", env={"ELASTICSLICE_ENDPOINT_PORT": "-1"})
    assert "$ELASTICSLICE_ENDPOINT_PORT" in msg


@pytest.mark.parametrize("line, key, words", [
    ("minthreshold = -1", "minthreshold", "at least 0"),
    ("minthreshold = 1.5", "minthreshold", "not an integer"),
    ("maxthreshold = 0", "maxthreshold", "at least 1"),
    ("maxthreshold = ten", "maxthreshold", "not an integer"),
    ("percent_available_minimum = 1.5", "percent_available_minimum", "at most 1"),
    ("percent_available_minimum = -0.1", "percent_available_minimum", "at least 0"),
    ("percent_available_minimum = 50%", "percent_available_minimum", "not a number"),
    ("percent_available_minimum = nan", "percent_available_minimum", "finite"),
    ("enable_delete = maybe", "enable_delete", "not a boolean"),
    ("retry_interval = 0", "retry_interval", "at least"),
    ("retry_interval = inf", "retry_interval", "finite"),
    ("nodetype = d430 m510", "nodetype", "invalid hardware type"),
    ("num_pcs = -2", "num_pcs", "at least 0"),
    ("image_urn = ubuntu", "image_urn", "not a URN"),
    ("tarballs = https://x/a.tgz", "tarballs", "URL /install/path"),
    ("tarballs = file:///a.tgz /opt", "tarballs", "URL /install/path"),
    ("tarballs = https://x/a.tgz /opt", "tarballs", "AddNodes installs tarballs at / only"),
    ("startup_command = echo 'hi'", "startup_command", "would break CloudLab's AddNodes XML"),
    (f"startup_command = {'x' * 256}", "startup_command", "Invalid startup command: Too Long"),
    ("node_prefix = 9node", "node_prefix", "invalid name"),
    ("lan_prefix = lan_x", "lan_prefix", "invalid name"),
    ("num_lans = x", "num_lans", "not an integer"),
    ("multiplex_lans = 2", "multiplex_lans", "not a boolean"),
    ("renew_hours = 0", "renew_hours", "at least"),
    ("renew_margin = -5", "renew_margin", "at least 0"),
    ("idle_timeout = soon", "idle_timeout", "not a number"),
    ("add_cooldown = -1", "add_cooldown", "at least 0"),
    ("delete_cooldown = x", "delete_cooldown", "not a number"),
    ("max_add_per_cycle = 0", "max_add_per_cycle", "at least 1"),
    ("max_delete_per_cycle = -1", "max_delete_per_cycle", "at least 0"),
    ("hysteresis = 2", "hysteresis", "at most 1"),
    ("delete_in_group = sometimes", "delete_in_group", "not a boolean"),
    ("email = perhaps", "email", "not a boolean"),
    ("email = true", "email_to", "missing"),
    ("email_to = not-an-address", "email_to", "not an email address"),
    ("email_from = a@b@c", "email_from", "not an email address"),
    ("smtp_host = mail host", "smtp_host", "not a host"),
    ("smtp_port = 70000", "smtp_port", "at most 65535"),
    ("smtp_starttls = tls", "smtp_starttls", "not a boolean"),
    ("smtp_password_file = missing.pw", "smtp_password_file", "no such file"),
    ("interval.add_nodes = 0", "interval.add_nodes", "at least"),
    ("interval.add_nodes = often", "interval.add_nodes", "not a number"),
    ("interval.make_coffee = 5", "interval.make_coffee", "unknown cycle method"),
    ("minthreshold = 5\nmaxthreshold = 4", "minthreshold", "greater than maxthreshold (4)"),
    ("colour = blue", "colour", "unknown key in [manager]"),
])
def test_bad_manager_values(tmp_path, line, key, words):
    assert words in bad(tmp_path, key, line)


@pytest.mark.parametrize("line, key, words", [
    ("address = example.org", "endpoint.address", "not an IP address"),
    ("port = 65536", "endpoint.port", "at most 65535"),
    ("port = http", "endpoint.port", "not an integer"),
    ("url = http://ctl.example.org/", "endpoint.url", "not an https URL"),
    ("cm_urn = utah", "endpoint.cm_urn", "not a URN"),
    ("certificate = nope.pem", "endpoint.certificate", "no such file"),
    ("keyfile = nope.key", "endpoint.keyfile", "no such file"),
    ("passphrase_file = nope", "endpoint.passphrase_file", "no such file"),
    ("enabled = kinda", "endpoint.enabled", "not a boolean"),
    ("colour = blue", "endpoint.colour", "unknown key in [endpoint]"),
])
def test_bad_endpoint_values(tmp_path, line, key, words):
    assert words in bad(tmp_path, key, endpoint=line)


def test_idle_timeout_off_and_thresholds_equal(tmp_path):
    cfg = load(tmp_path, "idle_timeout = none\nminthreshold = 3\nmaxthreshold = 3")
    assert cfg.idle_timeout is None and cfg.minthreshold == cfg.maxthreshold == 3


def test_every_cycle_method_has_an_interval_key(tmp_path):
    lines = "\n".join(f"interval.{m} = {i + 1}" for i, m in enumerate(DEF_ORDER))
    cfg = load(tmp_path, lines)
    assert [cfg.intervals[m] for m in DEF_ORDER] == [float(i + 1) for i in range(len(DEF_ORDER))]


def test_missing_file_and_broken_ini(tmp_path):
    with pytest.raises(ConfigError, match="nope.conf: config file not found"):
        load_manager_config(tmp_path / "nope.conf", env={})
    path = tmp_path / "broken.conf"
    path.write_text("[manager]\nmaxthreshold = 3\nmaxthreshold = 4\n")
    with pytest.raises(ConfigError, match=r"broken.conf: line 3: key 'maxthreshold' given twice"):
        load_manager_config(path, env={})


@pytest.mark.parametrize("cmlist, expected", [
    ("", CM_URLS), ("utah", CM_URLS[:1]), ("2 utah", (CM_URLS[2], CM_URLS[0])),
    (CM_URLS[1], CM_URLS[1:2]), ("wisc, 1", CM_URLS[1:2]),
])
def test_cmlist_resolves_against_cm_urls(tmp_path, cmlist, expected):
    assert load(tmp_path, f"cmlist = {cmlist}").cms(CM_URLS) == expected


@pytest.mark.parametrize("cmlist, words", [("cloudlab", "matches 3"), ("7", "no CM number 7"),
                                           ("apt", "matches 0")])
def test_cmlist_that_matches_no_single_cm(tmp_path, cmlist, words):
    cfg = load(tmp_path, f"cmlist = {cmlist}")
    with pytest.raises(ConfigError, match=r"\[cmlist\] .*" + words):
        cfg.policy(CM_URLS)


def test_example_config_manager_and_endpoint_sections(repo_root, tmp_path):
    example = repo_root / "etc" / "elasticslice.conf.example"
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
    parser.read(example)
    keys = set(parser["manager"])
    assert {k for k in keys if not k.startswith("interval.")} <= set(MANAGER_KEYS)
    assert set(parser["endpoint"]) <= set(ENDPOINT_KEYS)
    # every key is described in the example (commented out or set)
    text = example.read_text()
    for key in MANAGER_KEYS + ENDPOINT_KEYS:
        assert f"\n# {key} = " in text or f"\n{key} = " in text, key
    cfg = load_manager_config(example, env={})
    assert cfg.maxthreshold == 10 and cfg.endpoint.address == "127.0.0.1"
