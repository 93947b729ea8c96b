"""What ``geni-get`` answers a node, from the node's own data (as tmcd.c's geni commands).

Commands (tmcd.c): ``client_id``, ``slice_urn``, ``slice_email``, ``user_urn``,
``user_email``, ``geni_user`` (JSON: the slice's users and their SSH keys), ``manifest``
(the sliver's manifest RSpec, with this node's interfaces and addresses), ``certificate``
and ``key`` (the box has no slice key pair: "not available", exit status 1), ``control_mac``
(12 hex digits), ``version``, ``getversion`` (JSON, the CM's), ``sliverstatus`` (JSON, AM API
v2 style), ``status`` (JSON, AM API v3 style), ``commands`` (JSON, the described commands),
``param NAME`` (profile parameters: the box has none, "undefined parameter") and ``all``
(JSON of every command that has an answer). A node asks with the key the box gave it
(``tmcd.json``); it learns about its own sliver only.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from elasticslice.emulator import manifest as mf
from elasticslice.emulator.authority import from_epoch
from elasticslice.emulator.context import Context
from elasticslice.emulator.setup import install_executable, write_atomic
from elasticslice.emulator.store import BootState, Holder, NodeRow

CLIENT_SOURCE = Path(__file__).with_name("genigetclient.py")
GENI_VERSION = "1"
DESCRIBED = {  # tmcd.c's genicommands, their descriptions
    "client_id": "Return the experimenter-specified client_id for this node",
    "commands": "Show all available commands",
    "control_mac": "Show the MAC address of the control interface on this node",
    "geni_user": "Show user accounts and public keys installed on this node",
    "getversion": "Report the GetVersion output of the aggregate manager that allocated "
                  "this node",
    "manifest": "Show the manifest rspec for the local aggregate sliver",
    "slice_email": "Retrieve the e-mail address from the certificate of the slice containing "
                   "this node",
    "slice_urn": "Show the URN of the slice containing this node",
    "sliverstatus": "Give the current status of this sliver (AM API v2)",
    "status": "Give the current status of this sliver (AM API v3)",
    "user_email": "Show the e-mail address of this sliver's creator",
    "user_urn": "Show the URN of this sliver's creator",
}
QUOTED = ("client_id", "control_mac", "manifest", "slice_email", "slice_urn", "user_email",
          "user_urn", "version", "certificate", "key")
JSON_VALUED = ("geni_user", "getversion", "sliverstatus", "status")
PARAM = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Refusal(Exception):
    """An answer tmcd gives as an error (geni-get exits 1 with it)."""


def install_client(box: Path) -> Path:
    """Put ``geni-get`` in the box's layer of the image (``/usr/bin/geni-get``), and the
    box's ``sudo`` next to it (:func:`elasticslice.emulator.nodeusers.install_sudo`)."""
    from elasticslice.emulator.nodeusers import install_sudo
    target = install_executable(CLIENT_SOURCE, box / "usr" / "bin" / "geni-get")
    install_sudo(box)
    return target


def write_node_config(geni_dir: Path, url: str, key: str) -> None:
    """What the node's geni-get reads: where to ask, and its key."""
    geni_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(geni_dir / "tmcd.json", json.dumps({"url": url, "key": key}) + "\n")
    (geni_dir / "tmcd.json").chmod(0o644)


def answer(ctx: Context, node: NodeRow, command: str, argument: str = "") -> str:
    """The answer to one command for ``node`` (a node of a slice); Refusal otherwise."""
    if command == "param":
        if not PARAM.fullmatch(argument):
            raise Refusal("illegal parameter")
        raise Refusal("undefined parameter")
    if command == "commands":
        width = max(len(name) for name in DESCRIBED) + 1
        lines = [f' "{name}":{" " * (width - len(name))}"{text}"'
                 for name, text in sorted(DESCRIBED.items())]
        return "{\n" + ",\n".join(lines) + "\n}"
    if command == "all":
        return json.dumps(_all(ctx, node))
    if command in ("certificate", "key"):
        raise Refusal(f"{command}: not available (the box issues no slice key pair)")
    handler = _HANDLERS.get(command)
    if handler is None:
        raise Refusal("unknown request")
    return handler(ctx, node)


