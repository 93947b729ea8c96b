"""Dask scheduler addresses as users give them (``dask://``, ``tcp://``, ``tls://``),
checked before Dask sees them."""
from __future__ import annotations

import ipaddress

from troy.errors import BadParameter

SCHEMES = ("tcp", "tls")


def scheduler_url(address: str) -> str:
    """``address`` (``dask://host:port``, ``tcp://host:port`` or ``tls://host:port``) as Dask
    wants it, checked here: Dask's own refusal of a malformed address comes after it has
    half-made a client, whose clean-up then hangs for 30 s. ``BadParameter`` names what is
    wrong."""
    from distributed.comm.addressing import parse_address, parse_host_port
    given = address
    if not isinstance(address, str) or not address.strip():
        raise BadParameter(f"Dask scheduler address {address!r}: expected dask://host:port")
    if address.startswith("dask://"):
        address = "tcp://" + address[len("dask://"):]
    try:
        scheme, location = parse_address(address, strict=True)
        if scheme not in SCHEMES:
            raise ValueError(f"unsupported scheme {scheme!r} (want dask://, tcp:// or tls://)")
        host, port = parse_host_port(location)
        if ":" in host:
            ipaddress.IPv6Address(host)
    except ValueError as err:
        reason = "the port is not a number" if "invalid literal" in str(err) else err
        raise BadParameter(f"Dask scheduler address {given!r}: {reason}") from None
    if not host or not isinstance(port, int) or not 0 < port < 65536:
        raise BadParameter(f"Dask scheduler address {given!r}: expected host:port with a "
                           f"port from 1 to 65535")
    return address
