"""``Overlay.following(framework)``: an overlay that is whatever pilots a framework has,
now and later (an elastic cluster adds and removes them as machines come and go).

It is PROVISIONED from the start and stays so: pilots that end are simply no longer in it,
and a workload run on it (``troy.execute_workload(session, workload,
Overlay.following(fw))``, late binding) waits, queued, while there is no pilot. Units of a
pilot that is drained or lost are requeued by the framework and run on the others; none is
lost. ``cancel()`` stops following; the framework's pilots are not the overlay's to cancel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from troy.overlay.overlay import Overlay, Pilot
from troy.states import FINAL_STATES, State

if TYPE_CHECKING:
    from troy.frameworks.base import PilotFramework


class FollowingOverlay(Overlay):
    """The live pilots of ``framework`` as an overlay (see the module documentation)."""

    def __init__(self, framework: PilotFramework, uid: str | None = None) -> None:
        super().__init__(uid=uid)
        self.framework = framework
        self._state = State.PROVISIONED
        self._locked = True
        self._wrappers: dict[str, Pilot] = {}

    def __repr__(self) -> str:
        return (f"<FollowingOverlay {self.id} {self._state.value} of "
                f"{self.framework.name!r} pilots={len(self.pilots)}>")

    @property  # type: ignore[override]
    def pilots(self) -> dict[str, Pilot]:
        """The framework's pilots that are not final, as overlay pilots (by pilot id)."""
        live = {}
        for fp in self.framework.list_pilots():
            if fp.state in FINAL_STATES:
                continue
            op = self._wrappers.get(fp.id)
            if op is None:
                op = self._wrappers[fp.id] = Pilot(fp.id, fp.description, self)
                op.pilot, op.framework = fp, self.framework.name
            live[fp.id] = op
        return live

    @pilots.setter
    def pilots(self, value: Any) -> None:  # the base class's __init__ sets it: ignored
        pass

    def cancel(self) -> None:
        """Stop following (the overlay ends COMPLETED; the pilots run on)."""
        self._set_state(State.COMPLETED)

    def _pilot_changed(self, *args: Any) -> None:
        """Pilots come and go: that changes nothing in a following overlay's state."""
