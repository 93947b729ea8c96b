"""The client configuration: an INI file with a ``[protogeni]`` section.

::

    [protogeni]
    certificate     = ~/.ssl/cloudlab.pem      ; certificate + encrypted key, one PEM
    passphrase_file = ~/.ssl/password          ; optional (else $PROTOGENI_PASSPHRASE or a prompt)
    sa_url          = https://www.emulab.net:12369/protogeni/xmlrpc/sa   ; default: from the cert
    cm_urls         = https://www.utah.cloudlab.us:12369/protogeni/xmlrpc/cm
    ca_bundle       = ~/.protogeni/cloudlab-ca.pem
    slice_name      = elastic1
    project         = myproject                ; optional: project slices <dom>:<pid>

Optional: ``verify`` (default true), ``timeout`` (seconds, 60), ``retries`` (5),
``retry_delay`` (first backoff, seconds, 5), ``retry_max_delay`` (60), ``credential_cache_dir``,
``dynslice_urls`` (the dynamic-slice servers, one per CM; default: ``.../xmlrpc/dynslice`` on
each CM's host). Other sections are left to the tools that own them; ``[pilots]``
(:func:`load_pilot_settings`: ``disk_image``, ``node_python``, ``listen``, ``public_url``,
``hardware_type``, ``node_cores``, ``margin``, ``idle_timeout``, ``agent_timeout``) says what
pilot nodes boot and where they find the control node (``elasticslice run`` reads it).
Relative paths are relative to the config file. Environment overrides:
``ELASTICSLICE_<KEY>`` for any key (e.g. ``ELASTICSLICE_SLICE_NAME``), and the classic
``PROTOGENI_CERTIFICATE`` (the command line warns about a misspelled ``ELASTICSLICE_*``:
:mod:`elasticslice.envcheck`). Every problem is a :class:`ConfigError` naming the key and the
file.
"""
from __future__ import annotations

import configparser
import errno
import getpass
import logging
import math
import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from elasticslice import ENV_PREFIX
from elasticslice.errors import ConfigError, os_error_reason
from elasticslice.validate import (MAX_SECONDS, bounded_int, boolean, check_address, https_url,
                                  is_command, number, port_number)

log = logging.getLogger(__name__)

SECTION = "protogeni"
DEFAULT_PATH = Path("~/.protogeni/elasticslice.conf")
DEFAULT_CACHE_DIR = Path("~/.protogeni/credentials")
PASSPHRASE_ENV = "PROTOGENI_PASSPHRASE"

REQUIRED = ("certificate", "cm_urls")
OPTIONAL = ("passphrase_file", "sa_url", "ca_bundle", "slice_name", "project", "verify",
            "timeout", "retries", "retry_delay", "retry_max_delay", "credential_cache_dir",
            "dynslice_urls")
KNOWN = REQUIRED + OPTIONAL
MISSING_CONFIG = ("config file not found: give --config FILE or set ELASTICSLICE_CONFIG=FILE; "
                  "`elasticslice emulator init --dir DIR` writes DIR/elasticslice.conf for "
                  "the emulator, and `python -m pydoc elasticslice.config` lists the keys "
                  "of one for CloudLab")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,18}$")


@dataclass(frozen=True)
class ClientConfig:
    """A checked client configuration. ``path`` is where it came from (for error messages)."""

    certificate: Path
    cm_urls: tuple[str, ...]
    sa_url: str | None = None
    ca_bundle: Path | None = None
    passphrase_file: Path | None = None
    slice_name: str | None = None
    project: str | None = None
    verify: bool = True
    timeout: float = 60.0
    retries: int = 5
    retry_delay: float = 5.0
    retry_max_delay: float = 60.0
    credential_cache_dir: Path = field(default_factory=lambda: DEFAULT_CACHE_DIR.expanduser())
    dynslice_urls: tuple[str, ...] = ()
    path: Path | None = None

    def require_slice_name(self) -> str:
        if not self.slice_name:
            raise ConfigError("missing: this command needs a slice name", key="slice_name",
                              path=str(self.path) if self.path else None)
        return self.slice_name

    def error(self, message: str, key: str) -> ConfigError:
        return ConfigError(message, key=key, path=str(self.path) if self.path else None)


