"""Fixtures for the framework contract suite: one real Dask scheduler per module, real
workers and real processes per test, a fresh Session per test."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

import troy
from troy.frameworks.dask import DaskFramework


@pytest.fixture(scope="module")
def dask_scheduler() -> Iterator[str]:
    """The address of a Dask scheduler shared by a module's tests (started once: the
    frameworks of each test attach to it and start their own workers)."""
    host = DaskFramework("scheduler-host")
    host.start()
    yield host.scheduler_address
    host.close()


@pytest.fixture
def session(tmp_path) -> Iterator[troy.Session]:
    s = troy.Session(store_path=tmp_path / "troy.sqlite")
    yield s
    s.close()


@pytest.fixture(params=["local", pytest.param("dask", marks=pytest.mark.slow),
                        pytest.param("dask-channel", marks=pytest.mark.slow)])
def framework(request, session, tmp_path):
    """A started framework of each kind (no pilots yet), registered in ``session``;
    ``dask-channel``: Dask with its units on Troy's own channel (``unit_channel``)."""
    options = {"sandbox": str(tmp_path / "sandbox")}
    kind = request.param.split("-")[0]
    if kind == "dask":
        options["scheduler_address"] = request.getfixturevalue("dask_scheduler")
    if request.param == "dask-channel":
        options["unit_channel"] = True
    return session.add_framework(kind, name=f"fw-{request.param}", **options)
