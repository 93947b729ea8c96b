"""``init_emulator``: the emulator directory, its PKI and a client config that works as is.

Layout of an emulator directory D::

    ca.pem ca-key.pem          the emulator's CA (the only root it trusts)
    server.pem server-key.pem  TLS server certificate (SANs localhost, 127.0.0.1)
    sa.pem sa-key.pem          the SA's certificate: signs user and slice credentials
    cm.pem cm-key.pem          the CM's certificate: signs sliver credentials, and is the
                               client certificate of the emulator's callbacks
    admin.pem                  certificate + key of the emulator's admin (admin commands)
    user.pem password          the user's certificate + encrypted key, like cloudlab.pem
    users/<uid>/               more users of the same CA (`emulator add-user`): user.pem,
                               password, elasticslice.conf
    elasticslice.conf          the client config ([protogeni] ..., [pilots]), URLs with the
                               real port
    images.json images/        custom disk images (``emulator image add``; ELASTICSLICE-PILOT)
    box/                       the box's layer of every image (/usr/bin/geni-get)
    tarfiles/                  install tarballs the CM fetched, per slice
    emulator.json              domain, user, project, port, clusters
    cms/<name>/                a cluster of a box with several CMs (``init --cm``): cm.pem,
                               cm-key.pem, inventory.ini, state.db, nodes/ (clusters.py)
    state.db                   SQLite state (slices, slivers, nodes, reclamations)
    server.json                URL and pid of the running server (while it runs)
    serve.lock                 held (flock) by the running server: one server per directory
    nodes/<node>/              the nodes' files: root/ (the node's own /), startup.log...
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from elasticslice.errors import ConfigError, ElasticSliceError

if TYPE_CHECKING:
    from elasticslice.emulator.authority import Identity
    from elasticslice.emulator.clusters import Cluster

DEFAULT_DOMAIN = "emulab.test"
DEFAULT_USER = "elastic"
DEFAULT_PROJECT = "elasticslice"
DEFAULT_SLICE = "elastic"
DEFAULT_PORT = 12369


@dataclass
class EmulatorConfig:
    """What ``emulator.json`` holds."""

    domain: str = DEFAULT_DOMAIN
    user: str = DEFAULT_USER
    project: str = DEFAULT_PROJECT
    slice_name: str = DEFAULT_SLICE
    port: int = 0
    host: str = "127.0.0.1"
    clusters: list[str] = field(default_factory=list)  # init --cm: the CMs' names, in order

    @property
    def identity(self) -> Identity:
        from elasticslice.emulator.authority import Identity
        return Identity(self.domain)

    def cluster_list(self, directory: Path) -> list[Cluster]:
        from elasticslice.emulator.clusters import clusters_of
        return clusters_of(Path(directory).resolve(), self.domain, list(self.clusters))


def load_config(directory: str | Path) -> EmulatorConfig:
    path = Path(directory) / "emulator.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ConfigError("not an emulator directory (run `elasticslice emulator init` first)",
                          path=str(Path(directory))) from err
    except (OSError, ValueError) as err:
        raise ConfigError(f"unreadable: {err}", path=str(path)) from err
    known = {k: v for k, v in data.items() if k in EmulatorConfig.__dataclass_fields__}
    return EmulatorConfig(**known)


def base_url(host: str, port: int) -> str:
    """The XML-RPC base URL of a server at host:port (a wildcard address is reached locally)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    return f"https://{shown}:{port}/protogeni/xmlrpc"


def write_client_conf(directory: str | Path, host: str, port: int,
                      listen: str | None = None) -> Path:
    """(Re)write D/elasticslice.conf (and each added user's) for a server at host:port;
    ``listen``: the control machine's address on the box's control network, when its nodes
    have networks of their own (docs/emulator.md, "The node's network")."""
    d = Path(directory).resolve()
    cfg = load_config(d)
    url = base_url(host, port)
    for extra in sorted((d / "users").glob("*/user.pem")):
        _write_conf(extra.parent, url, d, cfg.project, _slice_name_for(extra.parent.name),
                    listen)
    return _write_conf(d, url, d, cfg.project, cfg.slice_name, listen)


def cm_bases(d: Path, url: str) -> list[str]:
    """The XML-RPC base of each CM of the box at ``url`` (the SA's): one per cluster, in
    order, or the SA's own for a box of one CM."""
    clusters = load_config(d).cluster_list(d)
    return [c.url(url) for c in clusters] or [url]


