"""Slices users can trust: a manager works only on a slice its state directory created
(or adopted on purpose), and a CM that cannot be reached is said so, at once.

A state directory records the slice it registered (:func:`own_slice`). Before the
first cycle, :class:`SliceClaim` asks the SA whether the configured slice exists. A slice
this directory did not create is:

* reused (recorded as ``reused``) when it holds nothing: no configured CM has a sliver of
  it and the SA names none (:func:`holdings_of`). A run leaves its slice so at its end (it
  gives its nodes back with DeleteSlice at each CM; the slice stays registered at the SA
  until it expires), and such a slice has nothing of another manager to grow, shrink or
  delete under it;
* refused with one line naming where it holds a sliver (another ``manage`` or ``run`` may be
  using it) unless ``adopt``, which records the adoption.

What another manager holds is known by its slivers only: a live manager of another state
directory that registered the slice and has not made its first sliver yet (or whose
CreateSliver keeps failing) is not seen, and the two would share the first sliver made.
:func:`reach` asks the SA and every CM for their version until they answer or
``timeout`` passes, for ``elasticslice run --connect-timeout``; :func:`preflight` does both
before anything is made on disk.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticslice.errors import ElasticSliceError, RPCError, TransportError
from elasticslice.managers.cycle import one_line
from elasticslice.managers.state import DB_NAME, ManagerState
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.transport import RetryPolicy, XmlRpcTransport, server_label

log = logging.getLogger(__name__)

PAUSE = 1.0   # seconds between two tries while a server does not answer


class SliceNotOurs(ElasticSliceError):
    """The configured slice exists and this state directory did not create it."""


class Unreachable(ElasticSliceError):
    """The SA or a CM did not answer within the connect timeout."""


def owns_slice(state: Any, urn: str) -> bool:
    """Whether the state directory of ``state`` created (or adopted) the slice ``urn``; a
    state that recorded the slice before ownership was kept counts as its owner."""
    owner = state.get_meta("slice_owner")
    if owner is not None:
        return json.loads(owner).get("urn") == urn
    record = state.slice()
    return record is not None and record.urn == urn


def own_slice(state: Any, urn: str, how: str, *, now: float) -> None:
    """Record that this state directory ``created`` or ``adopted`` the slice ``urn``."""
    state.set_meta("slice_owner", json.dumps({"urn": urn, "how": how, "at": now,
                                              "state_id": state.get_meta("state_id")}))


def _not_ours(urn: str, where: str, held: list[str]) -> SliceNotOurs:
    return SliceNotOurs(f"slice {urn} exists and was not created from the state directory "
                        f"{where}: it holds a sliver at {', '.join(held)}: another manager "
                        f"or run may be using it; give another slice name, or --adopt to "
                        f"take it over")


def holdings_of(server: Any) -> list[str]:
    """Where the configured (existing) slice holds a sliver: each configured CM that has
    one, else the CMs the SA names for it; empty: the slice holds nothing. A CM that does
    not answer is an error, not an empty answer."""
    held: list[str] = []
    for cm in server.cms:
        try:
            cm.get_sliver()
        except RPCError as err:
            if err.code != GeniCode.SEARCHFAILED:
                raise
            continue
        held.append(server_label(cm.url))
    return held or [str(cm) for cm in server.resolve_slice().get("component_managers") or []]


def exists(server: Any) -> bool:
    """Whether the configured slice exists at the SA."""
    try:
        server.get_slice_credential()
    except RPCError as err:
        if err.code != GeniCode.SEARCHFAILED:
            raise
        return False
    return True


class SliceClaim:
    """Whether this manager may work on its slice (see the module docstring)."""

    def __init__(self, server: Any, state: Any, *, adopt: bool = False, where: str = "",
                 clock: Callable[[], float] = time.time) -> None:
        self.server = server
        self.state = state
        self.adopt = adopt
        self.where = where
        self.clock = clock
        self.claimed = False

    def claim(self) -> None:
        """Raise :class:`SliceNotOurs` for a slice that is not ours (unless ``adopt``); a
        slice that does not exist yet is ours to create."""
        if self.claimed:
            return
        urn = self.server.slice_urn()
        if not owns_slice(self.state, urn) and exists(self.server):
            held = holdings_of(self.server)
            if not held:
                own_slice(self.state, urn, "reused", now=self.clock())
                log.info("reusing the existing slice %s: it holds no sliver", urn)
            elif not self.adopt:
                raise _not_ours(urn, self.where, held)
            else:
                own_slice(self.state, urn, "adopted", now=self.clock())
                log.warning("adopted the existing slice %s (--adopt)", urn)
        self.claimed = True


def reach(server: Any, timeout: float, *, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> None:
    """GetVersion at the SA and each CM until each answered; :class:`Unreachable` (one
    line naming the server) when one did not within ``timeout`` seconds."""
    end = clock() + timeout
    urls = [server.sa_url] + [c.url for c in server.cms]
    transport = XmlRpcTransport(server.transport.context,
                                timeout=max(0.1, min(timeout, server.config.timeout)),
                                retry=RetryPolicy(attempts=1))
    try:
        for url in urls:
            while True:
                transport.timeout = max(0.1, min(end - clock(), server.config.timeout))
                try:
                    transport.call_raw(url, "GetVersion", {}, keep_alive=False)
                    break
                except RPCError as err:
                    if not isinstance(err, TransportError):
                        break  # it answered (BUSY, say): it is there
                    left = end - clock()
                    if not _transient(err):
                        raise Unreachable(f"{server_label(url)}: {one_line(err)}") from err
                    if left <= 0:
                        raise Unreachable(f"cannot reach {server_label(url)} within "
                                          f"{timeout:g} s (--connect-timeout): "
                                          f"{one_line(err)}") from err
                    sleep(min(PAUSE, left))
    finally:
        transport.close()


def _transient(err: TransportError) -> bool:
    """A server that is down or slow may come up; a TLS refusal will not."""
    text = str(err)
    return any(k in text for k in ("connection", "no answer", "overloaded", "HTTP 503"))


def preflight(server: Any, state_dir: Path, *, adopt: bool, connect_timeout: float) -> None:
    """Before a run makes anything: the servers answer within ``connect_timeout``, and the
    slice is ours (recorded in ``state_dir``'s manager state), does not exist yet, holds
    nothing (see the module docstring), or ``adopt``."""
    reach(server, connect_timeout)
    if adopt:
        return
    urn = server.slice_urn()
    if (state_dir / DB_NAME).is_file():
        state = ManagerState.open(state_dir)
        try:
            if owns_slice(state, urn):
                return
        finally:
            state.close()
    if not exists(server):
        return
    held = holdings_of(server)
    if held:
        raise _not_ours(urn, str(state_dir), held)
