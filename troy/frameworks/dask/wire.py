"""Frames of Troy's unit channel (:mod:`troy.frameworks.dask.link` on the control,
:mod:`troy.frameworks.dask.runner` on a node): a 4-byte big-endian length, then one msgpack
list. Nothing on it is ever a pickle the control decodes: msgpack's extension types are
refused, and every frame read from a node is checked to be plain data (None, booleans,
numbers, strings, bytes, lists and maps of them) before anything looks at it.

Frames, control -> node: ``["ok"]`` (the hello was accepted), ``["units", [[key, unit id,
description, sandbox], ...]]`` (a description is ``["fields", msgpack of its fields]``, or
``["pickle", bytes]`` for a unit that runs a Python function: the node decodes the control's
pickles as Dask's workers do, never the other way round), ``["cancel", [unit id, ...], n]``
(the connection's n-th cancel), ``["bye"]``.
Node -> control: ``["hello", token]`` (first, within :data:`HELLO_TIMEOUT`), then
``["events", [["run", unit id, start, key] | ["end", unit id, result, key] |
["ack", "", n, ""], ...]]`` (``ack``: cancel n and those before it were carried out).
"""
from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack

HEADER = struct.Struct(">I")
#: The largest frame a node may send: a batch of ``end`` events, each with a value of at most
#: 4 MiB (``agent.MAX_VALUE``) and two 64 KiB tails a member (a larger batch is split).
MAX_FRAME = 64 * 1024 * 1024
HELLO_MAX = 1024         # the hello frame, before the peer is known: small
HELLO_TIMEOUT = 10.0     # seconds a connection may take to say hello


class BadFrame(ValueError):
    """A frame that is not what the channel carries (the connection is closed)."""


def pack(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def _no_ext(code: int, data: bytes) -> Any:
    raise BadFrame(f"an extension type ({code}): not data")


_ATOMS = frozenset({type(None), bool, int, float, str, bytes})


def plain(v: Any, depth: int = 0) -> bool:
    """Whether ``v`` is plain data as msgpack decodes it (no timestamps, no extensions):
    exact types, as msgpack makes them (no subclass of them is data here)."""
    t = type(v)
    if t in _ATOMS:
        return True
    if depth > 40:
        return False
    if t is list:
        for x in v:
            if type(x) not in _ATOMS and not plain(x, depth + 1):
                return False
        return True
    if t is dict:
        for k, x in v.items():
            if type(k) not in _ATOMS or (type(x) not in _ATOMS and not plain(x, depth + 1)):
                return False
        return True
    return False


def unpack(body: bytes) -> list:
    """A frame's body as a list of plain data; :class:`BadFrame` otherwise."""
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True, ext_hook=_no_ext,
                              use_list=True)
    except BadFrame:
        raise
    except Exception as err:  # noqa: BLE001 - msgpack's many errors: one line
        raise BadFrame(f"not msgpack ({type(err).__name__})") from None
    if not isinstance(obj, list) or not obj or not isinstance(obj[0], str) or not plain(obj):
        raise BadFrame("not a list of plain data naming its kind")
    return obj


def length(header: bytes, limit: int) -> int:
    (n,) = HEADER.unpack(header)
    if n > limit:
        raise BadFrame(f"a frame of {n} bytes (at most {limit})")
    return n


def read_frame(sock: socket.socket, limit: int = MAX_FRAME) -> list | None:
    """One frame from a blocking socket (None: the peer closed it between frames)."""
    header = _read(sock, HEADER.size, eof_ok=True)
    if header is None:
        return None
    return unpack(_read(sock, length(header, limit)) or b"")


def _read(sock: socket.socket, n: int, eof_ok: bool = False) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            if eof_ok and got == 0:
                return None
            raise BadFrame("the connection closed inside a frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
