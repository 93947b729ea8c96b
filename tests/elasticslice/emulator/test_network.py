"""Every node on its own network (issue 23): a node reached the host's 127.0.0.1 services (16
listeners, among them the cluster scheduler, every worker and the callback endpoint), and the
manifest's LAN addresses were only bookkeeping. Now a node has its control address and its
LAN addresses, reaches the nodes of its LANs there, nothing of another slice's LANs, and the
control machine only at the box's control address.
"""
from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from elasticslice.emulator import network
from elasticslice.rspec import LinkSpec, build_request
from troy.frameworks.dask.framework import scheduler_workers
from tests.helpers import wait_for
from tests.elasticslice.emulator.helpers import Session, script_node, try_connect
from tests.elasticslice.emulator.node_helpers import detail_of, node_dir

pytestmark = pytest.mark.slow

CHOICE = network.choose({network.ENV_VAR: "on"})
needs_network = pytest.mark.skipif(not CHOICE.on, reason=f"no box networks here: "
                                                         f"{CHOICE.reason}")

# A node's program: answers its host name on port 7000 of every address it has; once the
# test writes /tmp/target (addresses, a line), tries each and writes /tmp/result (one line
# each: the address, then its host name or the error), and keeps serving. It runs as the
# experiment's user: /tmp is where it may write.
PROBE = r"""
import os, socket, threading, time
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 7000))
srv.listen()
def serve():
    while True:
        conn, _ = srv.accept()
        conn.sendall(socket.gethostname().encode())
        conn.close()
threading.Thread(target=serve, daemon=True).start()
open("/tmp/listening", "w").close()
while not os.path.exists("/tmp/target"):
    time.sleep(0.05)
lines = []
for address in open("/tmp/target").read().split():
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=3) as conn:
            lines.append(address + " " + (conn.recv(100).decode() or "connected"))
    except OSError as err:
        lines.append(address + " " + (os.strerror(err.errno) if err.errno else str(err)))
with open("/tmp/result.tmp", "w") as out:
    out.write("\n".join(lines) + "\n")
os.rename("/tmp/result.tmp", "/tmp/result")
time.sleep(300)
"""
STARTUP = f"python3 -c {shlex.quote(PROBE)}"


@pytest.fixture
def networked(monkeypatch: pytest.MonkeyPatch, emulator_factory):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(network.ENV_VAR, "on")
    return emulator_factory()


def _addresses(manifest: str, client_id: str) -> list[str]:
    """The node's manifest addresses: ``host@ipv4``, then its LAN interfaces'."""
    out = []
    for node in ET.fromstring(manifest).iter():
        if node.tag.endswith("}node") and node.get("client_id") == client_id:
            out += [e.get("ipv4") for e in node.iter() if e.tag.endswith("}host")]
            out += [e.get("address") for e in node.iter() if e.tag.endswith("}ip")]
    return [a for a in out if a]


def _root(emu, s: Session, urn: str, cred: str, client_id: str) -> Path:
    """The node's ``/tmp`` (on the host), once its program listens."""
    node_id = detail_of(s, urn, cred, client_id)["component_urn"].rsplit("+", 1)[-1]
    root = node_dir(emu, node_id) / "root" / "tmp"
    wait_for((root / "listening").exists, timeout=60, what=f"{client_id} listening")
    return root


def _ask(emu, s: Session, urn: str, cred: str, client_id: str, targets: list[str],
         listening: tuple[str, ...] = ()) -> dict[str, str]:
    """What the node ``client_id`` got from each ``host:port`` of ``targets`` (once it and
    the nodes ``listening`` of the slice listen)."""
    for other in listening:
        _root(emu, s, urn, cred, other)
    root = _root(emu, s, urn, cred, client_id)
    (root / "target").write_text("\n".join(targets) + "\n")
    result = root / "result"
    wait_for(result.exists, timeout=60, what=f"{client_id}'s result")
    return dict(line.split(" ", 1) for line in result.read_text().splitlines())


def _lan_slice(s: Session, name: str, nodes: list[str]) -> tuple[str, str, str]:
    specs = [script_node(n, STARTUP, interfaces=[(f"{n}:if0", None, None)]) for n in nodes]
    urn, cred, (_, manifest) = s.create(name, build_request(
        specs, [LinkSpec("lan0", [f"{n}:if0" for n in nodes])]))
    return urn, cred, manifest


