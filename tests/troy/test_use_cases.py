"""Seed 003's use cases. A: one workload, unchanged, on different frameworks.
(B, across frameworks with an application-level scheduler: test_unit_service.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest

import troy
from troy import State
from tests.troy.helpers import diamond


def run_use_case_a(kind: str, tmp_path: Path, **framework_options) -> troy.Workload:
    out = tmp_path / kind
    out.mkdir()
    with troy.Session(store_path=tmp_path / f"{kind}.sqlite") as s:
        s.add_framework(kind, **framework_options)
        w = diamond(out)
        overlay = troy.Overlay([{"size": 2, "framework": kind}])
        assert troy.execute_workload(s, w, overlay) is State.DONE
        assert (out / "join").read_text() == "go\n" * 3
        overlay.cancel()
    return w


@pytest.mark.parametrize("kind", ["local"])
def test_use_case_a_same_workload_on_a_framework(kind, tmp_path):
    w = run_use_case_a(kind, tmp_path)
    assert len(w.tasks) == 5 and {t.state for t in w.tasks.values()} == {State.DONE}


def test_use_case_a_two_frameworks_in_one_session(tmp_path):
    """The same workload twice, each time on another framework of one session."""
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        for name in ("first", "second"):
            s.add_framework("local", name=name)
        for name in ("first", "second"):
            out = tmp_path / name
            out.mkdir()
            overlay = troy.Overlay([{"size": 2, "framework": name}])
            w = diamond(out)
            assert troy.execute_workload(s, w, overlay) is State.DONE
            assert (out / "join").read_text() == "go\n" * 3
            assert {u.framework for t in w.tasks.values() for u in t.units} == {name}
            overlay.cancel()


def test_an_ended_overlay_is_refused(troy_session, tmp_path):
    overlay = troy.Overlay([{"size": 1}])
    w = diamond(tmp_path)
    assert troy.execute_workload(troy_session, w, overlay) is State.DONE
    overlay.cancel()
    with pytest.raises(troy.IncorrectState, match="COMPLETED"):
        troy.execute_workload(troy_session, diamond(tmp_path), overlay)


def test_an_empty_workload_is_refused(troy_session):
    with pytest.raises(troy.BadParameter, match="has no tasks"):
        troy.execute_workload(troy_session, troy.Workload())
