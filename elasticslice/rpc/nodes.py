"""The nodes of a sliver as their user sees them: the manifest's names, addresses and logins
joined with SliverStatus' per-node status, by client_id.

CloudLab writes how to reach a node into the manifest (``host@name``, ``host@ipv4`` and one
``services/login`` per user allowed in); :func:`sliver_nodes` picks the login of the given
user (the caller's uid, from the certificate URN) and writes it as a ready-to-paste
``ssh -p PORT user@host`` line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from elasticslice.rpc.cm import SliverStatus

if TYPE_CHECKING:  # annotations only: the RSpec package (lxml) is the caller's to import
    from elasticslice.rspec import Interface, Login, RSpec

#: Status of a manifest node that SliverStatus does not (yet) list.
UNKNOWN = "unknown"


def ssh_command(login: Login | None) -> str | None:
    """``ssh -p PORT user@host`` for a manifest login (port 22 when it names none); None
    when the login names no host."""
    if login is None or not login.hostname:
        return None
    user = f"{login.username}@" if login.username else ""
    return f"ssh -p {login.port or 22} {user}{login.hostname}"


@dataclass
class SliverNode:
    """One node of a sliver: ``status`` is SliverStatus' (ready, notready, changing, failed;
    ``unknown`` when SliverStatus does not list it), ``state`` its started/stopped, ``login``
    the user's login (the first when none is theirs), ``ipv4`` the control IP."""

    client_id: str
    status: str = UNKNOWN
    state: str = ""
    hostname: str | None = None
    ipv4: str | None = None
    login: Login | None = None
    logins: list[Login] = field(default_factory=list)
    component_id: str | None = None
    hardware_type: str | None = None
    sliver_id: str | None = None
    error: str = ""
    interfaces: list[Interface] = field(default_factory=list)

    @property
    def ssh(self) -> str | None:
        return ssh_command(self.login)

    def to_json_dict(self) -> dict[str, Any]:
        """The shape ``elasticslice nodes --json`` prints, one per node."""
        return {
            "client_id": self.client_id, "status": self.status, "state": self.state,
            "hostname": self.hostname, "ipv4": self.ipv4, "ssh": self.ssh,
            "login": self.login.to_json_dict() if self.login else None,
            "logins": [login.to_json_dict() for login in self.logins],
            "component_id": self.component_id, "hardware_type": self.hardware_type,
            "sliver_id": self.sliver_id, "error": self.error,
            "interfaces": [{"client_id": i.client_id, "ip": i.ip, "netmask": i.netmask,
                            "mac": i.mac} for i in self.interfaces],
        }


def _login_for(logins: list[Login], user: str | None) -> Login | None:
    mine = [login for login in logins if user and login.username == user]
    return (mine or logins or [None])[0]


def sliver_nodes(manifest: RSpec, status: SliverStatus | None = None,
                 user: str | None = None) -> list[SliverNode]:
    """The manifest's nodes in its order, each with its status from ``status`` (if given)
    and the login of ``user`` (if the manifest has one for them)."""
    out = []
    for node in manifest.nodes:
        cid = node.client_id or ""
        st = status.node(cid) if status is not None else None
        out.append(SliverNode(
            client_id=cid, status=st.status if st else UNKNOWN, state=st.state if st else "",
            hostname=node.hostname, ipv4=node.ipv4, login=_login_for(node.logins, user),
            logins=list(node.logins), component_id=node.component_id,
            hardware_type=node.hardware_type, sliver_id=node.sliver_id,
            error=st.error if st else "", interfaces=list(node.interfaces)))
    return out
