"""Fixtures for the Troy core tests: real sessions, local frameworks, real processes."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

import troy


@pytest.fixture
def troy_session(tmp_path) -> Iterator[troy.Session]:
    s = troy.Session(store_path=tmp_path / "troy.sqlite")
    yield s
    s.close()


@pytest.fixture
def local_fw(troy_session, tmp_path):
    """A local framework named "local" with one running 4-core pilot."""
    fw = troy_session.add_framework("local", name="local", sandbox=str(tmp_path / "sandbox"))
    p = fw.submit_pilot(troy.PilotDescription(size=4))
    assert p.wait_running(10) is troy.State.RUNNING
    return fw
