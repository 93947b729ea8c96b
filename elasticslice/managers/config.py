"""The manager's configuration: ``[manager]`` and ``[endpoint]`` of the client's INI file.

::

    [manager]
    minthreshold = 1                 ; the slice never has fewer nodes (initial ones included)
    maxthreshold = 10                ; ... nor more
    percent_available_minimum = 0.5  ; add only while the CM keeps this fraction free
    enable_delete = false            ; give nodes back when the CM runs short
    interval.add_nodes = 300         ; any cycle method's interval, in seconds
    state_dir = ~/.protogeni/elasticslice-state

    [endpoint]
    address = 127.0.0.1
    port = 0

Every key is optional (missing sections mean defaults); ``etc/elasticslice.conf.example``
describes each. Relative paths are relative to the file. Environment overrides:
``ELASTICSLICE_<KEY>`` for ``[manager]`` keys (``ELASTICSLICE_INTERVAL_<METHOD>`` for
``interval.<method>``), ``ELASTICSLICE_ENDPOINT_<KEY>`` for ``[endpoint]``. Every bad value or
unknown key is a :class:`~elasticslice.errors.ConfigError` naming the key and the file.
"""
from __future__ import annotations

import configparser
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from elasticslice.config import ENV_PREFIX, read_ini
from elasticslice.errors import ConfigError
from elasticslice.managers.cycle import DEF_INTERVAL, DEF_INTERVALS, DEF_ORDER
from elasticslice.managers.policy import PolicyConfig
from elasticslice.rspec.addnodes import XML_BREAKERS
from elasticslice.rspec.rules import command_problem, startup_problem
from elasticslice.rspec.tarball import tarball_problem
from elasticslice.validate import MAX_SECONDS, boolean, https_url, ip_literal, number

MANAGER = "manager"
ENDPOINT = "endpoint"
DEFAULT_STATE_DIR = Path("~/.protogeni/elasticslice-state")

MANAGER_KEYS = (
    "minthreshold", "maxthreshold", "percent_available_minimum", "enable_delete",
    "retry_interval", "nodetype", "cmlist", "num_pcs", "image_urn", "startup_command",
    "tarballs", "node_prefix", "lan_prefix", "num_lans", "multiplex_lans", "state_dir",
    "renew_hours", "renew_margin", "idle_timeout", "add_cooldown", "delete_cooldown",
    "max_add_per_cycle", "max_delete_per_cycle", "hysteresis", "delete_in_group",
    "email", "email_to", "email_from", "smtp_host", "smtp_port", "smtp_starttls",
    "smtp_username", "smtp_password_file", "metrics_port")
ENDPOINT_KEYS = ("address", "port", "url", "cm_urn", "certificate", "keyfile",
                 "passphrase_file", "enabled", "policy")
RECLAIM_POLICIES = ("CLIENT", "LIFO")
INTERVAL_PREFIX = "interval."
MAX_NUM_PCS = 10_000  # nodes in the initial request (1e8 built a request without end)

_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,30}$")
_URN_RE = re.compile(r"^urn:publicid:IDN\+\S+$")
_EMAIL_RE = re.compile(r"^[^@\s,]+@[^@\s,]+$")


@dataclass(frozen=True)
class EndpointConfig:
    """Where the callback endpoint listens and whom it lets in."""

    address: str = "127.0.0.1"
    port: int = 0                     # 0: any free port
    url: str | None = None            # registered with SetSliceClientEndpoint; default from above
    cm_urn: str | None = None         # the only caller allowed; default: the CM's GetVersion urn
    certificate: Path | None = None   # server certificate (+ key); default: [protogeni]'s
    keyfile: Path | None = None       # when the key is not in the certificate file
    passphrase_file: Path | None = None
    enabled: bool = True
    policy: str = "CLIENT"            # reclaim by our values where the CM offers it, else LIFO


