"""A node booted from the stock image builds the node agent's environment with its own
python3 from the control node's wheelhouse root, served over HTTP: the versions the control
node runs, reused on a second run, one line and exit status 1 when something is missing.
(The root against other Pythons, ARM64, reboots and the experiment's user:
test_node_install.py.)"""
from __future__ import annotations

import importlib.metadata as md
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from elasticslice.emulator import isolate
from elasticslice.pilots import wheeltags
from elasticslice.pilots.bootstrap import env_script, installer
from elasticslice.pilots.publish import TarballPublisher
from elasticslice.pilots.wheelhouse import Wheelhouse, WheelhouseError
from elasticslice.pilots.wheelroot import WheelhouseRoot
from elasticslice.rspec import NodeSpec, build_request
from tests.elasticslice.emulator.helpers import Session, as_script
from tests.elasticslice.emulator.node_helpers import add_node, exited, runlog
from tests.elasticslice.pilots.helpers import serve_directory

NAMESPACES = pytest.mark.skipif(
    isolate.choose({}).isolation is not isolate.Isolation.NAMESPACES,
    reason=f"Linux namespaces unavailable here: {isolate.choose({}).reason}")

SHEBANG = "#!/bin/sh\n"
VERSIONS = ('"$py" -c "import sys, importlib.metadata as m, troy.frameworks.dask.agent, dask, '
            "distributed, cryptography; print('versions', sys.base_prefix, "
            "m.version('elasticslice'), dask.__version__, distributed.__version__, "
            "cryptography.__version__)\"\n")


def control_versions() -> str:
    """What the control node runs, as the node's line prints it (the image's python3 is
    /usr/bin/python3: its prefix is /usr)."""
    return " ".join(["versions", "/usr", *(md.version(n) for n in
                                          ("elasticslice", "dask", "distributed",
                                           "cryptography"))])


def run_host(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run by sh with as bare an environment as a node's startup command."""
    path = tmp_path / "start.sh"
    path.write_text(script)
    return subprocess.run(["sh", str(path)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path),
                               "LANG": "C.UTF-8"})


# ------------------------------------------------------------------ the script itself ------
def test_an_image_with_the_agent_only_names_its_python() -> None:
    assert env_script(None, python="python3") == "py=python3\n"
    assert env_script(None, python="/opt/agent/bin/python3") == "py=/opt/agent/bin/python3\n"


def test_what_is_not_a_url_or_a_folder_is_refused() -> None:
    with pytest.raises(ValueError, match="wheelhouse_url must be an http"):
        env_script("file:///srv/wheelhouse")
    with pytest.raises(ValueError, match="index_url must be an http"):
        env_script("http://h/w/", index=True, index_url="ftp://mirror/simple")
    with pytest.raises(ValueError, match="index_url must be an http"):
        env_script("http://h/w/", index=True, index_url="/simple/")
    with pytest.raises(ValueError, match="wait must be seconds"):
        env_script("http://h/w/", wait=-1)
    with pytest.raises(ValueError, match="target must be an absolute path"):
        env_script("http://h/w/", target="local/env")
    with pytest.raises(ValueError, match="python must be a command"):
        env_script("http://h/w/", python="python3\nrm -rf /")


def test_a_wheelhouse_that_is_not_there_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """The path of the URL (the publisher's unguessable prefix) is not printed."""
    with serve_directory(tmp_path) as url:
        done = run_host(env_script(f"{url}/unguessable/", target=str(tmp_path / "env"),
                                   root=False)
                        + 'echo "reached with $py"\n', tmp_path)
    assert done.returncode == 1
    assert done.stderr == (f"pilot environment: cannot fetch wheels.txt from the wheelhouse "
                           f"at {url}/...: HTTP 404\n")
    assert "reached" not in done.stdout and "unguessable" not in done.stdout + done.stderr
    assert not (tmp_path / "env").exists()


