"""A node's users: the sliver's logins as accounts of the node, and the uid map that makes
them real.

On CloudLab the experiment's users have accounts on every node of it (``rc.accounts``), the
startup command runs as the experiment's creator (``tmcd/tmcd.c``: ``dostartcmd`` sends
``UID=<swapper>``; ``clientside/tmcc/common/runstartup`` looks the login up with
``getpwnam`` and takes its uid, gid and groups, ``id -G``) and they have passwordless
``sudo``. The box gives a node the same: the sliver's logins (the creator's first, then
those of CreateSliver's ``keys``: the store's node attribute ``logins``) get entries in the
node's ``/etc/passwd`` and ``/etc/group``, written into the node's own layer over the
image's ``/etc`` (``D/nodes/<node>/layer/etc``), each a home ``/users/<login>`` on the
node's disk (Emulab's homes are ``/users/<login>``) and the project's group as its primary
group (as Emulab's accounts have).

Node uids and gids are real ones: with the rights for it (root: ``CAP_SETUID`` and
``CAP_SETGID`` in the host's user namespace) the node's user namespace maps node root to the
host's root, as before, and node uids and gids 1..65535 to :data:`HOST_ID_BASE` + the same
number on the host, a range no account of this machine uses (1879048192 = 0x70000000, just
above systemd's range for containers, 0x80000-0x6FFFFFFF). So a file a node user makes on
its disk belongs, on the host, to ``0x70000000 + its uid`` (``elastic``, uid 20001 on the
node, is host uid 1879068193), and a file of node root is host root's.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

HOST_ID_BASE = 0x70000000  # node uid/gid N (1..NODE_IDS-1) is host uid/gid HOST_ID_BASE + N
NODE_IDS = 65536           # node uids and gids 0..65535 exist; 0 is the host's root
FIRST_UID = 20001          # the first uid given to a login (Emulab's are in the 10000s)
FIRST_GID = 6000           # the first gid given to a project group
HOMES = "/users"
SHELL = "/bin/bash"
LOGIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,31}$")
CLIENT_SOURCE = Path(__file__).with_name("sudoclient.py")


@dataclass(frozen=True)
class Account:
    """One user of a node, as its ``/etc/passwd`` and ``/etc/group`` say."""

    login: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # ``id -G``: the primary group first
    home: str


@dataclass(frozen=True)
class Accounts:
    """The node's users, the creator's first; ``refused``: logins that cannot be accounts
    (not a login name, or a system account of the image)."""

    users: list[Account] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def get(self, login: str) -> Account | None:
        return next((a for a in self.users if a.login == login), None)


def host_id(node_id: int) -> int:
    """The host's uid (or gid) of a node's ``node_id`` (mapped nodes only)."""
    if node_id == 0:
        return 0
    if not 0 < node_id < NODE_IDS:
        raise ValueError(f"node id {node_id} is outside the node's range 0..{NODE_IDS - 1}")
    return HOST_ID_BASE + node_id


def id_map() -> str:
    """The node's first user namespace's ``uid_map`` and ``gid_map`` (inside outside count)."""
    return f"0 0 1\n1 {HOST_ID_BASE + 1} {NODE_IDS - 1}\n"


def _entries(path: Path) -> list[list[str]]:
    try:  # never through a link: a tarball's or an image's could name a host file
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as handle:
        text = handle.read(1 << 22).decode("utf-8", errors="replace")
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def _base(layer: Path, image_etc: Path | None, name: str) -> Path:
    """The file the node sees now (its layer, the custom image's, the host's)."""
    for top in (layer / "etc", image_etc):
        if top is not None and (top / name).is_file() and not (top / name).is_symlink():
            return top / name
    return Path("/etc") / name


def _free(used: set[int], start: int) -> int:
    value = start
    while value in used:
        value += 1
    if value >= NODE_IDS:
        raise ValueError("no free id below 65536 on the node")
    return value


def write_accounts(layer: Path, image_etc: Path | None, logins: list[str],
                   project: str) -> Accounts:
    """Give ``logins`` accounts in ``layer/etc/passwd`` and ``layer/etc/group`` (over the
    image's), the project's group as their primary group. Idempotent: an account written at
    an earlier boot keeps its uid."""
    passwd = _entries(_base(layer, image_etc, "passwd"))
    group = _entries(_base(layer, image_etc, "group"))
    by_login = {e[0]: e for e in passwd if len(e) >= 7}
    uids = {int(e[2]) for e in by_login.values() if e[2].isdigit()}
    groups = {e[0]: e for e in group if len(e) >= 4}
    gname = re.sub(r"[^a-z0-9_-]", "", project.lower()) or "emulab"
    if gname not in groups:
        gids = {int(e[2]) for e in groups.values() if e[2].isdigit()}
        groups[gname] = [gname, "x", str(_free(gids, FIRST_GID)), ""]
    pgid = int(groups[gname][2])
    accounts, refused = [], []
    for login in dict.fromkeys(logins):
        entry = by_login.get(login)
        home = f"{HOMES}/{login}"
        if not LOGIN.fullmatch(login) or (entry is not None and entry[5] != home):
            refused.append(login)  # not a name, or one of the image's own accounts
            continue
        if entry is None:
            uid = _free(uids, FIRST_UID)
            uids.add(uid)
            entry = by_login[login] = [login, "x", str(uid), str(pgid), "", home, SHELL]
            passwd.append(entry)
        members = groups[gname][3].split(",") if groups[gname][3] else []
        if login not in members:
            groups[gname][3] = ",".join([*members, login])
        accounts.append((login, int(entry[2]), int(entry[3]), home))
    if refused:
        log.warning("node layer %s: no account for %s (not a login name, or the image's own "
                    "account)", layer.parent.name, ", ".join(refused))
    lines = [":".join(e) for e in passwd]
    group_lines = [":".join(e) for e in groups.values()]
    _write(layer / "etc" / "passwd", lines)
    _write(layer / "etc" / "group", group_lines)
    users = [Account(login, uid, gid, _id_groups(login, gid, list(groups.values())), home)
             for login, uid, gid, home in accounts]
    return Accounts(users, refused)


def _id_groups(login: str, gid: int, group: list[list[str]]) -> tuple[int, ...]:
    """What ``id -G login`` prints: the primary group, then every group listing it."""
    found = [gid]
    for entry in group:
        if entry[2].isdigit() and login in entry[3].split(",") and int(entry[2]) not in found:
            found.append(int(entry[2]))
    return tuple(found)


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_dir():
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.chmod(0o644)
    os.replace(tmp, path)


def install_sudo(box: Path) -> Path:
    """Put the box's ``sudo`` in the box's layer of the image (``/usr/bin/sudo``)."""
    from elasticslice.emulator.setup import install_executable
    return install_executable(CLIENT_SOURCE, box / "usr" / "bin" / "sudo")