@dataclass(frozen=True)
class EmailConfig:
    """Mail on errors and node changes (off by default). The password stays in its file."""

    enabled: bool = False
    to: tuple[str, ...] = ()
    sender: str = "elasticslice@localhost"
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 25
    starttls: bool = False
    username: str | None = None
    password_file: Path | None = None


@dataclass(frozen=True)
class ManagerConfig:
    """A checked ``[manager]`` + ``[endpoint]``; defaults are the seed's."""

    minthreshold: int = 1
    maxthreshold: int = 10
    percent_available_minimum: float = 0.5
    enable_delete: bool = False
    retry_interval: float = 30.0
    nodetype: str | None = None
    cmlist: tuple[str, ...] = ()      # substrings/indexes of [protogeni] cm_urls; () = all
    num_pcs: int = 1
    image_urn: str | None = None
    startup_command: str | None = None
    tarballs: tuple[tuple[str, str], ...] = ()   # (url, install path)
    node_prefix: str = "node"
    lan_prefix: str = "lan"
    num_lans: int = 0
    multiplex_lans: bool = False
    state_dir: Path = field(default_factory=lambda: DEFAULT_STATE_DIR.expanduser())
    intervals: Mapping[str, float] = field(default_factory=lambda: dict(DEF_INTERVALS))
    renew_hours: float = 6.0          # how far ahead each renewal extends
    renew_margin: float = 3600.0      # renew when the expiry is closer than this (seconds)
    idle_timeout: float | None = None
    add_cooldown: float = 60.0
    delete_cooldown: float = 300.0
    max_add_per_cycle: int = 10
    max_delete_per_cycle: int = 1
    hysteresis: float = 0.1
    delete_in_group: bool = True
    metrics_port: int | None = None   # the Prometheus metrics on 127.0.0.1 (None: off)
    email: EmailConfig = field(default_factory=EmailConfig)
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    path: Path | None = None
    #: the keys the file (or the environment) gave: ``[manager]`` ones by name
    #: (``interval.<method>`` too), ``[endpoint]`` ones as ``endpoint.<key>``; what
    #: ``elasticslice run`` takes over its own defaults
    given: frozenset[str] = frozenset()

    def error(self, message: str, key: str) -> ConfigError:
        return ConfigError(message, key=key, path=str(self.path) if self.path else None)

    def cms(self, cm_urls: Sequence[str]) -> tuple[str, ...]:
        """``cmlist`` resolved against the configured CM URLs (all of them when empty): each
        entry is an index, a URL, or a substring matching exactly one URL."""
        if not self.cmlist:
            return tuple(cm_urls)
        out: list[str] = []
        for which in self.cmlist:
            if which.isdigit():
                if int(which) >= len(cm_urls):
                    raise self.error(f"no CM number {which} (have {len(cm_urls)})", "cmlist")
                found = [cm_urls[int(which)]]
            else:
                found = [u for u in cm_urls if u == which] or [u for u in cm_urls if which in u]
            if len(found) != 1:
                raise self.error(f"{which!r} matches {len(found)} of the configured CMs "
                                 f"({', '.join(cm_urls)})", "cmlist")
            if found[0] not in out:
                out.append(found[0])
        return tuple(out)

    def policy(self, cm_urls: Sequence[str] | None = None) -> PolicyConfig:
        """The policy's knobs; with ``cm_urls``, ``cmlist`` becomes the CMs' URLs."""
        return PolicyConfig(
            minthreshold=self.minthreshold, maxthreshold=self.maxthreshold,
            percent_available_minimum=self.percent_available_minimum,
            enable_delete=self.enable_delete, nodetype=self.nodetype,
            cmlist=self.cms(cm_urls) if cm_urls is not None else self.cmlist,
            max_add_per_cycle=self.max_add_per_cycle, add_cooldown=self.add_cooldown,
            delete_cooldown=self.delete_cooldown, max_delete_per_cycle=self.max_delete_per_cycle,
            hysteresis=self.hysteresis, idle_timeout=self.idle_timeout)


Err = Callable[[str, str], ConfigError]