def _all(ctx: Context, node: NodeRow) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted(set(QUOTED) | set(JSON_VALUED)):
        try:
            value = answer(ctx, node, name)
        except Refusal:
            continue
        out[name] = json.loads(value) if name in JSON_VALUED else value
    return out


def _sliver(ctx: Context, node: NodeRow) -> Any:
    sliver = ctx.store.get_sliver(node.slice_urn)
    if sliver is None:
        raise Refusal("no sliver")
    return sliver


def _uid(urn: str) -> str:
    return urn.rsplit("+", 1)[-1]


def _user_email(ctx: Context, node: NodeRow) -> str:
    return f"{_uid(_sliver(ctx, node).creator_urn)}@{ctx.config.domain}"  # the SA's


def _geni_user(ctx: Context, node: NodeRow) -> str:
    users = []
    for entry in _sliver(ctx, node).keys or []:
        if not isinstance(entry, dict):
            continue
        urn = entry.get("urn") or ctx.config.identity.user_urn(str(entry.get("login", "")))
        keys = [k.get("key") for k in entry.get("keys") or []
                if isinstance(k, dict) and isinstance(k.get("key"), str)]
        if keys:
            users.append({"urn": urn, "keys": keys})
    if not users:
        raise Refusal("no users found")
    return json.dumps(users)


def _getversion(ctx: Context, node: NodeRow) -> str:
    return json.dumps({"geni_am_code_version": "elasticslice-emulator",
                       "geni_urn": ctx.identity.cm_urn, "geni_am_type": "protogeni",
                       "geni_single_allocation": True, "geni_allocate": "geni_disjoint",
                       "geni_api_versions": {"2": f"{ctx.url}/cm/2.0"},
                       "geni_credential_types": [{"geni_type": "geni_sfa", "geni_version": "2"},
                                                 {"geni_type": "geni_sfa", "geni_version": "3"}]})


def _nodes(ctx: Context, node: NodeRow) -> list[NodeRow]:
    return [n for n in ctx.store.nodes(slice_urn=node.slice_urn) if n.holder is Holder.SLICE]


def _sliverstatus(ctx: Context, node: NodeRow) -> str:
    sliver = _sliver(ctx, node)
    rows = _nodes(ctx, node)
    overall = mf.aggregate_status(rows)
    return json.dumps({
        "geni_urn": sliver.sliver_urn,
        "geni_status": overall if overall in ("ready", "failed") else "unknown",
        "geni_resources": [{"geni_urn": r.sliver_urn, "geni_status": r.boot_state.value,
                            "geni_error": str(r.attrs.get("error", ""))
                            if r.boot_state is BootState.FAILED else ""} for r in rows]})


def _status(ctx: Context, node: NodeRow) -> str:
    sliver = _sliver(ctx, node)
    expires = from_epoch(sliver.expires).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps({
        "geni_urn": node.slice_urn,
        "geni_slivers": [{"geni_urn": r.sliver_urn, "geni_expires": expires,
                          "geni_allocation_status": "geni_provisioned",
                          "geni_operational_status": f"geni_{r.boot_state.value}",
                          "geni_error": str(r.attrs.get("error", ""))
                          if r.boot_state is BootState.FAILED else ""}
                         for r in _nodes(ctx, node)]})


def _manifest(ctx: Context, node: NodeRow) -> str:
    sliver = _sliver(ctx, node)
    return mf.manifest(ctx, sliver, _nodes(ctx, node))


_HANDLERS = {
    "client_id": lambda ctx, node: node.client_id,
    "slice_urn": lambda ctx, node: node.slice_urn,
    "slice_email": _user_email,
    "user_urn": lambda ctx, node: _sliver(ctx, node).creator_urn,
    "user_email": _user_email,
    "geni_user": _geni_user,
    "manifest": _manifest,
    "control_mac": lambda ctx, node: mf.mac_for(node.node_id, "control").replace(":", ""),
    "version": lambda ctx, node: GENI_VERSION,
    "getversion": _getversion,
    "sliverstatus": _sliverstatus,
    "status": _status,
}