def test_a_wheel_that_is_not_the_one_listed_is_refused(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    (house / "tblib-1-py3-none-any.whl").write_bytes(b"not the wheel\n")
    (house / "wheels.txt").write_text(f"# python {sys.version_info[0]}."
                                      f"{sys.version_info[1]} platform x\n"
                                      f"{'0' * 64} 14 tblib-1-py3-none-any.whl\n")
    with serve_directory(house) as url:
        done = run_host(env_script(url, python=sys.executable, target=str(tmp_path / "env"),
                                   root=False), tmp_path)
    assert done.returncode == 1
    assert done.stderr == (f"pilot environment: tblib-1-py3-none-any.whl from the wheelhouse "
                           f"at {url}/... does not match its sha256\n")


def test_a_wheelhouse_for_another_python_is_refused(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    (house / "wheels.txt").write_text("# python 2.7 platform x\n")
    with serve_directory(house) as url:
        done = run_host(env_script(url, python=sys.executable, target=str(tmp_path / "env"),
                                   root=False), tmp_path)
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"pilot environment: the wheelhouse is for Python 2.7, this "
                                  f"node's {sys.executable} is {mine}")


def test_an_image_too_old_for_the_agent_says_so_in_one_line(tmp_path: Path) -> None:
    """The installer parses on every python3 an image may have (Ubuntu 18.04's 3.6 on), so an
    old one is told why in one line, before anything is fetched."""
    old = sorted(Path.home().glob(".pyenv/versions/3.[6-9].*/bin/python3"))
    if not old:
        pytest.skip("no Python 3.6 to 3.9 on this machine (pyenv)")
    for python in old:
        done = run_host(env_script("http://127.0.0.1:9/root/", python=str(python),
                                   target=str(tmp_path / "env")), tmp_path)
        version = python.parent.parent.name.rsplit(".", 1)[0]
        assert (done.returncode, done.stderr) == (1, (
            f"pilot environment: this node's {python} is Python {version}; the node agent "
            f"needs Python 3.10 or later\n")), python
    assert installer().isascii() and "from __future__" not in installer()


# ------------------------------------------------------------- on the stock image ----------
@pytest.fixture(scope="module")
def house() -> Wheelhouse:
    """The wheelhouse for the image's python3 (cached in the venv, as ElasticCluster's)."""
    image = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(*sys.version_info[:2],"
                            " sep='.')"], capture_output=True, text=True, check=True)
    try:
        return Wheelhouse.for_python(image.stdout.strip())
    except WheelhouseError as err:
        pytest.skip(f"no wheelhouse for the image's python3 here: {err}")


def tarball(directory: Path, script: str) -> str:
    """``local/pilot/start.sh`` in a tarball rooted at /, root's and 0755 as the pilots'
    helper makes it (its folders as tar makes those an archive lacks: 0777 under umask 0,
    so the experiment's user builds the environment there)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("local/pilot/start.sh")
        info.size, info.mode = len(script.encode()), 0o755
        tar.addfile(info, io.BytesIO(script.encode()))
    name = f"start-{len(list(directory.glob('*.tar.gz')))}.tar.gz"
    (directory / name).write_bytes(buf.getvalue())
    return name


@NAMESPACES
def test_a_stock_node_builds_the_agents_environment_and_reuses_it(emulator, house, tmp_path):
    """Twice on the node: built, then found complete; both print the control node's
    versions, from the image's python3 (/usr), from the wheelhouse root (built ahead, as a
    cluster does) and with the pins from an index (the wheelhouse's own: ``simple/``)."""
    www = tmp_path / "www"
    www.mkdir()
    here = emulator.control_address
    root = WheelhouseRoot()
    root.build_ahead(house.python)
    assert root.wheelhouse(house.python, timeout=120).directory == house.directory
    publisher = TarballPublisher(here).start()
    try:
        wheels = root.publish(publisher)
        with serve_directory(www, here) as tarballs:
            s = Session(emulator)
            urn, cred, _ = s.create(rspec=build_request([NodeSpec("base")]))
            nodes = {}
            for name, script in (
                    ("wheels", env_script(wheels) + VERSIONS),
                    ("index", env_script(wheels, index=True, index_url="simple/")
                     + VERSIONS)):
                url = f"{tarballs}/{tarball(www, SHEBANG + script)}"
                nodes[name] = add_node(s, urn, cred, name, "sh /local/pilot/start.sh && "
                                       "sh /local/pilot/start.sh", tarballs=[url])
            for name, node in nodes.items():
                detail = exited(s, urn, cred, name, timeout=120)
                log = runlog(node)
                assert detail["execute_status"] == 0, log
                lines = log.splitlines()[:-1]  # the last: "<command> returned 0" (runstartup's)
                assert len(lines) == 4, log
                assert lines[0].startswith("pilot environment: built in /local/pilot/env in ")
                assert lines[1] == lines[3] == control_versions()
                assert lines[2] == "pilot environment: /local/pilot/env is complete"
            assert "pins from the index" in runlog(nodes["index"])
    finally:
        publisher.stop()
        root.close()


@NAMESPACES
def test_a_stock_node_without_the_wheelhouse_or_the_python_says_so(emulator, tmp_path):
    with serve_directory(tmp_path, emulator.control_address) as url:
        s = Session(emulator)
        urn, cred, _ = s.create(rspec=build_request([NodeSpec("base")]))
        image = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(*sys.version_info"
                                "[:2], sep='.')"], capture_output=True, text=True, check=True)
        cases = {"gone": (env_script(f"{url}/gone/") + VERSIONS,
                          f"pilot environment: the control node has no wheelhouse for Python "
                          f"{image.stdout.strip()} on {wheeltags.machine()}: HTTP 404"),
                 "nohouse": (env_script(f"{url}/gone/", root=False) + VERSIONS,
                             f"pilot environment: cannot fetch wheels.txt from the wheelhouse "
                             f"at {url}/...: HTTP 404"),
                 "nopy": (env_script(url, python="python3.99") + VERSIONS,
                          "pilot environment: no python3.99 on this image")}
        nodes = {name: add_node(s, urn, cred, name, script) for name, (script, _) in
                 cases.items()}
        for name, (script, line) in cases.items():
            assert exited(s, urn, cred, name)["execute_status"] == 1
            # the line, then runstartup's "<command> returned <status>"
            assert runlog(nodes[name]) == f"{line}\n{as_script(script)[0]} returned 1\n"