def load_manager_config(path: str | os.PathLike[str] | None = None,
                        env: Mapping[str, str] | None = None) -> ManagerConfig:
    """Read ``[manager]`` and ``[endpoint]`` of the config file, with environment overrides."""
    env = os.environ if env is None else env
    cfg_path, parser = read_ini(path)
    where = str(cfg_path)
    manager = _section(parser, MANAGER, where, _manager_key_ok)
    endpoint = _section(parser, ENDPOINT, where, lambda key: key in ENDPOINT_KEYS)
    from_env: dict[str, str] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or not value.strip():
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name.startswith("endpoint_") and name[9:] in ENDPOINT_KEYS:
            endpoint[name[9:]] = value.strip()
            from_env[f"{ENDPOINT}.{name[9:]}"] = key
        elif name in MANAGER_KEYS:
            manager[name] = value.strip()
            from_env[name] = key
        elif name.startswith("interval_") and name[9:] in DEF_ORDER:
            manager[INTERVAL_PREFIX + name[9:]] = value.strip()
            from_env[INTERVAL_PREFIX + name[9:]] = key
    base = cfg_path.resolve().parent

    def err(key: str, message: str) -> ConfigError:
        if key in from_env:  # the value came from the environment, not the file
            message = f"{message} (from ${from_env[key]})"
        return ConfigError(message, key=key, path=where)

    def endpoint_err(key: str, message: str) -> ConfigError:
        return err(f"{ENDPOINT}.{key}", message)   # "[endpoint.port]": the section is named

    config = _manager(manager, base, err)
    given = frozenset(k for k, v in manager.items() if v) | frozenset(
        f"{ENDPOINT}.{k}" for k, v in endpoint.items() if v)
    return replace(config, endpoint=_endpoint(endpoint, base, endpoint_err), path=cfg_path,
                   given=given)


def _manager_key_ok(key: str) -> bool:
    return key in MANAGER_KEYS or key.startswith(INTERVAL_PREFIX)


def _section(parser: configparser.ConfigParser, name: str, where: str,
             known: Callable[[str], bool]) -> dict[str, str]:
    if not parser.has_section(name):
        return {}
    values: dict[str, str] = {}
    for key, value in parser.items(name):
        if not known(key):
            keys = MANAGER_KEYS + ("interval.<method>",) if name == MANAGER else ENDPOINT_KEYS
            raise ConfigError(f"unknown key in [{name}] (known: {', '.join(keys)})",
                              key=key if name == MANAGER else f"{name}.{key}", path=where)
        values[key] = value.strip()
    return values


def _flag(values: Mapping[str, str], key: str, default: bool, err: Err) -> bool:
    raw = values.get(key)
    if not raw:
        return default
    return boolean(raw, lambda _key, message: err(key, message))


def _int(values: Mapping[str, str], key: str, default: int, err: Err, *, minimum: int,
         maximum: int | None = None) -> int:
    value = int(number(values, key, default, err, minimum=minimum, integer=True))
    if maximum is not None and value > maximum:
        raise err(key, f"must be at most {maximum}: {values[key]!r}")
    return value


def _float(values: Mapping[str, str], key: str, default: float, err: Err, *, minimum: float,
           maximum: float | None = None) -> float:
    value = number(values, key, default, err, minimum=minimum)
    if value != value or value in (float("inf"), float("-inf")):
        raise err(key, f"not a finite number: {values[key]!r}")
    if maximum is not None and value > maximum:
        raise err(key, f"must be at most {maximum}: {values[key]!r}")
    return value


def _path(values: Mapping[str, str], key: str, base: Path, err: Err, *,
          must_exist: bool) -> Path | None:
    raw = values.get(key)
    if not raw:
        return None
    p = Path(raw).expanduser()
    p = p if p.is_absolute() else base / p
    if must_exist and not p.is_file():
        raise err(key, f"no such file: {p}")
    return p


def _list(values: Mapping[str, str], key: str) -> tuple[str, ...]:
    return tuple(v for v in re.split(r"[\s,]+", values.get(key, "")) if v)


