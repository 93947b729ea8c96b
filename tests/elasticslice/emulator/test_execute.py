"""The execute service: tarballs the CM fetched, unpacked on the node; startup commands as
real processes on the node's machine, exit status in SliverStatus, killed on delete."""
from __future__ import annotations

from tests.helpers import process_alive, wait_for
from tests.elasticslice.emulator.helpers import Session, free_node, make_tarball, ok, \
    startup_args
from tests.elasticslice.emulator.node_helpers import detail_of, host_pid, node_dir


def _node_id(s, urn, cred, client_id):
    return detail_of(s, urn, cred, client_id)["component_urn"].rsplit("+", 1)[-1]


def test_tarball_and_startup_run_with_node_identity(emulator, file_server):
    make_tarball(file_server.root / "app.tgz", {
        "local/bin/hello.sh": "#!/bin/sh\nenv | grep ^ELASTICSLICE_ > /tmp/env.txt\n"
                              "geni-get client_id > /tmp/who.txt\nexit 7\n"})
    s = Session(emulator)
    urn, cred, _ = s.create()
    free = free_node(emulator)   # a machine by name (the sliver's are drawn at random)
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {
        "w1": {"node": free, "tarballs": [f"{file_server.url}/app.tgz"],
               "startup": "sh /local/bin/hello.sh"}}}))
    done = wait_for(lambda: (d := detail_of(s, urn, cred, "w1")).get("execute_state") ==
                    "exited" and d, timeout=20, what="startup to exit")
    assert done["execute_status"] == 7 and done["status"] == "ready"
    node_id = _node_id(s, urn, cred, "w1")
    root = node_dir(emulator, node_id) / "root" / "tmp"  # the user writes there
    assert (root / "who.txt").read_text() == "w1\n"  # geni-get: what a node asks
    env = dict(line.split("=", 1) for line in (root / "env.txt").read_text().splitlines())
    # the box's documented extension, for the same facts
    assert env["ELASTICSLICE_NODE_ID"] == node_id
    assert env["ELASTICSLICE_CLIENT_ID"] == "w1"
    assert env["ELASTICSLICE_CORES"] == "16"
    assert env["ELASTICSLICE_HOSTNAME"].startswith("w1.myslice.")


def test_rspec_execute_service_runs_and_reports_running(emulator):
    rspec = """<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
      <node client_id="a"><services><execute shell="bash" command="geni-get client_id > /tmp/who; sleep 60"/></services></node>
      <node client_id="b"/></rspec>"""
    s = Session(emulator)
    urn, cred, _ = s.create(rspec=rspec)
    wait_for(lambda: detail_of(s, urn, cred, "a").get("execute_state") == "running",
             timeout=20, what="startup running")
    who = node_dir(emulator, _node_id(s, urn, cred, "a")) / "root" / "tmp" / "who"
    wait_for(lambda: who.exists() and who.read_text().strip(), timeout=10, what="startup output")
    assert who.read_text().strip() == "a"


def test_deleting_a_node_kills_its_processes_and_wipes_it(emulator):
    s = Session(emulator)
    urn, cred, _ = s.create()
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {
        "w1": startup_args("sleep 300 & echo $! > /tmp/daemon.pid; sleep 300")}}))
    folder = node_dir(emulator, _node_id(s, urn, cred, "w1"))
    pid_file = folder / "root" / "tmp" / "daemon.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=20,
             what="daemon started")
    pid = host_pid(folder, int(pid_file.read_text()))  # the node has its own PIDs
    assert pid is not None and process_alive(pid)
    ok(s.cm.DeleteNodes({"slice_urn": urn, "credentials": [cred], "nodes": ["w1"]}))
    wait_for(lambda: not process_alive(pid), timeout=10, what="daemon killed")
    assert not folder.exists()


def test_a_tarball_that_is_not_a_tar_archive_fails_the_node(emulator, file_server):
    (file_server.root / "app.tgz").write_text("not a tar archive")
    s = Session(emulator)
    urn, cred, _ = s.create()
    ok(s.cm.AddNodes({"slice_urn": urn, "credentials": [cred], "nodes": {
        "w1": {"tarballs": [f"{file_server.url}/app.tgz"]}}}))  # fetched: the CM says yes
    failed = wait_for(lambda: (d := detail_of(s, urn, cred, "w1"))["status"] == "failed" and d,
                      timeout=20, what="node failed")
    assert "cannot unpack" in failed["error"]
    assert s.status(urn, cred)["status"] in ("mixed", "failed")
