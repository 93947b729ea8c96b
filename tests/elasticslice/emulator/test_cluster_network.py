"""The control machine across the clusters of a box (issue 37, pilots across sites): every
cluster's nodes reach the control machine at one address, the first cluster's control
address (as every CloudLab cluster's nodes reach a control node's public address), while
nodes of two clusters still reach nothing of each other, and nothing else of the first
cluster's network is opened to the others. Nodes are made by the real client at each CM;
the probes run in the nodes' own network namespaces (as root, what the node's root cannot:
the attacker's best case)."""
from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator

import pytest

from elasticslice.config import load_config
from elasticslice.emulator import EmulatorServer, init_emulator, network
from elasticslice.emulator.store import Holder
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rspec import build_request
from tests.elasticslice.emulator.helpers import FAST, RunningEmulator, script_node, try_connect
from tests.helpers import wait_for

pytestmark = pytest.mark.slow

CHOICE = network.choose({network.ENV_VAR: "on"})
needs_network = pytest.mark.skipif(not CHOICE.on, reason=f"no box networks here: "
                                                         f"{CHOICE.reason}")


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(network.ENV_VAR, "on")
        d = init_emulator(tmp_path_factory.mktemp("box") / "emu", 0, clusters=("utah", "wisc"))
        server = EmulatorServer(d, port=0, **FAST).start()
        try:
            yield RunningEmulator(d, server)
        finally:
            server.stop()


def _fabrics(box: RunningEmulator) -> list[network.Fabric]:
    out = [agg.ctx.boot.fabric for agg in box.server.aggregates]
    assert all(f is not None for f in out)
    return out


def _node_namespaces(box: RunningEmulator) -> list[tuple[str, str]]:
    """One node at each cluster, made by the real client: (its namespace, its address)."""
    cfg = dataclasses.replace(load_config(box.config_path), slice_name="sites")
    with ProtoGeniServer(cfg) as client:
        client.register_slice()
        for i, name in enumerate(("u1", "w1")):
            client.create_sliver(build_request([script_node(name, "sleep 600")]), cm=i)
    out = []
    for agg, fabric in zip(box.server.aggregates, _fabrics(box)):
        (node,) = agg.ctx.store.nodes(holder=Holder.SLICE)
        # its first process starts once its network is wired
        wait_for(lambda: node.node_id in agg.ctx.boot.procs.node_ids(), timeout=60,
                 what=f"{node.node_id} started")
        out.append((fabric.netns(node.node_id).name, fabric.node_ip(node.node_id)))
    return out


def _from(ns: str, host: str, port: int) -> str:
    return network.in_netns(ns, try_connect, host, port)


def _listen_in(ns: str) -> socket.socket:
    return network.in_netns(ns, socket.create_server, ("0.0.0.0", 0))


@needs_network
def test_every_cluster_s_nodes_reach_the_control_machine_at_one_address_and_not_each_other(
        box: RunningEmulator) -> None:
    utah, wisc = _fabrics(box)
    public = utah.control_ip
    assert wisc.control_ip != public
    # the client config's listen is that one address, and server.json says where each
    # cluster's nodes find this machine on their own network
    assert f"listen = {public}" in box.config_path.read_text()
    (u_ns, u_ip), (w_ns, w_ip) = _node_namespaces(box)
    with socket.create_server((public, 0)) as scheduler, \
            socket.create_server((wisc.control_ip, 0)) as wisc_side, \
            _listen_in(u_ns) as utah_node, _listen_in(w_ns) as wisc_node:
        port = scheduler.getsockname()[1]
        # the control machine's public address: from both clusters' nodes
        assert _from(u_ns, public, port) == "connected"
        assert _from(w_ns, public, port) == "connected"
        # a wisc node still reaches its own cluster's services (geni-get, tarballs)
        assert _from(w_ns, wisc.control_ip, wisc_side.getsockname()[1]) == "connected"
        # nodes of two clusters: nothing of each other, either way
        assert _from(w_ns, u_ip, utah_node.getsockname()[1]) == "Network is unreachable"
        assert _from(u_ns, w_ip, wisc_node.getsockname()[1]) == "Network is unreachable"
        # a utah node is given nothing of wisc's network, the control machine's side of it
        # included (it reaches the control machine at the public address)
        assert _from(u_ns, wisc.control_ip, wisc_side.getsockname()[1]) == \
            "Network is unreachable"


