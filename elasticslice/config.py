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
(:func:`load_pilot_settings`: ``disk_image``, ``node_python``) says what pilot nodes boot.
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
import os
import re
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elasticslice.errors import ConfigError
from elasticslice.rpc.pki import os_error_reason

log = logging.getLogger(__name__)

SECTION = "protogeni"
DEFAULT_PATH = Path("~/.protogeni/elasticslice.conf")
DEFAULT_CACHE_DIR = Path("~/.protogeni/credentials")
PASSPHRASE_ENV = "PROTOGENI_PASSPHRASE"
ENV_PREFIX = "ELASTICSLICE_"

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
                env: Mapping[str, str] | None = None) -> ClientConfig:
    """Read, override from the environment, and check a config file."""
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
    return _build(values, cfg_path, from_env)


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
           from_env: Mapping[str, str] | None = None) -> ClientConfig:
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
        if must_exist:  # open it: missing, a directory, or unreadable are told apart
            try:
                problem = small_file_problem(p)
            except OSError as e:
                raise err(key, os_error_reason(p, e)) from e
            if problem:
                raise err(key, problem)
        return p

    verify = _bool(values.get("verify", "true"), err)
    cm_urls = tuple(u for u in re.split(r"[\s,]+", values["cm_urls"]) if u)
    for url in cm_urls:
        _check_url(url, err, "cm_urls")
    dynslice_urls = tuple(u for u in re.split(r"[\s,]+", values.get("dynslice_urls", "")) if u)
    for url in dynslice_urls:
        _check_url(url, err, "dynslice_urls")
    if dynslice_urls and len(dynslice_urls) != len(cm_urls):
        raise err("dynslice_urls", "needs one URL per cm_urls entry, in the same order")
    sa_url = values.get("sa_url") or None
    if sa_url:
        _check_url(sa_url, err, "sa_url")
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
        timeout=_number(values, "timeout", 60.0, err, minimum=0.1),
        retries=int(_number(values, "retries", 5, err, minimum=0, integer=True)),
        retry_delay=_number(values, "retry_delay", 5.0, err, minimum=0.0),
        retry_max_delay=_number(values, "retry_max_delay", 60.0, err, minimum=0.0),
        credential_cache_dir=cache,
        dynslice_urls=dynslice_urls,
        path=cfg_path,
    )


def _bool(raw: str, err) -> bool:  # noqa: ANN001 - local error factory
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise err("verify", f"not a boolean: {raw!r}")


def _number(values: dict[str, str], key: str, default: float, err, *,  # noqa: ANN001
            minimum: float, integer: bool = False) -> float:
    raw = values.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError as e:
        kind = "an integer" if integer else "a number"
        raise err(key, f"not {kind}: {raw!r}") from e
    if value < minimum:
        raise err(key, f"must be at least {minimum}: {raw!r}")
    return value


def _check_url(url: str, err, key: str) -> None:  # noqa: ANN001
    if not re.match(r"^https://[^/\s]+(/\S*)?$", url):
        raise err(key, f"not an https URL: {url!r}")


PILOTS_SECTION = "pilots"
PILOT_KEYS = ("disk_image", "node_python")


@dataclass(frozen=True)
class PilotSettings:
    """``[pilots]``: the image pilot nodes boot (a URN; None: the CM's default) and the
    command that runs the node agent there (``node_python``; None: ``python3``). The
    emulator's own config names its pilot image."""

    disk_image: str | None = None
    node_python: str | None = None


def load_pilot_settings(path: str | os.PathLike[str] | None) -> PilotSettings:
    """The ``[pilots]`` section of the config at ``path`` (empty settings without one)."""
    if path is None:
        return PilotSettings()
    cfg_path, parser = read_ini(path)
    if not parser.has_section(PILOTS_SECTION):
        return PilotSettings()
    values = dict(parser.items(PILOTS_SECTION))
    for key in values:
        if key not in PILOT_KEYS:
            raise ConfigError(f"unknown key in [{PILOTS_SECTION}] (known: "
                              f"{', '.join(PILOT_KEYS)})", key=key, path=str(cfg_path))
    image = values.get("disk_image") or None
    if image is not None:
        from elasticslice.rspec.rules import image_problem
        problem = image_problem(image)
        if problem:
            raise ConfigError(problem, key="disk_image", path=str(cfg_path))
    python = values.get("node_python") or None
    if python is not None and any(c in python for c in "\n\r\0"):
        raise ConfigError("one line, a command", key="node_python", path=str(cfg_path))
    return PilotSettings(image, python)


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
