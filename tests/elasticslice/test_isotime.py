"""ISO-8601 times as CloudLab writes them read alike on Python 3.10 and 3.11+ (3.10's
``fromisoformat`` refuses a ``Z`` and fractions of other than 3 or 6 digits)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from elasticslice.isotime import parse_iso

UTC = timezone.utc


@pytest.mark.parametrize("text, when", [
    ("2026-11-22T10:00:00Z", datetime(2026, 11, 22, 10, tzinfo=UTC)),
    (" 2026-11-22T10:00:00Z ", datetime(2026, 11, 22, 10, tzinfo=UTC)),
    ("2026-11-22T10:00:00.5Z", datetime(2026, 11, 22, 10, 0, 0, 500000, tzinfo=UTC)),
    ("2026-11-22T10:00:00.1234+02:00",
     datetime(2026, 11, 22, 10, 0, 0, 123400, tzinfo=timezone(timedelta(hours=2)))),
    ("2026-11-22 10:00:00.123456", datetime(2026, 11, 22, 10, 0, 0, 123456)),
    ("2026-11-22T10:00:00", datetime(2026, 11, 22, 10)),
])
def test_what_cloudlab_writes_is_read(text: str, when: datetime) -> None:
    assert parse_iso(text) == when


@pytest.mark.parametrize("text", ["", "tomorrow", "2026-13-01T00:00:00Z", "2026-11-22T25:00"])
def test_what_is_not_a_time_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_iso(text)