@needs_network
def test_a_wisc_node_that_routed_utah_s_network_through_the_host_still_reaches_no_utah_node(
        box: RunningEmulator) -> None:
    """The attacker's best case: root of the host adds, in a wisc node's namespace, the
    route the node itself cannot add (its namespace is the host's user namespace's). The
    control machine forwards nothing to or from a box's network, and takes packets from
    another cluster's nodes at its public address only."""
    utah, wisc = _fabrics(box)
    (u_ns, u_ip), (w_ns, _) = _node_namespaces_again(box)
    network._run(["-n", w_ns], [f"route add {utah.subnet}.0.0/16 via {wisc.control_ip}"])
    try:
        with _listen_in(u_ns) as utah_node, \
                socket.create_server((utah.control_ip, 0)) as scheduler:
            assert _from(w_ns, utah.control_ip, scheduler.getsockname()[1]) == "connected"
            assert _from(w_ns, u_ip, utah_node.getsockname()[1]) == "timed out"
    finally:
        network._run(["-n", w_ns], [f"route del {utah.subnet}.0.0/16 via {wisc.control_ip}"])


def _node_namespaces_again(box: RunningEmulator) -> list[tuple[str, str]]:
    """The nodes of the first test, or new ones when this test runs alone."""
    out = []
    for agg, fabric in zip(box.server.aggregates, _fabrics(box)):
        nodes = agg.ctx.store.nodes(holder=Holder.SLICE)
        if not nodes:
            return _node_namespaces(box)
        out.append((fabric.netns(nodes[0].node_id).name, fabric.node_ip(nodes[0].node_id)))
    return out


@needs_network
def test_the_first_cluster_s_firewall_admits_only_the_other_clusters_and_only_its_address(
        box: RunningEmulator) -> None:
    utah, wisc = _fabrics(box)
    assert wisc.public is utah and utah.public is None
    assert wisc.routes == [f"route add {utah.control_ip}/32 via {wisc.control_ip} dev eth0"]
    rules = network.firewall_rules(utah.name, f"{utah.subnet}.0.0/16", utah.name,
                                   utah.control_ip)
    assert f"ip daddr {utah.control_ip} iifname @admitted accept" in rules
    listed = network.subprocess.run([network._nft() or "nft", "list", "set", "inet",
                                     utah.name, "admitted"], capture_output=True, text=True,
                                    check=True).stdout
    assert f'"{wisc.name}"' in listed


def _geni_get(url: str, key: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request
    request = urllib.request.Request(f"{url}/geni/client_id", headers={"X-Geni-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@needs_network
def test_a_wisc_node_at_the_public_address_learns_nothing_from_utah_s_geni_get(
        box: RunningEmulator) -> None:
    """The public address is also where utah's geni-get server listens: a wisc node
    reaches it now, and with its own key (the one it holds) is an unknown node there; at
    its own cluster's server the same key answers."""
    (_, _), (w_ns, _) = _node_namespaces_again(box)
    utah, wisc = box.server.aggregates
    (node,) = wisc.ctx.store.nodes(holder=Holder.SLICE)
    key = str(node.attrs["geni_key"])
    assert network.in_netns(w_ns, _geni_get, wisc.tmcd.url, key) == (200, f"{node.client_id}\n")
    status, said = network.in_netns(w_ns, _geni_get, utah.tmcd.url, key)
    assert status == 403 and "unknown node" in said
