"""The classic P* API (seed 002) as a thin layer over Troy's frameworks.

``PilotJobService().create(rm, PilotJobDescription)`` starts a pilot; the resource manager
URL's scheme picks the framework: ``local://localhost`` (pilots are core budgets on this
machine), ``dask://localhost`` (start a Dask scheduler here) or ``dask://host:port`` (attach
to that scheduler). A ``WorkUnitService`` spans the pilot job services ``add``-ed to it and
places each submitted ``WorkUnitDescription`` with a small application-level scheduler written
on the public framework API (seed 003): the first framework with a running pilot whose free
cores fit the unit, else one with a pilot (running or starting) wide enough to hold it, where
the unit waits; binding to a pilot is left to the framework. ``NoSuccess`` if no pilot could
ever hold it.

Descriptions keep the seed's (SAGA) slot names; what Troy uses:

=====================  ============================================================
``total_cpu_count``    pilot size / unit cores (else ``number_of_processes``; 1)
``wall_time_limit``    minutes, as in SAGA: pilot walltime / unit walltime (killed)
``executable``, ``arguments``, ``environment``, ``working_directory``: the unit's process
``input``/``output``/``error``   the unit's stdin / stdout / stderr files
``file_transfer``      ``"src > dst"`` stages in, ``"local < remote"`` stages out
=====================  ============================================================

The other slots (``queue``, ``project``, ``candidate_hosts``, ``spmd_variation``...) are
accepted and kept but mean nothing on local or Dask pilots. ``state`` is a ``troy.State``;
``state_detail`` a short backend string (the Dask worker address, a unit's exit status).
Callbacks: ``set_callback("state" | "state_detail", cb)`` where ``cb`` is a ``Callback``
(its ``cb(obj, member, value)``) or any callable of those three arguments; returning
``False`` removes it, anything else keeps it. One callback per member; they run in
framework threads.
"""
from __future__ import annotations

from troy.pilotjob.descriptions import (MEMBERS, PILOTJOB_TYPE, Callback, PilotJobDescription,
                                        PilotJobType, WorkUnitDescription)
from troy.pilotjob.pilots import PilotJob, PilotJobService
from troy.pilotjob.units import WorkUnit, WorkUnitService

__all__ = ["PilotJobService", "PilotJob", "PilotJobDescription", "WorkUnitService",
           "WorkUnit", "WorkUnitDescription", "Callback", "PilotJobType", "PILOTJOB_TYPE",
           "MEMBERS"]
