"""The slice and its slivers kept in being: the part of the :class:`~.actuator.Actuator`
that registers the slice and makes each CM's sliver when they are missing, and reads their
expiry into the state (the renewer's yardstick)."""
from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from elasticslice.errors import ElasticSliceError, RPCError
from elasticslice.managers.ownership import own_slice
from elasticslice.rpc.codes import GeniCode
from elasticslice.rpc.credential import expires_of, parse_credential

log = logging.getLogger("elasticslice.managers.manager")

#: seconds after which ensure_sliver asks GetSliver again even though nothing changed
SLIVER_RECHECK = 600.0


@dataclass
class _Sliver:
    """The sliver credential GetSliver gave at one CM, read."""
    credential: str
    info: Any                # its parsed content
    answers: int             # the CM's SliverStatus answers when last looked at
    read_at: float           # when GetSliver gave it


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc)


def iso_utc(ts: float | None) -> str:
    return utc(ts).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "unknown"


class SliceKeeper:
    """Mixed into the actuator, whose ``server``, ``cms``, ``state``, ``holdings``,
    ``helper``, ``clock``, ``notify`` and ``renew_hours`` it uses."""

    server: Any
    cms: Any
    state: Any
    holdings: Any
    helper: Any
    clock: Any
    notify: Any
    renew_hours: float

    def __init__(self) -> None:
        self._slice_credential: tuple[str, float] | None = None   # its text, its expiry
        self._slivers: dict[str, _Sliver] = {}  # cm -> its sliver credential, as read

    def create_slice(self) -> int:
        expires = utc(self.clock() + self.renew_hours * 3600)
        cred = self.server.register_slice(expiration=expires)
        urn = self.server.slice_urn()
        self.state.set_slice(urn, expires_of(cred).timestamp())
        own_slice(self.state, urn, "created", now=self.clock())
        log.info("registered slice %s until %s", urn, expires_of(cred))
        self.notify("slice created", f"registered slice {urn}")
        return 1

    def ensure_slice(self) -> int:
        try:
            cred = self.server.get_slice_credential()
        except RPCError as err:
            if err.code != GeniCode.SEARCHFAILED:
                raise
            return self.create_slice()
        known = self._slice_credential
        if known is None or known[0] != cred:   # (cached: the same every cycle until renewed)
            known = self._slice_credential = (cred, expires_of(cred).timestamp())
        self.state.set_slice(self.server.slice_urn(), known[1])
        return 0

    def give_back_slivers(self) -> int:
        """At the end of a run: the slivers at every CM go back (DeleteSlice, with a pending
        sliver's creation canceled), each CM that refuses named in a warning; how many went."""
        gone = 0
        for cm in self.cms:
            try:
                cm.delete_slice(cancel=True)
                gone += 1
            except ElasticSliceError as err:
                log.warning("cannot give the slice back at %s: %s", cm.url, err)
        return gone

    def create_sliver(self, cm: Any) -> int:
        cred, manifest = cm.create_sliver(self._request_for(cm))
        info = parse_credential(cred)
        self.state.set_sliver(cm.url, info.target_urn, info.expires.timestamp(), "created")
        names = self.holdings.record_manifest(cm.url, manifest, self.clock(), initial=True)
        log.info("created the sliver at %s: %s", cm.url, " ".join(names))
        self.notify("sliver created", f"sliver at {cm.url}: {' '.join(names)}")
        return 1

    def _request_for(self, cm: Any) -> str:
        """The helper's request RSpec; with several CMs, each of its nodes that names no CM
        bound to ``cm`` (CM v2's convention for a slice across CMs: PROTOCOL.md)."""
        rspec = self.helper.create_rspec()
        if len(self.cms) < 2:
            return rspec
        from elasticslice.rspec.build import bind_to_cm
        urn = str(cm.get_version().get("urn", ""))
        return bind_to_cm(rspec, urn) if urn else rspec

    def ensure_sliver(self, cm: Any) -> int:
        """Make the sliver at ``cm`` unless it is there (GetSliver; CreateSliver when
        SEARCHFAILED). GetSliver is not asked again while nothing can have changed: the CM
        answered SliverStatus for the sliver since the last look, the state holds the
        expiry read then (no renewal since), and the look is under ``SLIVER_RECHECK`` old
        (each GetSliver makes the CM sign a new credential; the cycle reads SliverStatus
        anyway, and a sliver gone fails it, which wakes this method)."""
        answers = getattr(cm, "status_answers", None)
        known = self._slivers.get(cm.url)
        if known is not None and answers is not None and answers > known.answers \
                and self.clock() - known.read_at < SLIVER_RECHECK \
                and self._as_read(cm, known.info):
            known.answers = answers
            return 0
        try:
            cred = cm.get_sliver()
        except RPCError as err:
            if err.code != GeniCode.SEARCHFAILED:
                raise
            self._slivers.pop(cm.url, None)
            return self.create_sliver(cm)
        info = known.info if known is not None and known.credential == cred \
            else parse_credential(cred)
        self._slivers[cm.url] = _Sliver(cred, info, answers or 0, self.clock())
        self.state.set_sliver(cm.url, info.target_urn, info.expires.timestamp(), "exists")
        return 0

    def _as_read(self, cm: Any, info: Any) -> bool:
        """The state's record of the sliver at ``cm`` is the one its credential gave."""
        row = next((s for s in self.state.slivers() if s.cm == cm.url), None)
        return row is not None and row.urn == info.target_urn and row.status == "exists" \
            and row.expires == info.expires.timestamp()
