"""Workloads (seed 001): tasks, relations, and the manager that turns them into units.

(``troy.workload.files`` loads Troy JSON and WfFormat workload files.)
"""
from __future__ import annotations

from troy.descriptions import ComputeUnitDescription, TaskDescription
from troy.unit import ComputeUnit
from troy.workload.bundling import plan_bundles
from troy.workload.manager import WorkloadManager
from troy.workload.task import Task
from troy.workload.workload import Relation, Workload

__all__ = ["TaskDescription", "Task", "ComputeUnitDescription", "ComputeUnit", "Relation",
           "Workload", "WorkloadManager", "plan_bundles"]
