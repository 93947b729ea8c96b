"""OverlayManager (seed 000): translate, schedule and provision overlays.

- ``translate_overlay``: checks the pilot descriptions (they are typed already) and moves
  the overlay to TRANSLATED. Nothing is split or merged: a pilot is what the user asked for.
- ``schedule_overlay``: picks a framework per pilot: its ``framework`` field (a framework
  name in the session, or a kind: the first framework of that kind, created if the session
  has none), else the session's default (config ``default_framework``, else the first
  framework added, else a new ``local`` one).
- ``provision_overlay``: submits the pilots and waits until they all run (config
  ``pilot_timeout`` seconds); a pilot that fails or does not start makes the overlay FAILED
  and raises NoSuccess.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from troy.errors import BadParameter, IncorrectState, NoSuccess
from troy.frameworks import framework_class, known_kinds
from troy.frameworks.base import PilotFramework
from troy.overlay.overlay import Overlay
from troy.states import State

if TYPE_CHECKING:
    from troy.session import Session

log = logging.getLogger(__name__)


class OverlayManager:
    """Turns an Overlay's descriptions into running pilots of the session's frameworks."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def translate_overlay(self, overlay: Overlay) -> None:
        if overlay.state is not State.DESCRIBED:
            raise IncorrectState(f"overlay {overlay.id} is {overlay.state.value}; only a "
                                 f"DESCRIBED overlay can be translated")
        if not overlay.pilots:
            raise BadParameter(f"overlay {overlay.id} has no pilots")
        for p in overlay.pilots.values():
            if p.state is not State.CANCELED:
                p._state = State.TRANSLATED
        overlay._set_state(State.TRANSLATED)

    def schedule_overlay(self, overlay: Overlay) -> None:
        if overlay.state is State.DESCRIBED:
            self.translate_overlay(overlay)
        if overlay.state is not State.TRANSLATED:
            raise IncorrectState(f"overlay {overlay.id} is {overlay.state.value}; only a "
                                 f"TRANSLATED overlay can be scheduled")
        for p in overlay.pilots.values():
            if p.state is not State.CANCELED:
                p.framework = self._framework_for(p.description.framework).name
                p._state = State.SCHEDULED
        overlay._set_state(State.SCHEDULED)

    def _framework_for(self, wanted: str | None) -> PilotFramework:
        fw = self.session.find_framework(wanted)
        if fw is not None:
            return fw
        kind = wanted or "local"
        if kind not in known_kinds():
            raise BadParameter(f"pilot framework {kind!r} is neither a framework of the "
                               f"session ({', '.join(self.session.frameworks) or 'none'}) "
                               f"nor a known kind ({', '.join(known_kinds())})")
        framework_class(kind)
        log.info("overlay: adding a %s framework to the session", kind)
        return self.session.add_framework(kind)

    def provision_overlay(self, overlay: Overlay, timeout: float | None = None) -> None:
        if overlay.state in (State.DESCRIBED, State.TRANSLATED):
            self.schedule_overlay(overlay)
        if overlay.state is not State.SCHEDULED:
            raise IncorrectState(f"overlay {overlay.id} is {overlay.state.value}; only a "
                                 f"SCHEDULED overlay can be provisioned")
        for p in overlay.pilots.values():
            if p.state is State.CANCELED:
                continue
            fw = self.session.get_framework(p.framework or "")
            p.pilot = fw.submit_pilot(p.description)
            p.pilot.add_callback(overlay._pilot_changed)
        limit = timeout if timeout is not None else float(self.session.config["pilot_timeout"])
        deadline = time.monotonic() + limit
        for p in overlay.pilots.values():
            if p.pilot is None:
                continue
            state = p.pilot.wait_running(max(0.0, deadline - time.monotonic()))
            if state is not State.RUNNING:
                overlay._set_state(State.FAILED)
                raise NoSuccess(f"pilot {p.id} ({p.description.size} cores on "
                                f"{p.framework}) is {state.value}, not RUNNING, after "
                                f"{limit:g}s")
        overlay._set_state(State.PROVISIONED)

    def manage_overlay(self, overlay: Overlay, timeout: float | None = None) -> None:
        """Translate, schedule and provision in one go (each step only if still needed)."""
        if overlay.state is State.DESCRIBED:
            self.translate_overlay(overlay)
        if overlay.state is State.TRANSLATED:
            self.schedule_overlay(overlay)
        if overlay.state is State.SCHEDULED:
            self.provision_overlay(overlay, timeout)
