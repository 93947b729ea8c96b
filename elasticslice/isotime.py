"""ISO-8601 times as CloudLab writes them, read alike on every Python the project runs on.

``datetime.fromisoformat`` reads a ``Z`` suffix and fractions of any length only from
Python 3.11; on 3.10 it takes exactly what ``isoformat`` writes. :func:`parse_iso` takes
``Z`` for UTC and a fraction of 1 to 6 digits on both.
"""
from __future__ import annotations

import re
import sys
from datetime import datetime

_FRACTION = re.compile(r"^(.*[T ]\d\d:\d\d:\d\d)\.(\d{1,6})(?=$|[+-])(.*)$")


def parse_iso(text: str) -> datetime:
    """``datetime.fromisoformat(text)`` as Python 3.11 reads these forms (ValueError when
    it is not a date and time)."""
    raw = text.strip()
    if sys.version_info < (3, 11):
        if raw.endswith("Z"):
            raw = raw[:-1] + "+00:00"
        match = _FRACTION.match(raw)
        if match:
            raw = f"{match.group(1)}.{match.group(2).ljust(6, '0')}{match.group(3)}"
    return datetime.fromisoformat(raw)