# ------------------------------------------------------- verified against the cluster CA ---
def test_a_ca_is_for_an_https_wheelhouse_and_is_a_certificate(tmp_path: Path) -> None:
    from elasticslice.pilots.ca import ClusterCA
    ca = ClusterCA.open(tmp_path / "pki")
    with pytest.raises(ValueError, match="verified against ca must be https://"):
        env_script("http://h/w/", ca=ca.cert_pem)
    with pytest.raises(ValueError, match="ca must be a certificate"):
        env_script("https://h/w/", ca="not a certificate")
    assert "ELASTICSLICE_WHEELHOUSE_CA='-----BEGIN CERTIFICATE-----" in env_script(
        "https://h/w/", ca=ca.cert_pem)


def test_an_https_wheelhouse_is_the_control_nodes_or_one_line(tmp_path: Path) -> None:
    """Verified against the cluster CA alone, for the URL's address, and of the role
    ``control``: a node's certificate of the same CA (OU worker, even for that address) and
    another CA's are refused in one line naming what failed verification, before anything
    is read from them; the control node's is used (here: a wheelhouse for another Python,
    which the installer reads and refuses)."""
    import ssl

    from elasticslice.pilots.ca import ClusterCA
    from elasticslice.rpc import pki
    ca = ClusterCA.open(tmp_path / "pki")
    other = ClusterCA.open(tmp_path / "other")
    house = tmp_path / "house"
    house.mkdir()
    (house / "wheels.txt").write_text("# python 2.7 platform x\n")
    worker, worker_key = pki.issue_certificate(ca.cert_pem, ca._key_pem, "node-1",
                                               ips=["127.0.0.1"], role="worker",
                                               key_type="ec")
    (tmp_path / "worker.pem").write_bytes(worker)
    (tmp_path / "worker.key").write_bytes(worker_key)
    foreign = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    foreign.load_cert_chain(*other.issue("wheelhouse"))
    node = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    node.load_cert_chain(tmp_path / "worker.pem", tmp_path / "worker.key")
    seen = {}
    for name, context in (("control", ca.server_context("wheelhouse")), ("worker", node),
                          ("foreign", foreign)):
        publisher = TarballPublisher(tls=context).start()
        try:
            url = publisher.publish_tree(house, "house")
            assert url.startswith("https://127.0.0.1:")
            seen[name] = run_host(env_script(url, python=sys.executable, root=False,
                                             target=str(tmp_path / name), ca=ca.cert_pem),
                                  tmp_path), publisher.base_url
        finally:
            publisher.stop()
    done, _ = seen["control"]
    assert done.returncode == 1 and done.stderr.startswith(
        "pilot environment: the wheelhouse is for Python 2.7")
    for name, why in (("worker", "its certificate is not the control node's (OU worker)"),
                      ("foreign", "its certificate is not the control node's (unable to get "
                                  "local issuer certificate)")):
        done, base = seen[name]
        assert done.returncode == 1
        assert done.stderr == (f"pilot environment: wheels.txt from the wheelhouse at "
                               f"{base}/... failed verification: {why}\n"), name
        assert not (tmp_path / name).exists()