def _write_conf(home: Path, url: str, d: Path, project: str, slice_name: str,
                listen: str | None = None) -> Path:
    bases = cm_bases(d, url)
    where = ("# The box's nodes are on a network of their own: they reach this machine at\n"
             f"# {listen} only (its control network address).\n"
             f"listen = {listen}\n") if listen else ""
    text = (
        "# Client config for the elasticslice emulator (CloudLab in a box) in this folder.\n"
        "# Written by `elasticslice emulator init`, rewritten when the server starts.\n"
        "\n"
        "[pilots]\n"
        "# Pilot nodes boot the stock image and build the node agent's environment with its\n"
        "# python3, from the wheelhouse the control node publishes. The pilot image has\n"
        "# this installation's agent already (quicker, as a custom image of yours would):\n"
        f"#   disk_image = urn:publicid:IDN+{load_config(d).domain}+image+{project}//"
        "ELASTICSLICE-PILOT\n"
        "#   node_python = python3\n"
        f"{where}"
        "\n"
        "[protogeni]\n"
        f"certificate = {home / 'user.pem'}\n"
        f"passphrase_file = {home / 'password'}\n"
        f"sa_url = {url}/sa\n"
        f"cm_urls = {', '.join(b + '/cm' for b in bases)}\n"
        f"ca_bundle = {d / 'ca.pem'}\n"
        f"slice_name = {slice_name}\n"
        f"project = {project}\n"
        f"dynslice_urls = {', '.join(b + '/dynslice' for b in bases)}\n"
        f"credential_cache_dir = {home / 'credentials'}\n"
        "# The emulator is local: retry BUSY sooner than against the real CloudLab.\n"
        "retry_delay = 0.5\n"
        "retry_max_delay = 5\n"
    )
    return write_atomic(home / "elasticslice.conf", text)


def write_atomic(path: Path, text: str) -> Path:
    """Replace a file in one step, so a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def install_executable(source: Path, target: Path) -> Path:
    """Copy ``source`` to ``target`` (mode 0755) in one step, its folders made."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, staged)
    staged.chmod(0o755)
    staged.replace(target)
    return target


def lock_directory(directory: Path) -> int:
    """Take ``D/serve.lock`` (one server per directory: a second one would rewrite the first's
    client config and ``server.json`` and share its SQLite state). Returns the descriptor
    holding the lock: closing it releases the lock, as does the process ending."""
    fd = os.open(directory / "serve.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        try:
            where = json.loads((directory / "server.json").read_text())["url"]
        except (OSError, ValueError, KeyError, TypeError):
            where = "see server.json"
        raise ElasticSliceError(f"{directory}: an emulator is already serving this directory "
                                f"({where}); stop it first") from err
    return fd


def _issue(d: Path, name: str, ca: bytes, ca_key: bytes, cn: str, **kw: object) -> None:
    from elasticslice.rpc import pki
    cert, key = pki.issue_certificate(ca, ca_key, cn, **kw)  # type: ignore[arg-type]
    (d / f"{name}.pem").write_bytes(cert)
    pki.write_private_file(d / f"{name}-key.pem", key)


_NAMES = {  # what goes into URNs, certificates and the client config
    "domain": (re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}"), "letters, digits, '.', '-'"),
    "user": (re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}"), "a letter, then letters, digits, '_', '-'"),
    "project": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}"), "letters, digits, '_', '-'"),
    "slice_name": (re.compile(r"[A-Za-z][A-Za-z0-9-]{0,18}"),
                   "a letter, then letters, digits, '-'; at most 19"),
}


def _check_names(**names: str) -> None:
    for key, value in names.items():
        pattern, rule = _NAMES[key]
        if not pattern.fullmatch(value):
            raise ConfigError(f"invalid {key.replace('_', ' ')} {value!r} ({rule})", key=key)


def _write_user(home: Path, ca: bytes, ca_key: bytes, cfg: EmulatorConfig, uid: str) -> bytes:
    """``home/user.pem`` (certificate + key encrypted with a new ``home/password``), like
    cloudlab.pem; returns the key (PEM). The localhost SANs let the user certificate also
    serve the client's callback endpoint on 127.0.0.1, which the emulator verifies by host."""
    from elasticslice.rpc import pki
    cert, key = pki.issue_certificate(
        ca, ca_key, uid, urn=cfg.identity.user_urn(uid), email=f"{uid}@{cfg.domain}",
        hostnames=("localhost",), ips=("127.0.0.1",),
        aia_url=f"{base_url(cfg.host, cfg.port or DEFAULT_PORT)}/sa")
    password = secrets.token_urlsafe(18)
    pki.write_private_file(home / "password", password.encode() + b"\n")
    pki.write_user_pem(home / "user.pem", cert, key, password)
    return key


