"""Every node on a network of its own: the box's control network and the slice's LANs.

With ``ELASTICSLICE_NODE_NETWORK=on`` (or ``auto``: on where it works) and the rights it
needs (root: ``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN`` in the host's namespaces; CI and this
machine run as root), ``ip`` from iproute2 and ``nft`` from nftables, each emulator makes:

- a **fabric**: a network namespace of its own (``es<pid>x<n>``), holding a bridge ``ctl``
  for the control network and one bridge ``lan<vlantag>`` per experiment LAN. Nothing in it
  has an address but what is below, and no namespace of it has a route out.
- the **control network** ``100.(64+k).0.0/16`` (``k``: the first one no other emulator
  of this machine uses; from 100.64.0.0/10, the shared address space, never routed on the
  internet). The control machine (where the emulator, the manager and its scheduler run)
  is ``100.(64+k).0.1``: the one address that lives in the host's namespace, on a veth whose
  other end is a port of ``ctl`` (see docs/emulator.md, "The node's network", for why).
- a **firewall** table (nftables, ``inet es<pid>x<n>``): the control network's addresses
  take packets only from this machine itself and from the box's nodes, and nothing is
  forwarded to or from it, so nothing of the box is reachable from beyond the machine
  (:func:`firewall_rules`). Without ``nft`` the box does not make networks.
- per node, a network namespace (``es<pid>x<n>-<node>``) with ``lo``, ``eth0`` on ``ctl``
  at the node's control address (the manifest's ``host@ipv4``) and ``eth1``... on the LAN
  bridges at the manifest's LAN addresses (and MACs). Its routes: its own subnets only,
  and in a box of several clusters, one more: to the control machine's public address
  (the first cluster's control address, ``Fabric.start(public=)``), through the control
  machine's address on its own network. Nodes of two clusters never reach each other.

The node's init is started inside its namespace (``nsenter --net``); the namespace belongs
to the host's user namespace, so the node (root in its own) cannot change its addresses or
routes. Deleting a node deletes its namespace; stopping the emulator deletes the fabric
(and the host's end with it) and its firewall table. An emulator that was killed leaves
them: the next start of any emulator on this machine deletes those whose owner's lock
(``/run/elasticslice-net/``) is no longer held.
"""
from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import itertools
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from elasticslice.emulator.daemon import lock_is_held

log = logging.getLogger(__name__)

ENV_VAR = "ELASTICSLICE_NODE_NETWORK"
DEFAULT = "auto"
STATE_DIR = Path("/run/elasticslice-net")
NETNS_DIR = Path("/run/netns")
CONTROL_BASE = 64  # 100.64.0.0/10: 64 control networks of /16
CONTROL_NETS = 64
#: seconds a stopped box's control network is kept from boxes that did not have it (its
#: own restart takes it back: a manager listening at the old address reaches it again)
HOLD_RELEASED = 60.0
#: seconds a box restarting waits for its own network, which it let go, to be gone
RELEASE_WAIT = 30.0
CLONE_NEWNET = 0x40000000
_counter = itertools.count(1)
_libc = ctypes.CDLL(None, use_errno=True)


class NetworkError(Exception):
    pass


@dataclass(frozen=True)
class Choice:
    on: bool
    reason: str = ""  # why not


def choose(env: dict[str, str] | None = None) -> Choice:
    """Nodes on their own network when ``ELASTICSLICE_NODE_NETWORK`` is ``on`` or ``auto``
    and this machine allows it; the shared network otherwise (with the reason)."""
    value = (os.environ if env is None else env).get(ENV_VAR, DEFAULT).strip().lower()
    if value in ("", "off", "0", "no"):
        return Choice(False, f"{ENV_VAR}={value or 'off'}")
    if value not in ("on", "auto", "1", "yes"):
        log.warning("%s=%s is not on, auto or off; using auto", ENV_VAR, value)
    reason = _probe()
    return Choice(not reason, reason)


def _probe() -> str:
    if not os.uname().sysname == "Linux":
        return "no network namespaces here"
    if os.geteuid() != 0:
        return "not root: the box's networks need CAP_NET_ADMIN in the host's namespace"
    if _ip() is None or shutil.which("nsenter") is None:
        return "no ip (iproute2) or nsenter (util-linux)"
    if _nft() is None:
        return ("no nft (nftables): without its rule the control address would answer "
                "packets from this machine's other networks")
    return ""


