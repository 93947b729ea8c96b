"""``state`` / ``state_detail`` with seed-002 callbacks, shared by PilotJob and WorkUnit."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from troy.errors import BadParameter
from troy.pilotjob.descriptions import MEMBERS, Callback
from troy.states import State

log = logging.getLogger(__name__)


class Observable:
    """``state``/``state_detail`` with seed-style callbacks."""

    def __init__(self) -> None:
        self._cbs: dict[str, Any] = {}
        self._cb_lock = threading.Lock()
        self._values: dict[str, Any] = {"state": State.PENDING, "state_detail": None}

    @property
    def state(self) -> State:
        return self._values["state"]

    @property
    def state_detail(self) -> str | None:
        return self._values["state_detail"]

    def set_callback(self, member: str, cb: Callback | Callable[[Any, str, Any], Any]) -> None:
        if member not in MEMBERS:
            raise BadParameter(f"set_callback: member must be one of {', '.join(MEMBERS)}, "
                               f"got {member!r}")
        if not (isinstance(cb, Callback) or callable(cb)):
            raise BadParameter(f"set_callback: {cb!r} is neither a Callback nor callable")
        with self._cb_lock:
            self._cbs[member] = cb

    def unset_callback(self, member: str) -> None:
        if member not in MEMBERS:
            raise BadParameter(f"unset_callback: member must be one of {', '.join(MEMBERS)}")
        with self._cb_lock:
            self._cbs.pop(member, None)

    def _update(self, state: State, detail: str | None) -> None:
        changed = []
        with self._cb_lock:
            for member, value in (("state", state), ("state_detail", detail)):
                if self._values[member] != value:
                    self._values[member] = value
                    changed.append((member, value, self._cbs.get(member)))
        for member, value, cb in changed:
            if cb is None:
                continue
            try:
                keep = cb.cb(self, member, value) if isinstance(cb, Callback) \
                    else cb(self, member, value)
            except Exception:
                log.exception("callback on %s.%s failed", self, member)
                continue
            if keep is False:
                with self._cb_lock:
                    if self._cbs.get(member) is cb:
                        del self._cbs[member]
