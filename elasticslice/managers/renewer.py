"""The renewer: the slice at the SA, then each sliver at its CM, well before they expire."""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.keeper import iso_utc, utc
from elasticslice.managers.cycle import one_line
from elasticslice.rpc.credential import expires_of

log = logging.getLogger("elasticslice.managers.manager")


class Renewer:
    """Renews when an expiry is closer than ``margin()`` seconds, for ``renew_hours`` more;
    ``ensure_slice()`` when the state knows no slice yet. A failure is loud: logged at
    ERROR, mailed, raised (the cycle retries with backoff)."""

    def __init__(self, server: Any, state: Any, cms: Sequence[Any], *,
                 ensure_slice: Callable[[], Any], clock: Callable[[], float],
                 notify: Callable[[str, str], None], renew_hours: float,
                 margin: Callable[[], float]) -> None:
        self.server = server
        self.state = state
        self.cms = list(cms)
        self.ensure_slice = ensure_slice
        self.clock = clock
        self.notify = notify
        self.renew_hours = renew_hours
        self.margin = margin

    def renew(self) -> int:
        """How many of the slice and slivers were renewed."""
        now = self.clock()
        margin = self.margin()
        target = now + max(self.renew_hours * 3600, margin + 600)
        record = self.state.slice()
        if record is None:
            self.ensure_slice()
            record = self.state.slice()
        renewed = 0
        problems: list[str] = []
        slice_expires = record.expires if record and record.expires else None
        if slice_expires is None or slice_expires - now < margin:
            try:
                cred = self.server.renew_slice_sa(utc(target))
                slice_expires = expires_of(cred).timestamp()
                self.state.set_slice(self.server.slice_urn(), slice_expires)
                renewed += 1
                log.info("renewed the slice until %s", iso_utc(slice_expires))
            except ElasticSliceError as err:
                problems.append(f"slice (expires {iso_utc(slice_expires)}): {one_line(err)}")
        renewed += self._slivers(now, margin, target, slice_expires, problems)
        if problems:
            text = "; ".join(problems)
            log.error("RENEWAL FAILED, the slice may lapse: %s", text)
            self.notify("RENEWAL FAILED", f"The slice may lapse: {text}")
            raise ElasticSliceError(f"renewal failed: {text}")
        return renewed

    def _slivers(self, now: float, margin: float, target: float,
                 slice_expires: float | None, problems: list[str]) -> int:
        renewed = 0
        slivers = {s.cm: s for s in self.state.slivers()}
        for cm in self.cms:
            sliver = slivers.get(cm.url)
            if sliver is None or sliver.urn is None:
                continue
            if sliver.expires is not None and sliver.expires - now >= margin:
                continue
            until = min(target, slice_expires) if slice_expires else target
            try:
                cm.renew_slice(utc(until))
                self.state.set_sliver(cm.url, sliver.urn, until, sliver.status)
                renewed += 1
                log.info("renewed the sliver at %s until %s", cm.url, iso_utc(until))
            except ElasticSliceError as err:
                problems.append(f"sliver at {cm.url} (expires {iso_utc(sliver.expires)}): "
                                f"{one_line(err)}")
        return renewed
