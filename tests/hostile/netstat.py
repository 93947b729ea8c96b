"""Which addresses a process listens on, read from /proc as `ss -ltn` would (no psutil).

``listening(pid)``: the (address, port) of every listening TCP socket the process (and, with
``children``, its descendants) holds open; IPv6 addresses in their usual text form.
``LOOPBACK``: the addresses that are this machine only. ``reachable_from_outside(addresses)``:
those of ``addresses`` a neighbour of this machine could reach: neither loopback nor a box's
control address that its firewall keeps to this machine and the box's nodes (the box's
nodes are on networks of their own: docs/emulator.md, "The node's network").
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
import subprocess

LOOPBACK = {"127.0.0.1", "::1"}
BOX_CONTROL = ipaddress.ip_network("100.64.0.0/10")


def _ruleset() -> str:
    nft = shutil.which("nft", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if nft is None:
        return ""
    return subprocess.run([nft, "list", "ruleset"], capture_output=True, text=True,
                          check=False).stdout


def reachable_from_outside(addresses: set[str]) -> set[str]:
    """The addresses of ``addresses`` a neighbour of this machine could reach."""
    rules = None
    out = set()
    for address in addresses:
        if address in LOOPBACK:
            continue
        ip = ipaddress.ip_address(address)
        if ip in BOX_CONTROL:
            rules = _ruleset() if rules is None else rules
            subnet = ipaddress.ip_network(f"{address}/16", strict=False)
            if f'ip daddr {subnet} iifname != {{ "lo", ' in rules:
                continue
        out.add(address)
    return out
_LISTEN = "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _address(hex_ip: str) -> str:
    raw = bytes.fromhex(hex_ip)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = struct.unpack("<" + "I" * (len(raw) // 4), raw)
    packed = struct.pack(">" + "I" * len(words), *words)
    family = socket.AF_INET if len(packed) == 4 else socket.AF_INET6
    text = socket.inet_ntop(family, packed)
    mapped = ipaddress.ip_address(text)
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped:
        return str(mapped.ipv4_mapped)
    return text


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return found


def listening(pid: int, children: bool = False) -> set[tuple[str, int]]:
    result: set[tuple[str, int]] = set()
    for proc in descendants(pid) if children else [pid]:
        try:
            inodes = _socket_inodes(proc)
        except OSError:  # exited meanwhile
            continue
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{proc}/net/{table}") as f:
                    lines = f.readlines()[1:]
            except OSError:  # exited meanwhile
                continue
            for line in lines:
                fields = line.split()
                if fields[3] == _LISTEN and fields[9] in inodes:
                    ip, port = fields[1].split(":")
                    result.add((_address(ip), int(port, 16)))
    return result
