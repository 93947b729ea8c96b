"""Limits that keep a workload or a run from growing without end (docs/troy.md, "Limits").

A task takes about 1 KB once planned, so ``MAX_TASKS`` tasks (after cardinality expansion)
stay near 100 MB; ``troy run`` starts at most ``MAX_PILOTS`` pilots of at most
``MAX_PILOT_CORES`` cores each.
"""
from __future__ import annotations

import math
from typing import Any

#: Tasks in one workload, counted after cardinality expansion (and so the largest cardinality).
MAX_TASKS = 100_000
#: Pilots one ``troy run`` starts (``--pilots COUNTxCORES``).
MAX_PILOTS = 1_000
#: Cores of one pilot that ``troy run`` starts.
MAX_PILOT_CORES = 1_024


def is_finite_number(value: Any) -> bool:
    """True for an int or a finite float (not a bool, not NaN, not ±Infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)
