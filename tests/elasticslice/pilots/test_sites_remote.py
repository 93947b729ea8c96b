"""A pilot's site across the manager daemon's channel (``elasticslice run``): the daemon
tells the workload side each held node's site (its CM's) with its address, and the
workload's framework labels the node's pilot with it before it gets units; a node
recorded late (told first while being added, at no site yet) gets its label when told."""
from __future__ import annotations

import time
from pathlib import Path

import troy
from elasticslice.managers.state import ManagerState
from elasticslice.pilots.link import WorkloadLink
from elasticslice.pilots.managerdaemon import held_nodes
from elasticslice.pilots.remote import RemoteWorkload
from elasticslice.pilots.watch import site_of
from tests.helpers import wait_for

UTAH = "https://127.0.0.1:5/cluster/utah/protogeni/xmlrpc/cm"
WISC = "https://127.0.0.1:5/cluster/wisc/protogeni/xmlrpc/cm"


def test_the_daemon_tells_each_node_s_site_and_the_workload_labels_its_pilot(
        tmp_path: Path) -> None:
    held = [("node-1", "100.64.0.2", "utah"), ("node-2", None, None)]
    remote = RemoteWorkload(tmp_path / "state", held=lambda: held)
    (tmp_path / "state").mkdir(mode=0o700)
    remote.start()
    session = troy.Session(store_path=tmp_path / "troy.db")
    framework = session.add_framework("local", name="nodes")
    link = WorkloadLink(tmp_path / "state", framework, session, interval=0.1).start()
    try:
        wait_for(lambda: link.holds("node-2"), what="the held nodes told")
        assert link.site_of("node-1") == "utah" and link.site_of("node-2") is None
        pilots = {}
        for name in ("node-1", "node-2"):
            pilots[name] = framework.submit_pilot(troy.PilotDescription(size=1))
            pilots[name].worker_name = name
            link._pilot_changed(pilots[name])   # as the framework's callback does
        assert site_of(pilots["node-1"]) == "utah" and site_of(pilots["node-2"]) is None
        # node-2's sliver is recorded at wisc: the daemon tells it again, with its site
        held[1] = ("node-2", "100.65.0.2", "wisc")
        remote.tell_nodes()
        wait_for(lambda: site_of(pilots["node-2"]) == "wisc", what="node-2's pilot labelled")
    finally:
        link.close()
        remote.stop()
        session.close()


def test_held_nodes_name_the_site_of_nodes_held_and_being_added(tmp_path: Path) -> None:
    state = ManagerState.open(tmp_path / "state")
    try:
        now = time.time()
        state.upsert_node(UTAH, "node-1", now=now, state="ready", ipv4="100.64.0.2")
        state.begin_intent("add", WISC, ["node-2"], now=now)
        sites = {UTAH: "utah", WISC: "wisc"}
        assert held_nodes(state, sites) == [("node-1", "100.64.0.2", "utah"),
                                            ("node-2", None, "wisc")]
    finally:
        state.close()