@needs_network
def test_nodes_reach_their_lan_at_manifest_addresses_and_nothing_of_another_slice(networked):
    s = Session(networked)
    urn, cred, manifest = _lan_slice(s, "one", ["a", "b"])
    a_control, a_lan = _addresses(manifest, "a")
    b_control, b_lan = _addresses(manifest, "b")
    assert a_lan.startswith("10.") and a_control != "127.0.0.1"
    control = networked.server.ctx.boot.control_address()
    host = f"127.0.0.1:{networked.server.port}"  # the emulator's own XML-RPC listener
    got = _ask(networked, s, urn, cred, "a", [f"{b_lan}:7000", f"{b_control}:7000", host,
                                             f"{control}:{networked.server.port}"],
               listening=("b",))
    hostname_b = "b.one."
    assert got[f"{b_lan}:7000"].startswith(hostname_b), got
    assert got[f"{b_control}:7000"].startswith(hostname_b), got
    assert got[host] == "Connection refused", got  # the node's own loopback: nothing there
    # the control machine's address, on a port it serves only on its loopback: refused too
    assert got[f"{control}:{networked.server.port}"] == "Connection refused", got

    other, other_cred, other_manifest = _lan_slice(s, "two", ["c", "d"])
    got = _ask(networked, s, other, other_cred, "c",
               [f"{a_lan}:7000", f"{_addresses(other_manifest, 'd')[1]}:7000"],
               listening=("d",))
    assert got[f"{a_lan}:7000"] == "Network is unreachable", got
    assert got[f"{_addresses(other_manifest, 'd')[1]}:7000"].startswith("d.two."), got


@needs_network
def test_a_node_reaches_the_control_machine_only_at_its_address(networked):
    """geni-get (the box's tmcd) answers at the control address; the host's loopback is
    the node's own; the node has no route out."""
    s = Session(networked)
    startup = ("geni-get client_id > /tmp/name; ip -o -4 route > /tmp/routes; "
               "ip -o -4 addr > /tmp/addrs; " + STARTUP)
    urn, cred, (_, manifest) = s.create("solo", build_request(
        [script_node("n", startup)]))
    control = networked.server.ctx.boot.control_address()
    got = _ask(networked, s, urn, cred, "n", [f"127.0.0.1:{networked.server.port}",
                                             "192.0.2.1:80"])
    root = node_dir(networked, detail_of(s, urn, cred, "n")["component_urn"]
                    .rsplit("+", 1)[-1]) / "root" / "tmp"
    assert (root / "name").read_text().strip() == "n"
    assert f"inet {_addresses(manifest, 'n')[0]}/" in (root / "addrs").read_text()
    routes = (root / "routes").read_text()
    assert "default" not in routes and control.rsplit(".", 2)[0] in routes, routes
    assert got[f"127.0.0.1:{networked.server.port}"] == "Connection refused", got
    assert got["192.0.2.1:80"] == "Network is unreachable", got


