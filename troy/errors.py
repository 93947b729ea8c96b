"""Troy's error hierarchy: one root, named after the seeds' exceptions where they have one."""
from __future__ import annotations


class TroyError(Exception):
    """Root of every error Troy raises on purpose."""


class BadParameter(TroyError, ValueError):
    """A description or argument is invalid; the message names the field."""


class NoSuccess(TroyError):
    """An operation could not be carried out (seed 003: no suitable pilot found...)."""


class IncorrectState(TroyError):
    """The object is not in a state that allows the operation (e.g. a locked workload)."""


class DoesNotExist(TroyError, KeyError):
    """No such task, unit, pilot or framework."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class WorkloadFileError(TroyError):
    """A workload file (Troy JSON or WfFormat) is unreadable or invalid; names file and place."""


class UsageError(BadParameter):
    """Bad command-line usage (an option's value, options that do not go together, a store
    of another run): the ``troy`` command exits 2 on it, as on click's own usage errors."""