def _name(values: Mapping[str, str], key: str, default: str, err: Err) -> str:
    raw = values.get(key) or default
    if not _PREFIX_RE.match(raw):
        raise err(key, f"invalid name {raw!r} (a letter, then letters, digits or '-')")
    return raw


def _intervals(values: Mapping[str, str], err: Err) -> dict[str, float]:
    intervals = dict(DEF_INTERVALS)
    for key in values:
        if not key.startswith(INTERVAL_PREFIX):
            continue
        method = key[len(INTERVAL_PREFIX):]
        if method not in DEF_ORDER:
            raise err(key, f"unknown cycle method {method!r} (known: {', '.join(DEF_ORDER)})")
        intervals[method] = _float(values, key, DEF_INTERVAL, err, minimum=0.1,
                                   maximum=MAX_SECONDS)
    return intervals


def _command(values: Mapping[str, str], err: Err) -> str | None:
    command = values.get("startup_command") or None
    problem = (command_problem(command) or startup_problem(command)) if command else None
    if command and not problem:
        breaks = next((c for c in XML_BREAKERS if c in command), None)
        if breaks:
            problem = (f"{breaks!r} would break CloudLab's AddNodes XML (put the command in a "
                       "script of the node's tarball)")
    if problem:  # no node could run it, or CloudLab's CM refuses it
        raise err("startup_command", problem)
    return command


def _tarballs(values: Mapping[str, str], err: Err) -> tuple[tuple[str, str], ...]:
    out = []
    for line in values.get("tarballs", "").splitlines():
        parts = line.replace(",", " ").split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].startswith("/"):
            raise err("tarballs", f"each line must be 'URL /install/path': {line.strip()!r}")
        problem = tarball_problem(parts[0])  # the one rule (elasticslice.rspec.tarball)
        if problem:
            raise err("tarballs", f"each line must be 'URL /install/path': {problem}")
        if parts[1] != "/":  # the manager's new nodes come by AddNodes
            raise err("tarballs", f"install path {parts[1]!r}: CloudLab's AddNodes installs "
                                  "tarballs at / only (root the tarball's files at /)")
        out.append((parts[0], parts[1]))
    return tuple(out)


def _manager(v: Mapping[str, str], base: Path, err: Err) -> ManagerConfig:
    minthreshold = _int(v, "minthreshold", 1, err, minimum=0)
    maxthreshold = _int(v, "maxthreshold", 10, err, minimum=1)
    if minthreshold > maxthreshold:
        raise err("minthreshold", f"{minthreshold} is greater than maxthreshold ({maxthreshold})")
    image_urn = v.get("image_urn") or None
    if image_urn and not _URN_RE.match(image_urn):
        raise err("image_urn", f"not a URN (urn:publicid:IDN+...): {image_urn!r}")
    nodetype = v.get("nodetype") or None
    if nodetype and not re.match(r"^[A-Za-z0-9][\w.-]*$", nodetype):
        raise err("nodetype", f"invalid hardware type {nodetype!r}")
    cmlist = _list(v, "cmlist")
    idle = v.get("idle_timeout", "").lower()
    return ManagerConfig(
        minthreshold=minthreshold, maxthreshold=maxthreshold,
        percent_available_minimum=_float(v, "percent_available_minimum", 0.5, err,
                                         minimum=0.0, maximum=1.0),
        enable_delete=_flag(v, "enable_delete", False, err),
        retry_interval=_float(v, "retry_interval", 30.0, err, minimum=0.1,
               maximum=MAX_SECONDS),
        nodetype=nodetype, cmlist=cmlist,
        num_pcs=_int(v, "num_pcs", 1, err, minimum=0, maximum=MAX_NUM_PCS),
        image_urn=image_urn, startup_command=_command(v, err),
        tarballs=_tarballs(v, err),
        node_prefix=_name(v, "node_prefix", "node", err),
        lan_prefix=_name(v, "lan_prefix", "lan", err),
        num_lans=_int(v, "num_lans", 0, err, minimum=0),
        multiplex_lans=_flag(v, "multiplex_lans", False, err),
        state_dir=(_path(v, "state_dir", base, err, must_exist=False)
                   or DEFAULT_STATE_DIR.expanduser()),
        intervals=_intervals(v, err),
        renew_hours=_float(v, "renew_hours", 6.0, err, minimum=0.1,
                           maximum=MAX_SECONDS / 3600),
        renew_margin=_float(v, "renew_margin", 3600.0, err, minimum=0.0,
               maximum=MAX_SECONDS),
        idle_timeout=(None if idle in ("", "none", "off")
                      else _float(v, "idle_timeout", 0.0, err, minimum=0.0)),
        add_cooldown=_float(v, "add_cooldown", 60.0, err, minimum=0.0,
               maximum=MAX_SECONDS),
        delete_cooldown=_float(v, "delete_cooldown", 300.0, err, minimum=0.0,
               maximum=MAX_SECONDS),
        max_add_per_cycle=_int(v, "max_add_per_cycle", 10, err, minimum=1),
        max_delete_per_cycle=_int(v, "max_delete_per_cycle", 1, err, minimum=0),
        hysteresis=_float(v, "hysteresis", 0.1, err, minimum=0.0, maximum=1.0),
        delete_in_group=_flag(v, "delete_in_group", True, err),
        metrics_port=(_int(v, "metrics_port", 0, err, minimum=0, maximum=65535)
                      if v.get("metrics_port", "").strip() else None),
        email=_email(v, base, err),
    )


