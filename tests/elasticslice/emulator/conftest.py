"""Fixtures of the emulator tests (the emulator itself: tests/conftest.py).

``file_server``: a :class:`~tests.elasticslice.emulator.helpers.FileServer` of the test's
``tmp_path / "www"`` (plain HTTP on 127.0.0.1, port 0): where install tarballs are fetched
from, as the CM fetches them.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.elasticslice.emulator.helpers import FileServer


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[FileServer]:
    (tmp_path / "www").mkdir(exist_ok=True)
    server = FileServer(tmp_path / "www")
    yield server
    server.close()
