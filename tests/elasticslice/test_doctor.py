"""`elasticslice doctor` as a user runs it (a subprocess) against the box: every check passes
on the box's own config, and each check fails, with what to do, when the user gets its part
wrong: a wrong passphrase, a CM that does not answer, a slice name taken, loopback addresses
against a CM elsewhere, an address that is not this machine's, a port taken, an image whose
Python cannot run the agent, the callback endpoint turned off."""
from __future__ import annotations

import contextlib
import io
import re
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from elasticslice.commands.doctor import Check, image_python, wheelhouse_check
from tests.elasticslice.rpc.helpers import genilib_request
from tests.helpers import REPO, spare_port

# every test with the emulator fixture is slow (tests/conftest.py); the others are not

NAMES = ["certificate", "sa", "cm 0", "slice", "addresses", "ports", "wheelhouse", "endpoint 0"]


def doctor(config: Path, tmp: Path, *args: str) -> tuple[int, list[str], str]:
    """``elasticslice -c CONFIG doctor ARGS``: exit status, stdout lines, stderr."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp),
           "ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp / "cred-cache")}
    done = subprocess.run([sys.executable, "-m", "elasticslice.cli", "-c", str(config),
                           "doctor", "--connect-timeout", "5", *args], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout.splitlines(), done.stderr


def line(lines: list[str], name: str) -> str:
    found = [x for x in lines if re.match(rf"^(ok|FAIL|skip) +{re.escape(name)}:", x)]
    assert len(found) == 1, (name, lines)
    return found[0]


def variant(emulator: Any, tmp: Path, replace: dict[str, str] | None = None,
            drop: tuple[str, ...] = (), extra: str = "") -> Path:
    """A copy of the box's client config with keys replaced or dropped and text added."""
    text = emulator.config_path.read_text()
    for key, value in (replace or {}).items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    for key in drop:
        text = re.sub(rf"^{key} = .*\n", "", text, flags=re.M)
    path = tmp / "elasticslice.conf"
    path.write_text(text + extra)
    return path


ELSEWHERE = "https://cm.invalid:12369/protogeni/xmlrpc"  # a CM not on this machine


def cm_elsewhere(emulator: Any, tmp: Path, drop: tuple[str, ...] = ()) -> Path:
    """The box's config with its CM and dynamic-slice server elsewhere (a name that does not
    resolve): what doctor says against CloudLab."""
    return variant(emulator, tmp, {"cm_urls": f"{ELSEWHERE}/cm",
                                   "dynslice_urls": f"{ELSEWHERE}/dynslice"}, drop=drop)


def closed_port() -> int:
    return spare_port()  # nothing listens there, and no other test's server will


def test_doctor_passes_against_the_box(emulator: Any, tmp_path: Path) -> None:
    code, lines, err = doctor(emulator.config_path, tmp_path)
    assert code == 0, (lines, err)
    assert [line(lines, n).split()[0] for n in NAMES] == ["ok"] * len(NAMES), lines
    assert lines[-1] == f"all {len(NAMES)} checks passed: `elasticslice run` can start"
    # the box's nodes on networks of their own: listen is the box's control address
    assert line(lines, "addresses") == (
        f"ok   addresses: listen {emulator.control_address} ({emulator.config_path} "
        f"[pilots] listen): where the box's nodes reach this machine"
        if emulator.control_address != "127.0.0.1" else
        "ok   addresses: the CM runs on this machine (the box)")
    assert "is free (the run creates it)" in line(lines, "slice")


def test_a_wrong_passphrase_fails_the_certificate(emulator: Any, tmp_path: Path) -> None:
    wrong = tmp_path / "password"
    wrong.write_text("not-the-passphrase\n")
    code, lines, err = doctor(variant(emulator, tmp_path, {"passphrase_file": str(wrong)}),
                              tmp_path)
    assert code == 1
    got = line(lines, "certificate")
    assert got.startswith("FAIL certificate:") and "wrong passphrase" in got
    assert got.endswith("-> put the key's passphrase (your CloudLab password) in "
                        "passphrase_file, or $PROTOGENI_PASSPHRASE")
    assert line(lines, "slice").startswith("skip")
    assert re.fullmatch(r"\d+ of \d+ checks did not pass", err.strip()), err


