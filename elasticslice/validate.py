"""The validators every entry point shares: the config files (``elasticslice.config``,
``elasticslice.managers.config``), ``run``'s options, ``CloudLabCluster`` and
``CloudLabProvider``. Each rule lives here once; the wording around it stays each
interface's own (a config error names its key and file, the Dask cluster and the Parsl
provider name themselves), so no message a user sees changed when the rules moved here.

Two kinds: predicates over Python values (``is_count``, ``is_seconds``, ``is_command``),
which the Python interfaces wrap in their own errors; and parsers of config text, which
raise ``ValueError`` with one line (``bounded_int``, ``port_number``, ``ip_literal``,
``check_address``) or an error from the caller's factory ``err(key, message)``
(``boolean``, ``number``, ``https_url``).
"""
from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

#: ``err(key, message)``: the caller's error (a ``ConfigError`` naming the key and the file)
Err = Callable[[str, str], Exception]

#: the longest span of seconds any key takes: longer than any slice lives; beyond it
#: timedelta and the scheduler overflow (1e300 did)
MAX_SECONDS = 366 * 86400

_HTTPS_URL_RE = re.compile(r"^https://[^/\s]+(/\S*)?$")


# -- Python values (the Dask cluster's and the Parsl provider's arguments) ------------------
def is_count(value: Any, least: int) -> bool:
    """A whole number (an ``int``, not a ``bool``) of at least ``least``."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= least


def is_seconds(value: Any, *, positive: bool = False) -> bool:
    """A finite number of seconds (not a ``bool``), ``>= 0`` (``> 0`` if ``positive``)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0 and (value > 0 or not positive))


def is_command(value: Any) -> bool:
    """A command on one line (a node's Python: ``python3``), nothing that ends it early."""
    return isinstance(value, str) and bool(value) and not any(c in value for c in "\n\r\0")


# -- config text -----------------------------------------------------------------------------
def bounded_int(raw: str, low: int, high: int, what: str) -> int:
    """``raw`` as an integer from ``low`` to ``high``; ``ValueError`` (one line) if not."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"not {what}: {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"must be {low} to {high}: {raw!r}")
    return value


def port_number(raw: str) -> int:
    """A TCP port given as text (0: any free one)."""
    return bounded_int(raw, 0, 65535, "a port number")


def ip_literal(raw: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``raw`` as an IP address (no name lookup); ``ValueError`` (one line) if not."""
    try:
        return ipaddress.ip_address(raw)
    except ValueError:
        raise ValueError(f"not an IP address: {raw!r}") from None


def check_address(raw: str) -> str:
    """An IP address to listen on (``localhost`` is 127.0.0.1); ``ValueError`` otherwise."""
    if raw == "localhost":
        return "127.0.0.1"
    address = ip_literal(raw)
    if address.is_unspecified or address.is_multicast:
        raise ValueError(f"{raw} is no address nodes can reach: give this machine's address "
                         f"on the network the nodes are on")
    return str(address)


def boolean(raw: str, err: Err) -> bool:
    """1/true/yes/on or 0/false/no/off (any case)."""
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise err("verify", f"not a boolean: {raw!r}")


def number(values: Mapping[str, str], key: str, default: float, err: Err, *,
           minimum: float, integer: bool = False) -> float:
    """``values[key]`` as a number of at least ``minimum`` (``default`` if unset or empty)."""
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


def https_url(url: str, err: Err, key: str) -> None:
    """An https URL with a host (what the SA, the CMs and the endpoint's ``url`` are)."""
    if not _HTTPS_URL_RE.match(url):
        raise err(key, f"not an https URL: {url!r}")
