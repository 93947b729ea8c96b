"""Session: config, the store's place and lifetime, frameworks, close."""
from __future__ import annotations

import os

import pytest

import troy
from tests.helpers import wait_for
from troy import State
from troy.errors import BadParameter, IncorrectState


def test_default_store_is_temporary_and_removed_on_close():
    with troy.Session() as s:
        path = s.store_path
        s.add_framework("local").submit_pilot({"size": 1})
        us = s.unit_service()
        assert us.submit_unit({"executable": "/bin/true"}).wait(10) is State.DONE
        assert os.path.exists(path)
    assert not os.path.exists(path)
    with pytest.raises(IncorrectState, match="closed"):
        s.add_framework("local")


def test_a_given_store_outlives_the_session(tmp_path):
    path = tmp_path / "keep.sqlite"
    with troy.Session(store_path=path) as s:
        s.add_framework("local").submit_pilot({"size": 1})
        u = s.unit_service().submit_unit({"executable": "/bin/true", "tag": "kept"})
        u.wait(10)
    with troy.Session(store_path=path) as again:
        (rec,) = again.store.units()
        assert (rec.id, rec.state, rec.description["tag"]) == (u.id, State.DONE, "kept")


def test_config_is_checked():
    with pytest.raises(BadParameter, match="unknown key.*colour"):
        troy.Session(config={"colour": "blue"})
    s = troy.Session(config={"default_framework": "b"})
    s.add_framework("local", name="a")
    b = s.add_framework("local", name="b")
    assert s.find_framework(None) is b and s.find_framework("local") is s.frameworks["a"]
    s.close()


def test_closing_cancels_what_is_in_flight(tmp_path):
    s = troy.Session(store_path=tmp_path / "s.sqlite")
    s.add_framework("local").submit_pilot({"size": 1})
    us = s.unit_service()
    running, queued = us.submit_units([{"executable": "/bin/sleep", "arguments": ["30"]}] * 2)
    nowhere = s.unit_service().submit_unit({"executable": "/bin/true", "cores": 8})
    wait_for(lambda: running.state is State.RUNNING, 10, what="a unit running")
    s.close()
    assert {running.state, queued.state, nowhere.state} == {State.CANCELED}
    with troy.Session(store_path=tmp_path / "s.sqlite") as again:
        assert {r.state for r in again.store.units()} == {State.CANCELED}
        assert again.recover() == []  # canceled on purpose: nothing to re-run


def test_workload_managers_share_one_unit_service(troy_session):
    a = troy.WorkloadManager(troy_session).unit_service
    b = troy.WorkloadManager(troy_session).unit_service
    c = troy.WorkloadManager(troy_session, scheduler="first_fit").unit_service
    assert a is b and a is not c and a.scheduler.name == "backfill"