def test_a_ca_bundle_the_servers_do_not_chain_to_fails(emulator: Any, tmp_path: Path) -> None:
    from elasticslice.rpc.pki import make_ca
    other = tmp_path / "other-ca.pem"
    other.write_bytes(make_ca("not the testbed's CA")[0])
    code, lines, _ = doctor(variant(emulator, tmp_path, {"ca_bundle": str(other)}), tmp_path)
    assert code == 1
    got = line(lines, "sa")
    assert got.startswith("FAIL sa:") and got.endswith(
        "-> add the CA the server's certificate chains to to ca_bundle (docs/cloudlab.md)"), got


def test_a_cm_that_does_not_answer_fails(emulator: Any, tmp_path: Path) -> None:
    dead = f"https://127.0.0.1:{closed_port()}/protogeni/xmlrpc"
    code, lines, _ = doctor(variant(emulator, tmp_path, {"cm_urls": f"{dead}/cm",
                                                         "dynslice_urls": f"{dead}/dynslice"}),
                            tmp_path)
    assert code == 1
    assert line(lines, "sa").startswith("ok")
    got = line(lines, "cm 0")
    assert got.startswith(f"FAIL cm 0: {dead}/cm does not answer GetVersion")
    assert "-> check cm_urls" in got
    assert line(lines, "slice").startswith("skip")
    assert line(lines, "endpoint 0").startswith("FAIL endpoint 0:")


