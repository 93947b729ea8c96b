"""The files that carry an elastic cluster across a SIGKILL of its process: ``cluster.json``
(where the scheduler serves) and ``stats.json`` (the unit counters of earlier processes)."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest

from elasticslice.errors import ElasticSliceError
from elasticslice.pilots.restart import ClusterFile, StatsLedger


def test_cluster_file_round_trip_is_private(tmp_path: Path) -> None:
    assert ClusterFile.load(tmp_path) is None
    ClusterFile("tls://127.0.0.1:41234", 77, restarts=2).save(tmp_path)
    back = ClusterFile.load(tmp_path)
    assert back is not None and (back.port, back.pid, back.restarts) == (41234, 77, 2)
    assert stat.S_IMODE((tmp_path / "cluster.json").stat().st_mode) == 0o600


@pytest.mark.parametrize("text, says", [
    ("{", "not JSON"), ("[]", "expected a JSON object"),
    ('{"pid": 1}', "not a cluster file ('scheduler')"),
    ('{"scheduler": "tls://127.0.0.1:0", "pid": 1}', "not a cluster file (port 0)"),
    ('{"scheduler": "tls://h:1", "pid": "x"}', "not a cluster file")])
def test_a_damaged_cluster_file_is_one_error_naming_it(tmp_path: Path, text: str,
                                                       says: str) -> None:
    (tmp_path / "cluster.json").write_text(text)
    with pytest.raises(ElasticSliceError) as err:
        ClusterFile.load(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'cluster.json'}: ") and says in str(err.value)
    assert "\n" not in str(err.value)


def test_counters_of_killed_processes_add_up_across_restarts(tmp_path: Path) -> None:
    first = StatsLedger(tmp_path)
    first.open()
    first.save({"units_requeued": 3, "duplicates": 1, "units_lost": 0})  # then SIGKILL
    second = StatsLedger(tmp_path)
    second.open()
    assert second.totals({"units_requeued": 2}) == {"units_requeued": 5, "duplicates": 1,
                                                    "units_lost": 0}
    second.save({"units_requeued": 2})
    third = StatsLedger(tmp_path)
    third.open()
    assert third.totals({}) == {"units_requeued": 5, "duplicates": 1, "units_lost": 0}


def test_a_damaged_stats_file_is_one_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "stats.json").write_text('{"previous": 3}')
    with pytest.raises(ElasticSliceError, match=r"stats.json: 'previous' is not an object"):
        StatsLedger(tmp_path).open()