def _sbin(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin")


def _ip() -> str | None:
    return _sbin("ip")


def _nft() -> str | None:
    return _sbin("nft")


def _nft_run(script: str) -> None:
    """``nft -f -`` with ``script``; NetworkError with what it said."""
    proc = subprocess.run([_nft() or "nft", "-f", "-"], input=script.encode(),
                          capture_output=True, check=False)
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().replace("\n", "; ")
        raise NetworkError(f"nft: {said or proc.returncode}")


def firewall_rules(table: str, subnet: str, host_end: str, control_ip: str = "") -> str:
    """The nftables table that keeps an emulator's control network on this machine: packets
    to its addresses are taken only from this machine itself (``lo``) and from the box's
    nodes (``host_end``, the host's end of the fabric's veth), and none is forwarded to or
    from it. Without it, Linux's weak host model answers at the control address for packets
    arriving on any interface: a neighbour that routes 100.64.0.0/10 to this machine would
    reach the scheduler and the callback endpoint. ``control_ip`` (the control machine's
    address on it): also taken from the host's ends of the other clusters of the same box
    that :meth:`Fabric.admit` puts in the set ``admitted`` (empty at first), that address
    only: the control machine's public address, which every cluster's nodes reach."""
    admitted = "  set admitted {\n    type ifname;\n  }\n" if control_ip else ""
    accept = (f"    ip daddr {control_ip} iifname @admitted accept\n" if control_ip else "")
    return (f"table inet {table} {{\n"
            f"{admitted}"
            f"  chain input {{\n"
            f"    type filter hook input priority -10; policy accept;\n"
            f"{accept}"
            f'    ip daddr {subnet} iifname != {{ "lo", "{host_end}" }} drop\n'
            f"  }}\n"
            f"  chain forward {{\n"
            f"    type filter hook forward priority -10; policy accept;\n"
            f"    ip daddr {subnet} drop\n"
            f"    ip saddr {subnet} drop\n"
            f"  }}\n"
            f"}}\n")


def _delete_table(name: str) -> None:
    if _nft() is None:
        return
    proc = subprocess.run([_nft() or "nft", "delete", "table", "inet", name],
                          capture_output=True, check=False)
    said = proc.stderr.decode(errors="replace")
    if proc.returncode != 0 and "No such file" not in said:
        log.warning("cannot delete firewall table %s: %s", name, said.strip())


def _run(args: list[str], batch: list[str] | None = None) -> None:
    """``ip ARGS`` (with ``-batch -`` lines when given); NetworkError with what it said."""
    argv = [_ip() or "ip", *args] + (["-batch", "-"] if batch is not None else [])
    proc = subprocess.run(argv, input="\n".join(batch or []).encode() + b"\n",
                          capture_output=True, check=False)
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().replace("\n", "; ")
        raise NetworkError(f"ip {' '.join(args)}: {said or proc.returncode}")


def _prefixlen(netmask: str | None) -> int:
    try:
        return ipaddress.IPv4Network(f"0.0.0.0/{netmask or '255.255.255.0'}").prefixlen
    except ValueError:
        return 24


def _mark_released(k: int, owner: str) -> None:
    try:
        (STATE_DIR / f"released-{k}").write_text(owner)
    except OSError:
        pass  # only a hint for the next allocation


def _released() -> dict[int, tuple[float, str]]:
    """The control networks (their k) a box released, with when and the box's owner (its
    emulator directory)."""
    found: dict[int, tuple[float, str]] = {}
    for marker in STATE_DIR.glob("released-*") if STATE_DIR.is_dir() else []:
        try:
            found[int(marker.name.split("-", 1)[1])] = (marker.stat().st_mtime,
                                                        marker.read_text())
        except (OSError, ValueError):
            continue
    return found


def _recently_released(now: float | None = None) -> dict[int, str]:
    """The control networks (their k) that a box released within :data:`HOLD_RELEASED`,
    with the box's owner (its emulator directory)."""
    now = time.time() if now is None else now
    return {k: owner for k, (when, owner) in _released().items()
            if now - when < HOLD_RELEASED}


def reap() -> list[str]:
    """Delete the namespaces of emulators that are gone (their lock is free); their names."""
    gone: list[str] = []
    if not STATE_DIR.is_dir():
        return gone
    for lock in STATE_DIR.glob("es*.lock"):
        name = lock.name[:-5]
        try:
            if lock_is_held(lock):
                continue
        except OSError:  # cannot tell: leave its namespaces alone
            continue
        for ns in NETNS_DIR.glob(f"{name}-*") if NETNS_DIR.is_dir() else []:
            _delete_netns(ns.name)
        _delete_host_end(name)
        _delete_netns(name)
        _delete_table(name)
        lock.unlink(missing_ok=True)
        gone.append(name)
    # a table whose emulator left no lock (deleted by hand, or by a reaper that did not
    # know tables) would drop the packets of the next box that takes its control network
    for name in _tables():
        lock = STATE_DIR / f"{name}.lock"
        try:
            if lock.exists() and lock_is_held(lock):
                continue
        except OSError:
            continue
        _delete_table(name)
        gone.append(name)
    return gone


def _tables() -> list[str]:
    """The names of the emulators' firewall tables on this machine."""
    if _nft() is None:
        return []
    out = subprocess.run([_nft() or "nft", "list", "tables"], capture_output=True,
                         text=True, check=False).stdout
    return re.findall(r"^table inet (es\d+x\d+)$", out, flags=re.M)


def _addresses() -> str:
    """``ip -o -4 addr show`` of the host."""
    return subprocess.run([_ip() or "ip", "-o", "-4", "addr", "show"], capture_output=True,
                          text=True, check=False).stdout


def _delete_host_end(name: str) -> None:
    """Delete the host's end of a box's veth (named as the box): its peer and the control
    address go at once. Left to the namespace's teardown, they went when the kernel got
    round to it, which the parallel suite's churn of namespaces delayed past half a minute
    (a box restarted at once found its network still in use and took another)."""
    try:
        _run(["link", "del", name])
    except NetworkError as err:
        if "Cannot find device" not in str(err):
            log.warning("cannot delete the link %s: %s", name, err)


def _delete_netns(name: str) -> None:
    if (NETNS_DIR / name).exists():
        try:
            _run(["netns", "del", name])
        except NetworkError as err:
            log.warning("cannot delete network namespace %s: %s", name, err)


def in_netns(name: str, func, *args):  # type: ignore[no-untyped-def]
    """``func(*args)`` with this thread in network namespace ``name`` (needs
    CAP_SYS_ADMIN); sockets made there stay there."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetworkError(f"setns {name}: {os.strerror(err)}")
        try:
            return func(*args)
        finally:
            _libc.setns(own, CLONE_NEWNET)
    finally:
        os.close(own)
        os.close(target)


def _write_sysctl(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value)


class Fabric:
    """One emulator's networks (see the module docstring)."""

    def __init__(self) -> None:
        self.name = f"es{os.getpid()}x{next(_counter)}"
        self.k = -1
        self.owner = ""   # the box's emulator directory (start)
        self._lock_fd: int | None = None
        self._lans: set[str] = set()
        self._nodes: dict[str, str] = {}  # node_id -> its namespace
        self._ports = itertools.count(1)
        self._mutex = threading.Lock()
        self._bridges = threading.Lock()
        self._index: dict[str, int] = {}
        #: the box's first cluster's fabric, when this one is another cluster's: its
        #: control address is the control machine's public address (see :meth:`start`)
        self.public: Fabric | None = None

    # ---- addresses
    @property
    def subnet(self) -> str:
        return f"100.{CONTROL_BASE + self.k}"

    @property
    def control_ip(self) -> str:
        """The control machine's address on the control network."""
        return f"{self.subnet}.0.1"

    def set_nodes(self, node_ids: list[str]) -> None:
        """The pool, in a stable order: a node's control address is its place in it."""
        self._index = {node_id: i for i, node_id in enumerate(node_ids)}

    def node_ip(self, node_id: str) -> str:
        host = self._index.get(node_id, 0) + 2
        if host >= 65534:
            raise NetworkError(f"more than 65,532 nodes: {node_id} has no control address")
        return f"{self.subnet}.{host >> 8}.{host & 255}"

    def netns(self, node_id: str) -> Path:
        return NETNS_DIR / f"{self.name}-{node_id}"

    # ---- life cycle
    def start(self, prefer: str | None = None, owner: str = "",
              public: Fabric | None = None) -> Fabric:
        """Make the fabric. ``prefer``: the control address this box had before (a restart
        on the same directory, ``owner``): kept when it is free, so nodes and a running
        manager that listens there reach this machine at the same address again.
        ``public``: the fabric of the box's first cluster, when this one is another
        cluster's: its control address is where the control machine is for every cluster
        (as a CloudLab control node's public address is reached from every cluster), so
        this fabric's nodes get a route to that one address (through the control machine's
        address on their own network) and ``public``'s firewall takes packets to it from
        this fabric's end (:meth:`admit`); nothing else of ``public``'s network."""
        self.owner = owner
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        with open(STATE_DIR / ".lock", "a") as global_lock:
            fcntl.flock(global_lock, fcntl.LOCK_EX)
            reap()
            self._lock_fd = os.open(STATE_DIR / f"{self.name}.lock",
                                    os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            self.k = self._free_subnet(prefer)
            host_end = self.name
            try:
                _run(["netns", "add", self.name])
                _run(["-n", self.name], ["link set lo up", "link add ctl type bridge",
                                         "link set ctl up"])
                _run([], [f"link add {host_end} type veth peer name host netns {self.name}",
                          f"addr add {self.control_ip}/16 dev {host_end}",
                          f"link set {host_end} up"])
                _run(["-n", self.name], ["link set host master ctl", "link set host up"])
                _nft_run(firewall_rules(self.name, f"{self.subnet}.0.0/16", host_end,
                                        self.control_ip))
                if public is not None:
                    public.admit(host_end)
                    self.public = public
            except NetworkError:
                self.stop()
                raise
        log.info("nodes on their own network: control network %s.0.0/16, the control "
                 "machine at %s", self.subnet, self.control_ip)
        return self

    def admit(self, host_end: str) -> None:
        """Take packets to this fabric's control address (that one address) from
        ``host_end``, another cluster's end of its veth (see :meth:`start`)."""
        _nft_run(f'add element inet {self.name} admitted {{ "{host_end}" }}\n')

    def dismiss(self, host_end: str) -> None:
        """Undo :meth:`admit` (nothing when this fabric's table is gone already)."""
        try:
            _nft_run(f'delete element inet {self.name} admitted {{ "{host_end}" }}\n')
        except NetworkError as err:
            log.debug("%s: %s", self.name, err)

    @property
    def routes(self) -> list[str]:
        """The ``ip route`` lines of a node, beyond its own subnets: to the control
        machine's public address, when it is on another cluster's network."""
        if self.public is None or self.public.control_ip == self.control_ip:
            return []
        return [f"route add {self.public.control_ip}/32 via {self.control_ip} dev eth0"]

    def _wait_address_gone(self, timeout: float = 5.0) -> None:
        """Until the host's end of the veth (the control address) is gone: the kernel tears
        a network namespace down after its last user, a node process dying, so a box started
        again at once would find its control network still in use and take another (the
        manager, which listens at the old address, then reaches no node)."""
        deadline = time.monotonic() + timeout
        while f"inet {self.control_ip}/" in _addresses() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _free_subnet(self, prefer: str | None = None) -> int:
        """The control network to take (the caller holds the global lock): the one it had
        (``prefer``) when free, else the lowest free one that no box stopped within
        :data:`HOLD_RELEASED` seconds (a box restarting wants its own back; broke: a
        parallel test's new box took it between the stop and the start, and the chaos
        run's manager, listening at the old address, reached no CM fetch), else any free."""
        used = {int(m) - CONTROL_BASE for m in re.findall(r"inet 100\.(\d+)\.", _addresses())}
        held = _recently_released()
        wanted = re.fullmatch(r"100\.(\d+)\.0\.1", prefer or "")
        k = int(wanted.group(1)) - CONTROL_BASE if wanted else -1
        # its own, unless another box released it a moment ago (and wants it back: broke,
        # an old directory's box took the network a restarting box had just let go)
        if 0 <= k < CONTROL_NETS and held.get(k, self.owner) == self.owner:
            if k in used and held.get(k) == self.owner:   # let go, still going (loaded)
                ip = f"inet 100.{CONTROL_BASE + k}.0.1/"
                deadline = time.monotonic() + RELEASE_WAIT
                while ip in _addresses() and time.monotonic() < deadline:
                    time.sleep(0.1)
                if ip not in _addresses():
                    used.discard(k)
            if k not in used:
                return k
        free = [k for k in range(CONTROL_NETS) if k not in used]
        for k in free:
            if k not in held:
                return k
        if free:   # every free one let go within the minute (a busy machine: the parallel
            # suite once took a box's network so): the one let go the longest ago
            released = _released()
            return min(free, key=lambda k: released.get(k, (0.0, ""))[0])
        raise NetworkError("every control network of 100.64.0.0/10 is in use on this machine")

    def stop(self) -> None:
        with self._mutex:
            nodes = list(self._nodes)
        if self.k >= 0:   # held for this box's restart before its address goes: marked
            # after, another box starting in between took the network as free and unheld
            _mark_released(self.k, self.owner)
        public, self.public = self.public, None
        if public is not None:
            public.dismiss(self.name)
        try:
            for node_id in nodes:
                self.remove(node_id)
            for ns in NETNS_DIR.glob(f"{self.name}-*") if NETNS_DIR.is_dir() else []:
                _delete_netns(ns.name)
            _delete_host_end(self.name)
            _delete_netns(self.name)
            _delete_table(self.name)
        finally:
            if self.k >= 0:
                self._wait_address_gone()
        if self._lock_fd is not None:
            (STATE_DIR / f"{self.name}.lock").unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    # ---- nodes
    def add(self, node_id: str, lans: list[tuple[str, str, int, str]]) -> Path:
        """The node's namespace, wired: ``eth0`` on the control network, and per
        ``(lan bridge, address, prefix length, mac)`` an ``ethN`` on that LAN."""
        self.remove(node_id)  # a power cycle: a fresh one
        ns = self.netns(node_id).name
        _run(["netns", "add", ns])
        with self._mutex:
            self._nodes[node_id] = ns
            port = next(self._ports)
        with self._bridges:  # made before any node's veth is put on them
            new = sorted({bridge for bridge, *_ in lans} - self._lans)
            if new:
                _run(["-n", self.name], [line for bridge in new for line in (
                    f"link add {bridge} type bridge", f"link set {bridge} up")])
                self._lans.update(new)
        fabric = [f"link add c{port} type veth peer name eth0 netns {ns}",
                   f"link set c{port} master ctl up"]
        inside = ["link set lo up", f"addr add {self.node_ip(node_id)}/16 dev eth0",
                  "link set eth0 up", *self.routes]
        for j, (bridge, address, prefix, mac) in enumerate(lans, start=1):
            peer = f"eth{j} address {mac}" if mac else f"eth{j}"
            fabric += [f"link add l{port}x{j} type veth peer name {peer} netns {ns}",
                       f"link set l{port}x{j} master {bridge} up"]
            if address:
                inside.append(f"addr add {address}/{prefix} dev eth{j}")
            inside.append(f"link set eth{j} up")
        try:
            _run(["-n", self.name], fabric)
            _run(["-n", ns], inside)
            # as on a machine of its own: root binds any port (the namespace is the host
            # user namespace's, so the node's root would not otherwise)
            in_netns(ns, _write_sysctl, "/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")
        except NetworkError:
            self.remove(node_id)
            raise
        return self.netns(node_id)

    def remove(self, node_id: str) -> None:
        with self._mutex:
            ns = self._nodes.pop(node_id, None)
        if ns is not None:
            _delete_netns(ns)  # its veths go with it, and their fabric ends


def lans_of(node_interfaces: list[dict], links: list[dict]) -> list[tuple[str, str, int, str]]:
    """``(bridge, address, prefix length, mac)`` per interface of a node on a LAN of its
    sliver (``links``: the sliver's)."""
    tag = {ref: str(link.get("vlantag", "0")) for link in links
           for ref in link.get("interfaces", [])}
    out = []
    for iface in node_interfaces:
        vlan = tag.get(iface.get("client_id"))
        if vlan is None:
            continue
        out.append((f"lan{vlan}", iface.get("ip") or "", _prefixlen(iface.get("netmask")),
                    iface.get("mac") or ""))
    return out