def test_a_slice_name_someone_uses_fails(emulator: Any, tmp_path: Path) -> None:
    """A slice that holds no sliver is one a run reuses (docs/manager.md); one that holds a
    sliver fails, naming the CM."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "ELASTICSLICE_CREDENTIAL_CACHE_DIR": str(tmp_path / "cred-cache")}
    subprocess.run([sys.executable, "-m", "elasticslice.cli", "-c", str(emulator.config_path),
                    "create-slice"], env=env, check=True, capture_output=True)
    code, lines, _ = doctor(emulator.config_path, tmp_path)
    assert line(lines, "slice").endswith("exists and holds no sliver (the run reuses it)")
    rspec = tmp_path / "req.xml"
    rspec.write_text(genilib_request("node-0"))
    subprocess.run([sys.executable, "-m", "elasticslice.cli", "-c", str(emulator.config_path),
                    "create-sliver", str(rspec)], env=env, check=True, capture_output=True)
    code, lines, _ = doctor(emulator.config_path, tmp_path)
    assert code == 1
    got = line(lines, "slice")
    assert got.startswith("FAIL slice:") and "exists already, holds a sliver at 127.0.0.1:" in got
    assert "-> give another slice_name" in got


def test_loopback_addresses_fail_against_a_cm_elsewhere(emulator: Any, tmp_path: Path
                                                        ) -> None:
    """A CM that is not on this machine (here one whose name does not resolve) cannot reach
    loopback: listen and public_url there fail; the same options pass against the box."""
    config = cm_elsewhere(emulator, tmp_path)
    code, lines, _ = doctor(config, tmp_path, "--listen", "127.0.0.1", "--public-url",
                            "http://localhost:8080/")
    assert code == 1
    got = line(lines, "addresses")
    assert got.startswith("FAIL addresses: listen 127.0.0.1 (--listen) is loopback; public_url "
                          "http://localhost:8080 (--public-url) is loopback:")
    assert "-> set --listen / [pilots] listen to this machine's public address" in got
    assert line(lines, "endpoint").startswith("FAIL endpoint: https://127.0.0.1:PORT/ is "
                                              "loopback: the CM cannot call it")
    assert line(lines, "cm 0").startswith("FAIL cm 0:")
    # against the box, where its nodes reach this machine passes
    here = emulator.control_address
    code, lines, _ = doctor(emulator.config_path, tmp_path, "--listen", here,
                            "--public-url", f"http://{here}:8080/")
    assert code == 0 and line(lines, "addresses").startswith("ok"), lines


def test_a_private_listen_address_behind_nat_fails_against_a_cm_elsewhere(
        emulator: Any, tmp_path: Path) -> None:
    """Behind a NAT the scheduler's and enrolment's addresses are given to the nodes as they
    are (public_url rewrites only the publisher's URLs): the nodes would dial a private
    address. doctor refuses it; the box's own control address (private to this machine, and
    where its nodes are) passes against the box."""
    config = cm_elsewhere(emulator, tmp_path)
    code, lines, _ = doctor(config, tmp_path, "--listen", "192.168.7.2", "--public-url",
                            "http://ctl.example.org:8080/")
    assert code == 1
    got = line(lines, "addresses")
    assert got.startswith("FAIL addresses: listen 192.168.7.2 (--listen) is a private "
                          "address: CloudLab's nodes reach the scheduler and enrolment at "
                          "that very address")
    assert "-> run the control node where its own address is public" in got


def test_fixed_ports_are_checked_and_named(emulator: Any, tmp_path: Path) -> None:
    here = emulator.control_address
    with socket.socket() as taken:
        taken.bind((here, 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = closed_port()
        code, lines, _ = doctor(emulator.config_path, tmp_path, "--publish-port", str(port),
                                "--scheduler-port", str(free))
        assert code == 1
        assert line(lines, "ports") == (
            f"FAIL ports: cannot bind {here} port {port} for the tarball publisher "
            f"(--publish-port): Address already in use -> stop what holds the port, or "
            f"choose another --publish-port / [pilots] publish_port")
    code, lines, _ = doctor(emulator.config_path, tmp_path, "--publish-port", str(port),
                            "--enrol-port", str(free))
    assert code == 0, lines
    assert line(lines, "ports") == (
        f"ok   ports: {here}: ports {free} for enrolment, {port} for the tarball publisher; "
        f"free ports for the callback endpoint, the Dask scheduler can be bound")


def test_a_public_url_from_the_config_is_named_with_its_file(emulator: Any,
                                                            tmp_path: Path) -> None:
    networked = emulator.control_address != "127.0.0.1"
    config = cm_elsewhere(emulator, tmp_path, drop=("listen",) if networked else ())
    text = config.read_text().replace("[pilots]\n", "[pilots]\npublic_url = http://127.0.0.1:9/\n"
                                      "listen = 127.0.0.1\n", 1)
    config.write_text(text)
    _, lines, _ = doctor(config, tmp_path)
    got = line(lines, "addresses")
    assert got.startswith("FAIL addresses:")
    assert f"listen 127.0.0.1 ({config} [pilots] listen) is loopback" in got
    assert f"public_url http://127.0.0.1:9 ({config} [pilots] public_url) is loopback" in got


def test_a_port_taken_fails(emulator: Any, tmp_path: Path) -> None:
    here = emulator.control_address  # the box config's listen
    with socket.socket() as taken:
        taken.bind((here, 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines, _ = doctor(emulator.config_path, tmp_path, "--endpoint-port", str(port))
        assert code == 1
        got = line(lines, "ports")
        assert got.startswith(f"FAIL ports: cannot bind {here} port {port} for the callback "
                              f"endpoint (--endpoint-port):")
        assert got.endswith("-> stop what holds the port, or choose another --endpoint-port / "
                            "[endpoint] port")
        config = variant(emulator, tmp_path, extra=f"\n[endpoint]\nport = {port}\n")
        code, lines, _ = doctor(config, tmp_path)
        assert code == 1 and f"({config} [endpoint] port)" in line(lines, "ports")


def test_a_listen_address_not_of_this_machine_fails(emulator: Any, tmp_path: Path) -> None:
    code, lines, _ = doctor(emulator.config_path, tmp_path, "--listen", "203.0.113.9")
    assert code == 1
    assert line(lines, "ports").startswith("FAIL ports: listen 203.0.113.9 is not an address "
                                           "of this machine")


def test_an_image_whose_python_cannot_run_the_agent_fails(emulator: Any,
                                                          tmp_path: Path) -> None:
    """Without node_python the nodes build the agent's environment with the image's python3:
    Ubuntu 20.04's 3.8 is too old (on CloudLab: the box's nodes run this machine's)."""
    config = cm_elsewhere(emulator, tmp_path, drop=("node_python",))
    code, lines, _ = doctor(config, tmp_path, "--image",
                            "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU20-64-STD")
    assert code == 1
    got = line(lines, "wheelhouse")
    assert got.startswith("FAIL wheelhouse: the image's Python 3.8 is older than the node "
                          "agent needs (3.10)")
    assert "-> use a newer image" in got
    code, lines, _ = doctor(variant(emulator, tmp_path, drop=("node_python",)), tmp_path,
                            "--image",
                            "urn:publicid:IDN+emulab.net+image+emulab-ops//UBUNTU20-64-STD")
    here = "%d.%d" % sys.version_info[:2]
    assert line(lines, "wheelhouse") == (f"ok   wheelhouse: the image's Python {here} is this "
                                         f"control node's") or "wheelhouse for Python" in \
        line(lines, "wheelhouse")