def _email(v: Mapping[str, str], base: Path, err: Err) -> EmailConfig:
    enabled = _flag(v, "email", False, err)
    to = _list(v, "email_to")
    for addr in to:
        if not _EMAIL_RE.match(addr):
            raise err("email_to", f"not an email address: {addr!r}")
    if enabled and not to:
        raise err("email_to", "missing (needed when email = true)")
    sender = v.get("email_from") or "elasticslice@localhost"
    if not _EMAIL_RE.match(sender):
        raise err("email_from", f"not an email address: {sender!r}")
    host = v.get("smtp_host") or "127.0.0.1"
    if not re.match(r"^[A-Za-z0-9.:-]+$", host):
        raise err("smtp_host", f"not a host name or address: {host!r}")
    return EmailConfig(
        enabled=enabled, to=to, sender=sender, smtp_host=host,
        smtp_port=_int(v, "smtp_port", 25, err, minimum=1, maximum=65535),
        starttls=_flag(v, "smtp_starttls", False, err),
        username=v.get("smtp_username") or None,
        password_file=_path(v, "smtp_password_file", base, err, must_exist=True))


def _endpoint(v: Mapping[str, str], base: Path, err: Err) -> EndpointConfig:
    address = v.get("address") or "127.0.0.1"
    if address != "localhost":
        try:
            ip_literal(address)
        except ValueError as e:
            raise err("address", str(e)) from None
    url = v.get("url") or None
    if url:
        https_url(url, err, "url")
    cm_urn = v.get("cm_urn") or None
    if cm_urn and not _URN_RE.match(cm_urn):
        raise err("cm_urn", f"not a URN (urn:publicid:IDN+...): {cm_urn!r}")
    return EndpointConfig(
        address=address, port=_int(v, "port", 0, err, minimum=0, maximum=65535), url=url,
        cm_urn=cm_urn, certificate=_path(v, "certificate", base, err, must_exist=True),
        keyfile=_path(v, "keyfile", base, err, must_exist=True),
        passphrase_file=_path(v, "passphrase_file", base, err, must_exist=True),
        enabled=_flag(v, "enabled", True, err), policy=_reclaim_policy(v, err))


def _reclaim_policy(v: Mapping[str, str], err: Err) -> str:
    policy = (v.get("policy") or "CLIENT").strip().upper()
    if policy not in RECLAIM_POLICIES:
        raise err("policy", f"expected CLIENT or LIFO, got {v.get('policy')!r}")
    return policy
