"""The seed-002 descriptions (SAGA slot names) and the small types of ``troy.pilotjob``."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from troy.descriptions import ComputeUnitDescription, PilotDescription
from troy.errors import BadParameter

MEMBERS = ("state", "state_detail")


class PilotJobType(Enum):
    """Seed 002's ``PILOTJOB_TYPE``, for the backends Troy has."""

    UNKNOWN = "unknown"
    LOCAL = "local"
    DASK = "dask"


PILOTJOB_TYPE = PilotJobType  # the seed's name


class Callback:
    """Base for callbacks: override ``cb``; return False to be removed."""

    def cb(self, obj: Any, member: str, value: Any) -> bool | None:
        raise NotImplementedError


@dataclass(slots=True)
class _SagaDescription:
    executable: str | None = None
    arguments: list[str] = field(default_factory=list)
    cleanup: bool | None = None
    environment: dict[str, str] = field(default_factory=dict)
    interactive: bool | None = None
    contact: str | None = None
    project: str | None = None
    start_time: str | None = None
    working_directory: str | None = None
    input: str | None = None
    error: str | None = None
    output: str | None = None
    file_transfer: list[str] = field(default_factory=list)
    number_of_processes: int | None = None
    processes_per_host: int | None = None
    threads_per_process: int | None = None
    total_cpu_count: int | None = None
    spmd_variation: str | None = None
    candidate_hosts: list[str] = field(default_factory=list)
    cpu_architecture: str | None = None
    total_physical_memory: int | None = None
    operating_system_type: str | None = None
    total_cpu_time: float | None = None
    wall_time_limit: float | None = None
    queue: str | None = None

    @classmethod
    def coerce(cls, value: Any) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise BadParameter(f"expected a {cls.__name__} or a dict, got {type(value).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise BadParameter(f"{cls.__name__}: unknown slot(s) {', '.join(unknown)}")
        return cls(**value)

    def _cores(self) -> int:
        n = self.total_cpu_count or self.number_of_processes or 1
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BadParameter(f"{type(self).__name__}.total_cpu_count: expected an integer "
                               f">= 1, got {n!r}")
        return n

    def _walltime(self) -> float | None:
        if self.wall_time_limit is None:
            return None
        return float(self.wall_time_limit) * 60.0


@dataclass(slots=True)
class PilotJobDescription(_SagaDescription):
    """What kind of pilot job the application wants (seed 002; SAGA slot names)."""

    def to_pilot_description(self, framework: str) -> PilotDescription:
        return PilotDescription(size=self._cores(), framework=framework,
                                walltime=self._walltime(), resource=self.contact)


@dataclass(slots=True)
class WorkUnitDescription(_SagaDescription):
    """A work unit: what to run and with how many cores (seed 002; SAGA slot names)."""

    def to_unit_description(self) -> ComputeUnitDescription:
        if not self.executable:
            raise BadParameter("WorkUnitDescription.executable: required")
        inputs, outputs = [], []
        for d in self.file_transfer:
            if "<" in d:  # SAGA: "local < remote" copies the unit's file back
                local, remote = (p.strip() for p in d.split("<", 1))
                outputs.append(f"{remote} > {local}")
            else:
                inputs.append(d)
        return ComputeUnitDescription(
            executable=self.executable, arguments=list(self.arguments),
            # relative paths (output, file_transfer) are the submitter's, on any framework
            environment=dict(self.environment),
            working_directory=self.working_directory or os.getcwd(),
            stdin=self.input, stdout=self.output, stderr=self.error, inputs=inputs,
            outputs=outputs, cores=self._cores(), walltime=self._walltime())