def test_the_endpoint_turned_off_fails(emulator: Any, tmp_path: Path) -> None:
    config = variant(emulator, tmp_path, extra="\n[endpoint]\nenabled = false\n")
    code, lines, _ = doctor(config, tmp_path)
    assert code == 1
    assert line(lines, "endpoint").startswith("FAIL endpoint: disabled ([endpoint] enabled = "
                                              "false)")


def test_a_bad_option_is_one_line_and_exit_2(emulator: Any, tmp_path: Path) -> None:
    code, lines, err = doctor(emulator.config_path, tmp_path, "--listen", "nowhere")
    assert code == 2 and lines == []
    assert err.strip() == "Error: --listen nowhere: not an IP address: 'nowhere'"


def test_the_python_of_images_and_the_wheelhouse_seam() -> None:
    """What the wheelhouse check knows without a CM: the standard images' Python, and that
    an image Python equal to this control node's is served."""
    class S:
        image = "urn:publicid:IDN+emulab.net+image+emulab-ops:UBUNTU24-64-STD"
    assert image_python(S(), cm_local=False) == "3.12"
    S.image = "urn:publicid:IDN+utah.cloudlab.us+image+proj//CUSTOM"
    assert image_python(S(), cm_local=False) is None
    here = "%d.%d" % sys.version_info[:2]
    assert wheelhouse_check(here)[0] is True
    assert wheelhouse_check("3.6")[0] is False
    assert Check("x", "FAIL", "d", "f").line() == "FAIL x: d -> f"


class FakePortal(types.ModuleType):
    """The part of CloudLab's ``geni.portal`` a profile uses (PyPI's geni-lib ships a
    Python 2 portal.py; ``geni.rspec.pg``, which builds the request, is the real one)."""

    class ParameterType:
        STRING, INTEGER, BOOLEAN, NODETYPE, IMAGE = ("string", "integer", "boolean",
                                                     "nodetype", "image")

    class Context:
        def __init__(self) -> None:
            self.defaults: dict[str, Any] = {}

        def defineParameter(self, name: str, description: str, kind: str, default: Any,
                            legalValues: Any = None, longDescription: str = "",
                            **options: Any) -> None:  # noqa: N802, N803 - geni-lib's names
            assert name not in self.defaults and description and kind
            self.defaults[name] = default

        def bindParameters(self) -> Any:  # noqa: N802
            return types.SimpleNamespace(**self.defaults)

        def makeRequestRSpec(self) -> Any:  # noqa: N802
            import geni.rspec.pg as pg
            return pg.Request()

        def printRequestRSpec(self, request: Any) -> None:  # noqa: N802
            print(request.toXMLString(pretty_print=True, ucode=True))