def init_emulator(directory: str | Path, port: int = 0, *, domain: str = DEFAULT_DOMAIN,
                  user: str = DEFAULT_USER, project: str = DEFAULT_PROJECT,
                  slice_name: str = DEFAULT_SLICE, host: str = "127.0.0.1",
                  hostnames: tuple[str, ...] = (), force: bool = False,
                  clusters: tuple[str, ...] = ()) -> Path:
    """Create an emulator directory (CA, certificates, user PEM, password, client config).

    ``clusters``: ``NAME`` or ``NAME=INVENTORY`` each, a box of several CMs (clusters.py)."""
    from cryptography.hazmat.primitives import serialization

    from elasticslice.emulator import clusters as clusterlib
    from elasticslice.rpc import pki
    d = Path(directory).resolve()
    _check_names(domain=domain, user=user, project=project, slice_name=slice_name)
    specs = clusterlib.parse_specs(clusters)
    if (d / "ca.pem").exists() and not force:
        raise ConfigError("already an emulator directory (use --force to start over)",
                          path=str(d))
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the directory: {err.strerror or err}",
                          path=str(d)) from err
    os.chmod(d, 0o700)
    os.close(lock_directory(d))  # never start over under a running server
    for stale in ("state.db", "state.db-wal", "state.db-shm", "server.json"):
        (d / stale).unlink(missing_ok=True)
    cfg = EmulatorConfig(domain=domain, user=user, project=project, slice_name=slice_name,
                         port=port, host=host, clusters=clusterlib.write_inventories(d, specs))
    ident = cfg.identity
    ca, ca_key = pki.make_ca(f"elasticslice emulator CA ({domain})")
    (d / "ca.pem").write_bytes(ca)
    pki.write_private_file(d / "ca-key.pem", ca_key)
    ips, names = ["127.0.0.1"], ["localhost", *hostnames]
    if host not in ("127.0.0.1", "localhost", "0.0.0.0", "::"):
        try:
            ipaddress.ip_address(host)
            ips.append(host)
        except ValueError:
            names.append(host)
    _issue(d, "server", ca, ca_key, "localhost", urn=ident.cm_urn, hostnames=names, ips=ips)
    _issue(d, "sa", ca, ca_key, f"sa.{domain}", urn=ident.sa_urn)
    _issue(d, "cm", ca, ca_key, f"cm.{domain}", urn=ident.cm_urn)
    for cluster in cfg.cluster_list(d):
        _issue(cluster.home, "cm", ca, ca_key, f"cm.{cluster.domain}",
               urn=cluster.identity.cm_urn)
    admin_cert, admin_key = pki.issue_certificate(ca, ca_key, "emulator-admin",
                                                  urn=ident.admin_urn)
    pki.write_private_file(d / "admin.pem", admin_cert.rstrip(b"\n") + b"\n" + admin_key)
    user_key = _write_user(d, ca, ca_key, cfg, user)
    public = pki.load_private_key(user_key).public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (d / "user-ssh.pub").write_bytes(public + f" {user}@{domain}\n".encode())
    (d / "emulator.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n", encoding="utf-8")
    (d / "nodes").mkdir(exist_ok=True)
    from elasticslice.emulator.geniget import install_client
    from elasticslice.emulator.images import Images
    Images(d, ident, project).register_pilot()
    install_client(d / "box")
    write_client_conf(d, host, port)
    return d


@dataclass(frozen=True)
class UserFiles:
    """What :func:`issue_user` wrote for one more user of the emulator's CA."""

    uid: str
    urn: str
    pem: Path       # certificate + encrypted key, like cloudlab.pem
    password: Path
    config: Path    # a client config that works as is, with the user's own slice name


def _slice_name_for(uid: str) -> str:
    return uid.replace("_", "-")[:19]


def issue_user(directory: str | Path, uid: str) -> UserFiles:
    """Issue another user's certificate and key from the emulator's CA, into D/users/<uid>/.

    The user is an ordinary CloudLab user of the same CA: no authority over anyone else's
    slices (a second user for multi-user and attacker experiments).
    """
    d = Path(directory).resolve()
    cfg = load_config(d)
    _check_names(user=uid)
    home = d / "users" / uid
    if uid in (cfg.user, "emulator-admin") or (home / "user.pem").exists():
        raise ConfigError(f"user {uid!r} already exists", path=str(d))
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    _write_user(home, (d / "ca.pem").read_bytes(), (d / "ca-key.pem").read_bytes(), cfg, uid)
    try:
        url = json.loads((d / "server.json").read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        url = base_url(cfg.host, cfg.port or DEFAULT_PORT)
    config = _write_conf(home, url, d, cfg.project, _slice_name_for(uid))
    return UserFiles(uid, cfg.identity.user_urn(uid), home / "user.pem", home / "password",
                     config)