def ini_error(err: configparser.Error) -> str:
    """One line for what configparser found wrong (its own messages span several lines and
    name the file as a repr)."""
    if isinstance(err, configparser.MissingSectionHeaderError):
        return f"not an INI file: line {err.lineno} comes before any [section] header"
    if isinstance(err, configparser.DuplicateOptionError):
        return f"line {err.lineno}: key {err.option!r} given twice in [{err.section}]"
    if isinstance(err, configparser.DuplicateSectionError):
        return f"line {err.lineno}: section [{err.section}] given twice"
    if isinstance(err, configparser.ParsingError):
        lines = ", ".join(str(lineno) for lineno, _ in err.errors[:5])
        return f"not 'key = value' at line(s) {lines}"
    return str(err).splitlines()[0]


def default_config_path() -> Path:
    return DEFAULT_PATH.expanduser()


def load_config(path: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None, *,
                open_files: bool = True) -> ClientConfig:
    """Read, override from the environment, and check a config file. ``open_files=False``:
    the certificate, passphrase and CA files are named, not opened (a process that must not
    hold the CloudLab credentials reads its settings so; the manager daemon checks them)."""
    env = os.environ if env is None else env
    cfg_path, parser = read_ini(path)
    where = str(cfg_path)
    if not parser.has_section(SECTION):
        raise ConfigError(f"no [{SECTION}] section", path=where)
    # Other sections belong to other tools sharing the file (the emulator, the manager).
    values: dict[str, str] = {}
    for key, value in parser.items(SECTION):
        if key not in KNOWN:
            raise ConfigError(f"unknown key (known: {', '.join(KNOWN)})", key=key, path=where)
        values[key] = value.strip()
    from_env: dict[str, str] = {}
    for key in KNOWN:
        override = env.get(ENV_PREFIX + key.upper())
        if override:
            values[key] = override.strip()
            from_env[key] = ENV_PREFIX + key.upper()
    if env.get("PROTOGENI_CERTIFICATE"):
        values["certificate"] = env["PROTOGENI_CERTIFICATE"].strip()
        from_env["certificate"] = "PROTOGENI_CERTIFICATE"
    return _build(values, cfg_path, from_env, open_files=open_files)


MAX_FILE_BYTES = 16 << 20  # a config, certificate, passphrase or CA bundle file


