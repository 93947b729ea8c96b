"""How a revoked node's work comes off it before it goes: :class:`PilotDrainer` drains the
node's pilot against the revocation's deadline and says when the node may go (the manager's
``release_early`` then asks the node in ``to_release``, the one way back, and the cycle's
``release_nodes`` gives it back at once)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from elasticslice.managers.background import Background
from elasticslice.managers.records import PendingDelete
from elasticslice.pilots.watch import PilotWatch
from troy.frameworks import Pilot
from troy.states import FINAL_STATES

log = logging.getLogger("elasticslice.pilots.manager")

class PilotDrainer:
    """A :class:`~elasticslice.managers.endpoint.Releaser` for pilots. ``start`` returns at
    once: a node without a live pilot is released there and then, a pilot's drain
    (``drain_pilot(pilot, revocation.deadline, margin=, on_empty=)``, a Dask round trip)
    runs on a thread of its own. ``release(node_id, client_id, why)`` is called when the
    node may go. ``plans``: node_id -> the framework's ``DrainPlan``."""

    def __init__(self, watch: PilotWatch, *, margin: float,
                 release: Callable[[str, str | None, str], None]) -> None:
        self.watch = watch
        self.framework = watch.framework
        self.margin = margin
        self.release = release
        self.plans: dict[str, Any] = {}
        self.work = Background("pilot-drain", threads=4)

    def _live(self, rev: PendingDelete) -> Pilot | None:
        pilot = self.watch.pilot_of(rev.client_id, rev.cm)   # the node's site's pilot only
        return pilot if pilot is not None and pilot.state not in FINAL_STATES else None

    def start(self, revocations: Sequence[PendingDelete]) -> None:
        for rev in revocations:
            pilot = self._live(rev)
            if pilot is not None:
                self.work.post(self._drain, rev, pilot)
            elif hasattr(self.framework, "refresh"):   # reported from afar: ask first
                self.work.post(self._drain_if_any, rev)
            else:
                self.release(rev.node_id, rev.client_id, "no pilot on it")

    def _drain_if_any(self, rev: PendingDelete) -> None:
        self.watch.refresh()
        pilot = self._live(rev)
        if pilot is None:
            self.release(rev.node_id, rev.client_id, "no pilot on it")
        else:
            self._drain(rev, pilot)

    def hurry(self, revocation: PendingDelete) -> None:
        pilot = self._live(revocation)
        if pilot is not None:
            self.work.post(self._drain, revocation, pilot)

    def _drain(self, rev: PendingDelete, pilot: Pilot) -> None:
        log.warning("draining pilot %s of %s: CloudLab takes it in %.0f s", pilot.id,
                    rev.client_id, rev.deadline - self.watch.clock())
        self.plans[rev.node_id] = self.framework.drain_pilot(
            pilot, rev.deadline, margin=self.margin,
            on_empty=lambda p: self._emptied(rev, p))

    def _emptied(self, rev: PendingDelete, pilot: Pilot) -> None:
        """Troy's units are off the pilot; the framework retires it before the deadline
        (``PilotFramework.retire``: on Dask, plain Dask tasks of a client's own, which
        Troy's drain does not see, move with their data), then the node may go. On the
        drainer's thread: the retirement waits for its answer, which may come on the
        thread that said the pilot was empty."""
        self.work.post(self._retire_and_release, rev, pilot)

    def _retire_and_release(self, rev: PendingDelete, pilot: Pilot) -> None:
        if pilot.state not in FINAL_STATES:
            self.framework.retire(pilot, rev.deadline - self.margin)
        self.release(rev.node_id, rev.client_id, "drained")

    def gone(self, revocations: Sequence[PendingDelete], *, now: bool = False) -> None:
        """These nodes are gone, or CloudLab takes them ``now``: their pilots' units are
        requeued, on a thread of the drainer's (the answer to CloudLab never waits for it:
        a unit Dask moves by itself off a dead worker is counted by the framework too)."""
        def lose_all() -> None:
            for rev in revocations:
                self.lose(rev.client_id, "taken back by CloudLab")
        self.work.post(lose_all)

    def lose(self, client_id: str | None, reason: str) -> None:
        pilot = self.watch.pilot_of(client_id)
        if pilot is not None and pilot.state not in FINAL_STATES:
            started = time.monotonic()
            requeued = self.framework.lose_pilot(pilot, reason)
            log.info("pilot %s of %s lost (%s): %d unit(s) requeued in %.0f ms", pilot.id,
                     client_id, reason, len(requeued), (time.monotonic() - started) * 1000)

    def running(self) -> int:
        return 0

    def close(self) -> None:
        self.work.close()
