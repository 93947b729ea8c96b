"""``execute_workload``: the whole Troy pipeline for one workload, to a final state.

planner (expand, PLANNED) → overlay manager (translate, schedule, provision) → workload
manager (translate, bind, dispatch) → wait until every task is final.
"""
from __future__ import annotations

import logging
from typing import Any

from troy.errors import BadParameter, IncorrectState, NoSuccess
from troy.overlay import Overlay, OverlayManager
from troy.planner import Planner
from troy.session import Session
from troy.states import State
from troy.workload import Workload, WorkloadManager

log = logging.getLogger(__name__)


def execute_workload(session: Session, workload: Workload, overlay: Overlay | None = None,
                     *, bind_mode: str = "late", timeout: float | None = None,
                     manager: WorkloadManager | None = None, **manager_options: Any) -> State:
    """Run ``workload`` on ``overlay`` (derived by the planner if None) and return the
    workload's final state (DONE, FAILED or CANCELED; the workload's ``state`` says the
    same). An overlay the planner derived is canceled at the end; one you pass is left
    running for reuse. ``manager_options`` go to ``WorkloadManager`` (``bundle``,
    ``scheduler``, ``bundle_threshold``). ``timeout``: NoSuccess if the tasks are not all
    final by then (they keep running; cancel the workload to stop them)."""
    if not workload.tasks:
        raise BadParameter(f"workload {workload.id} has no tasks")
    planner = Planner(session)
    if workload.state is State.DESCRIBED:
        planner.plan(workload)
    derived = overlay is None
    if overlay is None:
        overlay = planner.derive_overlay(workload)
    if overlay.state in (State.COMPLETED, State.FAILED):
        raise IncorrectState(f"overlay {overlay.id} is {overlay.state.value}: its pilots are "
                             f"gone; describe a new overlay")
    OverlayManager(session).manage_overlay(overlay)
    wm = manager or WorkloadManager(session, **manager_options)
    try:
        wm.translate_workload(workload, overlay)
        wm.bind_workload(workload, overlay, bind_mode=bind_mode)
        wm.dispatch_workload(workload, overlay)
        state = wm.wait_workload(workload, timeout)
        if not workload.finished:
            raise NoSuccess(f"workload {workload.id} not finished after {timeout:.1f} s "
                            f"(state {state.value})")
        return state
    finally:
        if derived:
            overlay.cancel()