def _commands_in(netns: Path) -> list[str]:
    """The command lines of the processes in network namespace ``netns``."""
    try:
        inode = netns.stat().st_ino
    except FileNotFoundError:  # not booted yet
        return []
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "ns" / "net").stat().st_ino == inode:
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def _connect_from(netns: Path, host: str, port: int) -> str:
    """What a TCP connection to host:port from network namespace ``netns`` gets."""
    probe = ("import os, socket, sys\ntry:\n    socket.create_connection((sys.argv[1], "
             "int(sys.argv[2])), 3).close()\n    print('connected')\nexcept OSError as e:\n"
             "    print(os.strerror(e.errno) if e.errno else e)\n")
    done = subprocess.run(["nsenter", f"--net={netns}", sys.executable, "-c", probe, host,
                           str(port)], capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr.strip()


def _doctor(config: Path, tmp: Path, *args: str) -> tuple[int, str]:
    """``elasticslice -c CONFIG doctor ARGS``: exit status and its ``addresses`` line."""
    from tests.elasticslice.test_doctor import doctor, line
    code, lines, _ = doctor(config, tmp, *args)
    return code, line(lines, "addresses")


@needs_network
def test_the_pilot_path_works_on_the_nodes_network_and_not_on_loopback(
        networked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The product as is: the box's config says ``listen`` (its control address); the
    scheduler listens there, the agent advertises its manifest address, and the scheduler
    reaches the worker there (client.run). A scheduler on 127.0.0.1 gets no pilot (the
    node's agent cannot enrol: that loopback is its own), and ``doctor`` says why."""

    from dask.distributed import Client

    from elasticslice.dask import CloudLabCluster
    from tests.elasticslice.pilots.helpers import pilot_image
    monkeypatch.setenv("ELASTICSLICE_CREDENTIAL_CACHE_DIR", str(tmp_path / "cache"))
    control = networked.server.ctx.boot.control_address()

    code, addresses = _doctor(networked.config_path, tmp_path)
    assert addresses.startswith("ok") and control in addresses, addresses
    code, addresses = _doctor(networked.config_path, tmp_path, "--listen", "127.0.0.1")
    assert code == 1 and addresses.startswith("FAIL"), addresses
    assert f"reach it at {control} only" in addresses and "127.0.0.1" in addresses, addresses

    def cluster(**options: object) -> CloudLabCluster:  # one state: the slice is ours
        return CloudLabCluster(config=networked.config_path, state_dir=tmp_path / "dask",
                               minimum=1, maximum=1, disk_image=pilot_image(networked),
                               node_python="python3", **options)

    with cluster(listen="127.0.0.1") as lonely, Client(lonely) as client:
        # the node booted and its agent tries to enrol at 127.0.0.1: the node's own
        node = wait_for(lambda: next((n for n in lonely.manager.state.nodes() if n.node_id),
                                     None), timeout=60, what="the node")
        netns = networked.server.ctx.boot.fabric.netns(node.node_id)
        # its command line whole: a process read between fork and exec shows another's
        enrol = wait_for(lambda: next((c for c in _commands_in(netns) if
                                       "troy.frameworks.dask.enrol" in c and " https://" in c),
                                      None), timeout=60, what="the node's agent enrolling")
        url = next(w for w in enrol.split() if w.startswith("https://"))
        assert url.startswith("https://127.0.0.1:"), enrol
        assert _connect_from(netns, "127.0.0.1", int(url.rsplit(":", 1)[1])) == \
            "Connection refused"
        host, port = lonely.scheduler_address.removeprefix("tls://").rsplit(":", 1)
        assert _connect_from(netns, host, int(port)) == "Connection refused"
        assert scheduler_workers(client) == {}

    with cluster() as box, Client(box) as client:
        wait_for(lambda: scheduler_workers(client), timeout=90, what="a worker")
        assert box.scheduler_address.startswith(f"tls://{control}:")
        (worker,) = scheduler_workers(client)
        node = box.manager.state.nodes()[0]
        address = networked.server.ctx.boot.node_address(node.node_id)
        assert worker.startswith(f"tls://{address}:"), worker  # its manifest address
        # the scheduler reaches the worker there: client.run goes through it
        (name,) = client.run(socket.gethostname).values()
        assert name.startswith(f"{node.client_id}."), name


@needs_network
def test_a_neighbour_of_this_machine_cannot_reach_the_control_address(networked) -> None:
    """By Linux's weak host model the host answers at the control address on every
    interface: a neighbour on this machine's LAN that routes 100.64.0.0/10 here reached the
    scheduler and the callback endpoint. The box's firewall takes packets to its control
    network only from this machine and its nodes. The neighbour: a network namespace on a
    veth to the host (TEST-NET-2 or -3 addresses), routing 100.64.0.0/10 to it."""
    fabric = networked.server.ctx.boot.fabric
    control = fabric.control_ip
    name, host_end = f"esnb{os.getpid()}", f"esnb{os.getpid()}h"
    here, there = _spare_pair()
    network._run(["netns", "add", name])
    try:
        network._run([], [f"link add {host_end} type veth peer name eth0 netns {name}",
                          f"addr add {here}/30 dev {host_end}", f"link set {host_end} up"])
        network._run(["-n", name], ["link set lo up", f"addr add {there}/30 dev eth0",
                                    "link set eth0 up", f"route add 100.64.0.0/10 via {here}"])
        with socket.create_server((control, 0)) as served, \
                socket.create_server((here, 0)) as beside:
            def connect(address: str, port: int) -> str:
                return network.in_netns(name, try_connect, address, port)
            # the neighbour reaches this machine where it faces it, and the nodes' address
            # of this machine from this machine itself
            assert connect(here, beside.getsockname()[1]) == "connected"
            assert try_connect(control, served.getsockname()[1]) == "connected"
            assert connect(control, served.getsockname()[1]) == "timed out"
            network._delete_table(fabric.name)  # without the rule: the weak host model
            assert connect(control, served.getsockname()[1]) == "connected"
    finally:
        network._delete_netns(name)


def _spare_pair() -> tuple[str, str]:
    """Two addresses of a /30 in TEST-NET-2/3 that no interface of this machine is on (a
    machine may itself sit in a documentation network: this one's eth0 is 192.0.2.2/24, and a
    /30 holding it made the neighbour's answers go nowhere)."""
    import ipaddress
    import json
    taken = [ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False)
             for link in json.loads(subprocess.run(["ip", "-j", "-4", "addr"], check=True,
                                                   capture_output=True, text=True).stdout)
             for a in link.get("addr_info", [])]
    for block in ("198.51.100.0/24", "203.0.113.0/24"):
        subnets = list(ipaddress.ip_network(block).subnets(new_prefix=30))
        start = os.getpid() % len(subnets)  # parallel runs of the suite on one machine
        for subnet in subnets[start:] + subnets[:start]:
            if not any(subnet.overlaps(net) for net in taken):
                first, second = list(subnet.hosts())
                return str(first), str(second)
    pytest.fail("no /30 of 198.51.100.0/24 or 203.0.113.0/24 is free of this machine's "
                "addresses")


@needs_network
def test_a_restarted_box_keeps_its_control_address(monkeypatch, emulator_factory) -> None:
    """A manager listening at the control address (the config's [pilots] listen) is reached
    there again after the emulator restarts; broke: a restart took the lowest free control
    network, another box's if that one had stopped meanwhile."""
    from elasticslice.emulator import EmulatorServer
    from tests.elasticslice.emulator.helpers import FAST
    monkeypatch.setenv(network.ENV_VAR, "on")
    got = []
    for _attempt in range(3):  # a box of a parallel test may take the network meanwhile
        first, second = emulator_factory(), emulator_factory()
        address = second.control_address
        assert first.control_address != address
        first.server.stop()
        second.server.stop()
        again = EmulatorServer(second.dir, port=0, **FAST)
        again.start()
        try:
            got.append((address, again.ctx.boot.control_address()))
            config = second.config_path.read_text()
        finally:
            again.stop()
        if got[-1][0] == got[-1][1]:
            break
    assert got[-1][0] == got[-1][1], got
    assert f"listen = {got[-1][0]}\n" in config


@needs_network
def test_a_new_box_leaves_a_stopped_box_its_network(monkeypatch, emulator_factory) -> None:
    """Broke under the parallel suite: between a box's stop and its restart (the chaos run
    restarts the emulator under a running manager) a new box of another test took the
    lowest free control network, the stopped box's; the restarted box got another, and the
    manager's tarball URL at the old address was "offline" for the CM. A network stays
    held for its box a minute after it stopped."""
    from elasticslice.emulator import EmulatorServer
    from tests.elasticslice.emulator.helpers import FAST
    monkeypatch.setenv(network.ENV_VAR, "on")
    first = emulator_factory()
    address = first.control_address
    first.server.stop()
    second = emulator_factory()          # a new box, with the first one's network free
    assert second.control_address != address
    again = EmulatorServer(first.dir, port=0, **FAST)
    again.start()
    try:
        assert again.ctx.boot.control_address() == address, (
            network._recently_released(), re.findall(r"inet (100\.\d+)\.0\.1/",
                                                      network._addresses()))
    finally:
        again.stop()


@needs_network
def test_a_stopped_box_lets_go_of_its_control_address_at_once_whatever_is_left_inside(
        monkeypatch) -> None:
    """Broke on CI: the host's end of a box's veth went only when the kernel tore the box's
    namespace down, which a process left inside (or the parallel suite's churn of
    namespaces) put off past half a minute; the box restarted at once found its network in
    use and took another, and a manager listening at the old address reached no node. The
    stop deletes the host's end itself."""
    monkeypatch.setattr(network.Fabric, "_wait_address_gone", lambda *a, **k: None)
    fabric = network.Fabric().start(owner="/a/box")
    lingerer = subprocess.Popen([network._ip() or "ip", "netns", "exec", fabric.name,
                                 "sleep", "60"])
    try:
        wait_for(lambda: lingerer.poll() is not None or os.readlink(
            f"/proc/{lingerer.pid}/ns/net") != os.readlink("/proc/self/ns/net"), timeout=10)
        assert lingerer.poll() is None
        assert f"inet {fabric.control_ip}/" in network._addresses()
        fabric.stop()
        assert f"inet {fabric.control_ip}/" not in network._addresses()
        links = subprocess.run([network._ip() or "ip", "-o", "link", "show"],
                               capture_output=True, text=True, check=True).stdout
        assert f" {fabric.name}@" not in links
    finally:
        lingerer.kill()
        lingerer.wait()
        fabric.stop()


@needs_network
def test_a_stopping_box_holds_its_network_before_its_address_goes(monkeypatch) -> None:
    """Marked held only after its address was gone, a stopping box left a moment in which
    a box starting in parallel saw the network free and unheld, and took it from the box's
    restart."""
    fabric = network.Fabric().start(owner="/a/box")
    seen: list[tuple[bool, str | None]] = []
    delete = network._delete_host_end

    def spy(name: str) -> None:
        seen.append((f"inet {fabric.control_ip}/" in network._addresses(),
                     network._recently_released().get(fabric.k)))
        delete(name)

    monkeypatch.setattr(network, "_delete_host_end", spy)
    fabric.stop()
    assert seen == [(True, "/a/box")]
    assert f"inet {fabric.control_ip}/" not in network._addresses()


def test_when_every_free_network_was_let_go_within_the_minute_the_oldest_is_taken(
        monkeypatch, tmp_path: Path) -> None:
    """The parallel suite lets go of more than 64 boxes' networks a minute: the new box
    took the lowest free one, a box's that had stopped a moment before to start again."""
    monkeypatch.setattr(network, "STATE_DIR", tmp_path)
    monkeypatch.setattr(network, "_addresses", lambda: "inet 100.65.0.1/16")  # k=1 in use
    now = __import__("time").time()
    for k in range(network.CONTROL_NETS):   # all let go, the lowest ones the latest
        marker = tmp_path / f"released-{k}"
        marker.write_text(f"/box/{k}")
        os.utime(marker, (now - k * 0.5, now - k * 0.5))
    fabric = network.Fabric()
    fabric.owner = "/a/new/box"
    assert fabric._free_subnet() == network.CONTROL_NETS - 1   # let go the longest ago
    (tmp_path / "released-7").unlink()                          # never let go: taken first
    assert fabric._free_subnet() == 7


@needs_network
def test_a_gone_emulators_firewall_table_does_not_cut_off_the_next_box() -> None:
    """A table left without its emulator's lock (its namespaces gone, so its control network
    looks free) dropped every packet of the next box on that network from its nodes: their
    startup hung. The next start's reaper deletes it."""
    name = "es4000000x1"  # no such pid: nobody holds its lock
    network._nft_run(network.firewall_rules(name, "100.127.0.0/16", name))
    try:
        assert name in network._tables()
        network.reap()
        assert name not in network._tables()
    finally:
        network._delete_table(name)


@needs_network
def test_at_the_control_address_only_the_registrants_certificate_gets_callbacks(
        networked, tmp_path: Path) -> None:
    """The CM cannot check an endpoint at the control address for its host (the user's
    certificate names 127.0.0.1), so it checks that the certificate names the user who
    registered the endpoint. Broke: any certificate of the box's CA there (another user's, a
    server's) got the slice's callbacks: whoever held the port first."""
    from tests.elasticslice.emulator.helpers import CallbackEndpoint, ok
    control = networked.control_address
    others = [CallbackEndpoint(networked.dir, tmp_path, host=control),  # a server's
              CallbackEndpoint(networked.dir, tmp_path, host=control,  # another user's
                               urn="urn:publicid:IDN+emulab.test+user+eve")]
    mine = CallbackEndpoint(networked.dir, tmp_path, user_cert=True, host=control)
    try:
        s = Session(networked)
        urn, cred, _ = s.create()
        callbacks = networked.server.reclaimer.callbacks
        for ep in [*others, mine]:
            failures = callbacks.failures
            ok(s.dyn.SetSliceClientEndpoint({"slice_urn": urn, "url": ep.url,
                                             "credentials": [cred]}))
            if ep is not mine:  # the CM tried, and sent nothing
                wait_for(lambda: callbacks.failures > failures, timeout=30,
                         what="the CM refusing the endpoint")
        wait_for(lambda: mine.values(), timeout=30, what="SetResourceValues at the user's")
        assert [ep.calls for ep in others] == [[], []]
    finally:
        for ep in [*others, mine]:
            ep.close()
