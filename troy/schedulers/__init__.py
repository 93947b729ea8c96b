"""Application-level schedulers by name, checked against ``BaseScheduler`` when loaded.

Built in: ``round_robin``, ``first_fit``, ``backfill``, ``seed003``. Add your own with
``register_scheduler(name, cls)`` or an entry point in the ``troy.schedulers`` group, or pass
the class (or an instance) straight to ``session.unit_service(scheduler=...)``.
"""
from __future__ import annotations

from importlib.metadata import entry_points

from troy.errors import BadParameter
from troy.schedulers.base import BaseScheduler, backlog_pilot, could_ever_fit, running_pilots
from troy.schedulers.builtin import BackfillScheduler, FirstFitScheduler, RoundRobinScheduler
from troy.schedulers.seed003 import Seed003Scheduler

__all__ = ["BaseScheduler", "RoundRobinScheduler", "FirstFitScheduler", "BackfillScheduler",
           "Seed003Scheduler", "register_scheduler", "get_scheduler", "known_schedulers",
           "running_pilots", "could_ever_fit"]

_registry: dict[str, type[BaseScheduler]] = {
    cls.name: cls for cls in (RoundRobinScheduler, FirstFitScheduler, BackfillScheduler,
                              Seed003Scheduler)}


def register_scheduler(name: str, cls: type[BaseScheduler]) -> None:
    if not (isinstance(cls, type) and issubclass(cls, BaseScheduler)):
        raise BadParameter(f"scheduler {name!r}: {cls!r} is not a BaseScheduler subclass")
    _registry[name] = cls


def known_schedulers() -> list[str]:
    return sorted(set(_registry) | {ep.name for ep in entry_points(group="troy.schedulers")})


def get_scheduler(spec: str | type[BaseScheduler] | BaseScheduler) -> BaseScheduler:
    """A scheduler instance from a name, a ``BaseScheduler`` subclass, or an instance."""
    if isinstance(spec, BaseScheduler):
        return spec
    if isinstance(spec, type):
        if not issubclass(spec, BaseScheduler):
            raise BadParameter(f"scheduler {spec!r} is not a BaseScheduler subclass")
        return spec()
    if not isinstance(spec, str):
        raise BadParameter(f"scheduler: expected a name, class or instance, got {spec!r}")
    if spec not in _registry:
        eps = [ep for ep in entry_points(group="troy.schedulers") if ep.name == spec]
        if not eps:
            raise BadParameter(f"unknown scheduler {spec!r}; known: "
                               f"{', '.join(known_schedulers())}")
        register_scheduler(spec, eps[0].load())
    return _registry[spec]()