def test_the_control_node_profile_makes_a_valid_request(monkeypatch: Any) -> None:
    """examples/cloudlab/control-node.py, run as CloudLab's portal runs a profile: one
    bare-metal node named control booting a standard image whose Python runs elasticslice,
    and a request RSpec the GENI v3 schema accepts."""
    pytest.importorskip("geni.rspec.pg")
    from elasticslice.rspec import parse, validate
    profile = REPO / "examples" / "cloudlab" / "control-node.py"
    code = compile(profile.read_text(), str(profile), "exec")
    portal = FakePortal("geni.portal")
    portal.context = portal.Context()
    monkeypatch.setitem(sys.modules, "geni.portal", portal)
    import geni
    monkeypatch.setattr(geni, "portal", portal, raising=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"__name__": "__main__"})
    xml = out.getvalue()
    assert validate(xml) == [], validate(xml)
    request = parse(xml)
    assert [n.client_id for n in request.nodes] == ["control"]
    node = request.nodes[0]
    assert node.disk_image.endswith("//UBUNTU24-64-STD") and node.exclusive
    class S:
        image = node.disk_image
    assert image_python(S(), cm_local=False) == "3.12"


def test_a_metrics_port_taken_fails_the_ports_check(tmp_path: Path) -> None:
    """In-process: the settings as a run resolves them, the check binds for real."""
    from elasticslice.commands.doctor import check_ports
    from elasticslice.commands.run import resolve_settings
    from elasticslice.config import load_config
    (tmp_path / "user.pem").write_text("not read here\n")
    (tmp_path / "ca.pem").write_text("not read here\n")
    conf = tmp_path / "c.conf"
    conf.write_text("[protogeni]\ncertificate = user.pem\nca_bundle = ca.pem\n"
                    "cm_urls = https://127.0.0.1:1/protogeni/xmlrpc/cm\nslice_name = s1\n")
    client = load_config(conf, env={})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        got = check_ports(resolve_settings(client, {"metrics_port": str(port)}))
        assert got.status == "FAIL", got
        assert got.detail.startswith(f"cannot bind 127.0.0.1 port {port} for the metrics "
                                     f"(--metrics-port): ")
        assert "--metrics-port" in got.fix
    free = check_ports(resolve_settings(client, {"metrics_port": "0"}))
    assert free.status == "ok", free


def test_building_the_wheelhouse_adds_no_line_in_front_of_the_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The first doctor on a machine builds the nodes' wheelhouse: the builder's own INFO
    line ("built the wheelhouse ...") came before the checks (the wheelhouse check's line
    says what came of it). The build here is of one wheel, pip's, in a copy of the shared
    cache (a whole wheelhouse from nothing costs 4 to 5 s of CPU and logs the same line)."""
    import logging
    import shutil

    from elasticslice.pilots import wheelhouse
    version = "%d.%d" % sys.version_info[:2]
    shared = wheelhouse.Wheelhouse.for_python(version)   # built once a machine, as elsewhere
    mine = tmp_path / "wheelhouse" / shared.directory.name
    shutil.copytree(shared.directory, mine)
    [pip_wheel] = (mine / "tools").glob("pip-*.whl")
    pip_wheel.unlink()                                   # so this doctor builds
    monkeypatch.setattr(wheelhouse, "cache_root", lambda: tmp_path / "wheelhouse")
    caplog.clear()
    caplog.set_level(logging.INFO)
    passed, detail, _ = wheelhouse_check(version)
    assert passed, detail
    assert pip_wheel.exists()  # it was built, here
    assert [r.getMessage() for r in caplog.records
            if r.name == "elasticslice.pilots.wheelhouse"] == []
    assert logging.getLogger("elasticslice.pilots.wheelhouse").level == logging.NOTSET