def small_file_problem(path: Path, limit: int = MAX_FILE_BYTES) -> str | None:
    """Why ``path`` is no file to read whole (None: it is one): not a regular file (a FIFO
    would block the read, /dev/zero never end it) or larger than ``limit``. Opens it without
    blocking; raises ``OSError`` when it cannot be opened at all."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        return f"{path} is not a regular file (a device, FIFO or socket)"
    if info.st_size > limit:
        return f"{path} is {info.st_size} bytes, larger than the limit of {limit}"
    return None


def read_ini(path: str | os.PathLike[str] | None) -> tuple[Path, configparser.ConfigParser]:
    """The config file (``path``, else the default) parsed; every problem reading it is a
    ``ConfigError`` of one line naming the file. Shared by the tools that read it."""
    cfg_path = Path(path).expanduser() if path else default_config_path()
    where = str(cfg_path)
    try:  # read here: configparser.read() skips a file it cannot open without a word
        problem = small_file_problem(cfg_path)
        if problem:
            raise ConfigError(problem, path=where)
        text = cfg_path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError) as err:
        raise ConfigError(MISSING_CONFIG, path=where) from err
    except IsADirectoryError as err:
        raise ConfigError("is a directory, not a config file", path=where) from err
    except OSError as err:
        reason = "permission denied" if isinstance(err, PermissionError) else err.strerror
        raise ConfigError(f"cannot read the config file: {reason}", path=where) from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"unreadable config: not UTF-8 text (byte {err.start})",
                          path=where) from err
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
    try:
        parser.read_string(text, source=where)
    except configparser.Error as err:
        raise ConfigError(ini_error(err), path=where) from err
    return cfg_path, parser


def _build(values: dict[str, str], cfg_path: Path,
           from_env: Mapping[str, str] | None = None, *,
           open_files: bool = True) -> ClientConfig:
    where = str(cfg_path)
    base = cfg_path.resolve().parent
    from_env = from_env or {}

    def err(key: str, message: str) -> ConfigError:
        if key in from_env:  # the value came from the environment, not the file
            message = f"{message} (from ${from_env[key]})"
        return ConfigError(message, key=key, path=where)

    for key in REQUIRED:
        if not values.get(key):
            raise err(key, "missing required key")

    def path_of(key: str, must_exist: bool = True) -> Path | None:
        raw = values.get(key)
        if not raw:
            return None
        p = Path(raw).expanduser()
        p = p if p.is_absolute() else base / p
        if must_exist and open_files:  # open it: missing, a directory, unreadable
            try:
                problem = small_file_problem(p)
            except OSError as e:
                raise err(key, os_error_reason(p, e)) from e
            if problem:
                raise err(key, problem)
        return p

    verify = boolean(values.get("verify", "true"), err)
    cm_urls = tuple(u for u in re.split(r"[\s,]+", values["cm_urls"]) if u)
    for url in cm_urls:
        https_url(url, err, "cm_urls")
    dynslice_urls = tuple(u for u in re.split(r"[\s,]+", values.get("dynslice_urls", "")) if u)
    for url in dynslice_urls:
        https_url(url, err, "dynslice_urls")
    if dynslice_urls and len(dynslice_urls) != len(cm_urls):
        raise err("dynslice_urls", "needs one URL per cm_urls entry, in the same order")
    sa_url = values.get("sa_url") or None
    if sa_url:
        https_url(sa_url, err, "sa_url")
    ca_bundle = path_of("ca_bundle")
    if verify and ca_bundle is None:
        raise err("ca_bundle", "missing (needed to verify the servers; set verify = false "
                               "only to turn verification off explicitly)")
    slice_name = values.get("slice_name") or None
    if slice_name and not _NAME_RE.match(slice_name):
        raise err("slice_name", f"invalid slice name {slice_name!r} (letters, digits, '-', "
                                "starting with a letter, at most 19 characters)")
    project = values.get("project") or None
    if project and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_-]*$", project):
        raise err("project", f"invalid project name {project!r}")
    cache = path_of("credential_cache_dir", must_exist=False) or DEFAULT_CACHE_DIR.expanduser()
    return ClientConfig(
        certificate=path_of("certificate"),  # type: ignore[arg-type]
        cm_urls=cm_urls,
        sa_url=sa_url,
        ca_bundle=ca_bundle,
        passphrase_file=path_of("passphrase_file"),
        slice_name=slice_name,
        project=project,
        verify=verify,
        timeout=number(values, "timeout", 60.0, err, minimum=0.1),
        retries=int(number(values, "retries", 5, err, minimum=0, integer=True)),
        retry_delay=number(values, "retry_delay", 5.0, err, minimum=0.0),
        retry_max_delay=number(values, "retry_max_delay", 60.0, err, minimum=0.0),
        credential_cache_dir=cache,
        dynslice_urls=dynslice_urls,
        path=cfg_path,
    )


PILOTS_SECTION = "pilots"
PILOT_KEYS = ("disk_image", "node_python", "listen", "public_url", "hardware_type",
              "node_cores", "margin", "idle_timeout", "agent_timeout", "metrics_port",
              "scheduler_port", "enrol_port", "publish_port")
#: the ports nodes (and CloudLab's ops server: publish_port) reach on the control node
FIXED_PORT_KEYS = ("scheduler_port", "enrol_port", "publish_port")
#: what ``idle_timeout`` takes for "never give an idle pilot's node back"
NEVER = ("none", "off", "never")
_HWTYPE_RE = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}$")
_PUBLIC_URL_RE = re.compile(r"^https?://[\w.\-@:~\[\]]+(/[\w.\-/@:~]*)?$")


@dataclass(frozen=True)
class PilotSettings:
    """``[pilots]``: what pilot nodes boot and run, and where the control node is found.

    ``disk_image`` (a URN; None: the CM's default) and ``node_python`` (the command that
    runs the node agent there; None: ``python3``); ``listen`` (the address the scheduler,
    the callback endpoint and the tarball publisher listen on and nodes reach; None: the
    address routed to the CM, :func:`default_listen`); ``public_url`` (the base URL
    CloudLab fetches the nodes' tarballs from; None: the publisher's own); ``hardware_type``;
    ``node_cores`` (cores a pilot offers; None: what the node has); ``margin`` (seconds kept
    before a revocation's deadline); ``idle_timeout`` (seconds an idle pilot's node is kept;
    ``math.inf``: never); ``agent_timeout`` (seconds a ready node's agent has to join);
    ``metrics_port`` (the manager's Prometheus metrics on 127.0.0.1; 0: any free port);
    ``scheduler_port``, ``enrol_port``, ``publish_port`` (fixed ports for the Dask scheduler,
    the enrolment service and the tarball publisher, e.g. for a firewall; None: the ones the
    state directory used last, else any free one). A key that is not set is None. The
    emulator's own config names its pilot image."""

    disk_image: str | None = None
    node_python: str | None = None
    listen: str | None = None
    public_url: str | None = None
    hardware_type: str | None = None
    node_cores: int | None = None
    margin: float | None = None
    idle_timeout: float | None = None
    agent_timeout: float | None = None
    metrics_port: int | None = None
    scheduler_port: int | None = None
    enrol_port: int | None = None
    publish_port: int | None = None


def pilot_value(key: str, raw: str) -> object:
    """The value of ``[pilots] key`` (and of the ``run`` option of the same name) given as
    the text ``raw``; ``ValueError`` with one line saying what is wrong."""
    raw = raw.strip()
    if key == "disk_image":
        from elasticslice.rspec.rules import image_problem
        problem = image_problem(raw)
        if problem:
            raise ValueError(problem)
        return raw
    if key == "node_python":
        if not is_command(raw):
            raise ValueError("one line, a command")
        return raw
    if key == "listen":
        return check_address(raw)
    if key == "public_url":
        if "?" in raw or "#" in raw or not _PUBLIC_URL_RE.match(raw):
            raise ValueError(f"not an http(s) URL without query or fragment (the base URL "
                             f"CloudLab fetches the tarballs from): {raw!r}")
        return raw.rstrip("/")
    if key == "hardware_type":
        if not _HWTYPE_RE.match(raw):
            raise ValueError(f"invalid hardware type {raw!r} (e.g. m510, xl170, d430)")
        return raw
    if key == "node_cores":
        return bounded_int(raw, 1, 4096, "an integer")
    if key == "metrics_port" or key in FIXED_PORT_KEYS:
        return port_number(raw)
    if key == "idle_timeout" and raw.lower() in NEVER:
        return math.inf
    if key in ("margin", "idle_timeout", "agent_timeout"):
        try:
            seconds = float(raw)
        except ValueError:
            raise ValueError(f"not a number of seconds: {raw!r}") from None
        if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_SECONDS:
            raise ValueError(f"must be 0 to {MAX_SECONDS} seconds: {raw!r}")
        if key == "agent_timeout" and seconds < 1:
            raise ValueError(f"must be at least 1 second: {raw!r}")
        return seconds
    raise ValueError(f"unknown key (known: {', '.join(PILOT_KEYS)})")


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _addresses_of(host: str, port: int) -> list[str]:
    import socket
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError):
        return []


def is_this_machine(address: str) -> bool:
    """``address`` is loopback or one of this machine's own addresses (it can be bound)."""
    import ipaddress
    import socket
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((str(ip), 0))
        except OSError:
            return False
    return True


def cm_is_local(cm_url: str) -> bool:
    """The CM at ``cm_url`` runs on this machine (CloudLab in a box): its nodes are here too,
    so loopback reaches this machine from them. Every address its host name has must be
    this machine's; a name that does not resolve is not local."""
    host, port = _host_port(cm_url)
    addresses = _addresses_of(host, port)
    return bool(addresses) and all(is_this_machine(a) for a in addresses)


def route_to(cm_url: str) -> str | None:
    """The address of this machine's interface that routes to the CM's host (None: its name
    does not resolve or no route leads there). Nothing is sent: a UDP socket is connected,
    which only picks the route."""
    import socket
    host, port = _host_port(cm_url)
    for address in _addresses_of(host, port):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.connect((address, port))
                return str(s.getsockname()[0])
            except OSError:
                continue
    return None


def default_listen(cm_urls: tuple[str, ...] | list[str]) -> str:
    """``listen`` when neither ``--listen`` nor ``[pilots] listen`` says: loopback when every
    CM runs on this machine (the box), else the address of the interface that routes to the
    CMs' hosts: the address their nodes can reach when this machine is on their network (a
    CloudLab control node, whose control network is routed to the Internet). The nodes of
    every CM join the one scheduler, so when the CMs are reached from different addresses
    the first one that is public (globally routed: every site reaches it) is taken, else the
    first CM's. Loopback when no route is found (``elasticslice doctor`` says so)."""
    import ipaddress
    remote = [u for u in cm_urls if not cm_is_local(u)]
    routes = [r for r in (route_to(u) for u in remote) if r]
    if not routes:
        return "127.0.0.1"
    public = [r for r in routes if ipaddress.ip_address(r.split("%")[0]).is_global]
    return (public or routes)[0]


def cm_site(cm_url: str) -> str:
    """The site (cluster) of the CM at ``cm_url``, the name a pilot is labelled with: the
    box's cluster name (``.../cluster/NAME/...``), else the first label of the CM's host
    name after ``www``/``boss`` (``www.utah.cloudlab.us``: ``utah``), else its address."""
    import ipaddress
    from urllib.parse import urlsplit
    parts = urlsplit(cm_url)
    found = re.search(r"/cluster/([^/]+)/", parts.path)
    if found:
        return found.group(1)
    host = (parts.hostname or cm_url).lower()
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        labels = [x for x in host.split(".") if x]
    while len(labels) > 1 and labels[0] in ("www", "boss"):
        labels = labels[1:]
    return labels[0] if labels else host


def site_names(cm_urls: Sequence[str]) -> dict[str, str]:
    """Each CM URL's site (:func:`cm_site`), unique: two CMs of one site name (two boxes on
    this machine) are told apart by their host and port."""
    from collections import Counter
    from urllib.parse import urlsplit
    names = {u: cm_site(u) for u in cm_urls}
    counts = Counter(names.values())
    return {u: n if counts[n] == 1 else f"{n}@{urlsplit(u).netloc}" for u, n in names.items()}


def load_pilot_settings(path: str | os.PathLike[str] | None) -> PilotSettings:
    """The ``[pilots]`` section of the config at ``path`` (empty settings without one)."""
    if path is None:
        return PilotSettings()
    cfg_path, parser = read_ini(path)
    if not parser.has_section(PILOTS_SECTION):
        return PilotSettings()
    values = dict(parser.items(PILOTS_SECTION))
    out: dict[str, object] = {}
    for key, raw in values.items():
        if key not in PILOT_KEYS:
            raise ConfigError(f"unknown key in [{PILOTS_SECTION}] (known: "
                              f"{', '.join(PILOT_KEYS)})", key=key, path=str(cfg_path))
        if not raw.strip():
            continue
        try:
            out[key] = pilot_value(key, raw)
        except ValueError as err:
            raise ConfigError(str(err), key=f"{PILOTS_SECTION}.{key}",
                              path=str(cfg_path)) from None
    return PilotSettings(**out)  # type: ignore[arg-type]


def key_is_encrypted(config: ClientConfig) -> bool:
    try:
        data = config.certificate.read_bytes()
    except OSError as e:
        raise config.error(os_error_reason(config.certificate, e), "certificate") from e
    return b"ENCRYPTED" in data


def load_passphrase(config: ClientConfig, env: Mapping[str, str] | None = None,
                    interactive: bool | None = None) -> str | None:
    """The key passphrase: passphrase_file, $PROTOGENI_PASSPHRASE, or a prompt on a TTY.

    None when the key in the certificate file is not encrypted.
    """
    env = os.environ if env is None else env
    if not key_is_encrypted(config):
        return None
    if config.passphrase_file is not None:
        try:
            text = config.passphrase_file.read_text(encoding="utf-8")
        except OSError as e:
            raise config.error(os_error_reason(config.passphrase_file, e),
                               "passphrase_file") from e
        except UnicodeDecodeError as e:
            raise config.error(f"not UTF-8 text (byte {e.start})", "passphrase_file") from e
        phrase = text.rstrip("\r\n")
        if not phrase:
            raise config.error("passphrase file is empty", "passphrase_file")
        return phrase
    if env.get(PASSPHRASE_ENV):
        return env[PASSPHRASE_ENV]
    if interactive is None:
        interactive = sys.stdin.isatty()
    if interactive:
        return getpass.getpass(f"Passphrase for {config.certificate}: ")
    raise config.error(f"the key is encrypted and no passphrase was given (set passphrase_file, "
                       f"or ${PASSPHRASE_ENV}, or run on a terminal)", "passphrase_file")
