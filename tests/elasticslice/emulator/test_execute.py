"""The execute service: tarballs unpacked in the node sandbox, startup commands as real
processes with the node's identity, exit status in SliverStatus, killed on delete."""
from __future__ import annotations

import io
import tarfile

from tests.helpers import process_alive, wait_for
from tests.elasticslice.emulator.helpers import Session, ok
from tests.elasticslice.emulator.node_helpers import host_pid


def _tarball(path, files: dict[str, str]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    return f"file://{path}"


def _detail(s: Session, urn: str, cred: str, client_id: str) -> dict:
    details = s.status(urn, cred)["details"].values()
    return next(d for d in details if d["client_id"] == client_id)


def _node_id(s, urn, cred, client_id):
    return _detail(s, urn, cred, client_id)["component_urn"].rsplit("+", 1)[-1]


def test_tarball_and_startup_run_with_node_identity(emulator, tmp_path):
    url = _tarball(tmp_path / "app.tgz", {"bin/hello.sh": "#!/bin/sh\nenv | grep ^ELASTICSLICE_ > env.txt\nexit 7\n"})
    s = Session(emulator)
    urn, cred, _ = s.create()
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {
        "w1": {"hardware_type": "d430", "tarballs": [[url, "/local"]],
               "startup": "sh /local/bin/hello.sh"}}}))
    done = wait_for(lambda: (d := _detail(s, urn, cred, "w1")).get("execute_state") == "exited"
                    and d, timeout=20, what="startup to exit")
    assert done["execute_status"] == 7 and done["status"] == "ready"
    node_id = _node_id(s, urn, cred, "w1")
    env = dict(line.split("=", 1) for line in
               (emulator.dir / "nodes" / node_id / "env.txt").read_text().splitlines())
    assert env["ELASTICSLICE_NODE_ID"] == node_id
    assert env["ELASTICSLICE_CLIENT_ID"] == "w1"
    assert env["ELASTICSLICE_CORES"] == "16"
    assert env["ELASTICSLICE_HOSTNAME"].startswith("w1.myslice.")


def test_rspec_execute_service_runs_and_reports_running(emulator):
    rspec = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
      <node client_id="a"><services><execute shell="bash" command="echo $ELASTICSLICE_CLIENT_ID > who; sleep 60"/></services></node>
      <node client_id="b"/></rspec>"""
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=rspec)
    wait_for(lambda: _detail(s, urn, cred, "a").get("execute_state") == "running",
             timeout=20, what="startup running")
    node_dir = emulator.dir / "nodes" / _node_id(s, urn, cred, "a")
    who = node_dir / "who"
    wait_for(lambda: who.exists() and who.read_text().strip(), timeout=10, what="startup output")
    assert who.read_text().strip() == "a"


def test_deleting_a_node_kills_its_processes_and_wipes_it(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {
        "w1": {"startup": "sleep 300 & echo $! > daemon.pid; sleep 300"}}}))
    node_dir = emulator.dir / "nodes" / _node_id(s, urn, cred, "w1")
    pid_file = node_dir / "daemon.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=20,
             what="daemon started")
    pid = host_pid(node_dir, int(pid_file.read_text()))  # the node has its own PIDs
    assert pid is not None and process_alive(pid)
    ok(s.cm.DeleteNodes({"slice_urn": urn, "credentials": [cred], "nodes": ["w1"]}))
    wait_for(lambda: not process_alive(pid), timeout=10, what="daemon killed")
    assert not node_dir.exists()


def test_tarball_from_elsewhere_fails_the_node(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {
        "w1": {"tarballs": ["http://example.com/app.tgz"]}}}))
    failed = wait_for(lambda: (d := _detail(s, urn, cred, "w1"))["status"] == "failed" and d,
                      timeout=20, what="node failed")
    assert "refusing tarball URL" in failed["error"]
    assert s.status(urn, cred)["status"] in ("mixed", "failed")
