"""Regressions of pilots lost while their worker lives on, each named after what broke.

A node taken without notice (test_elastic's forced revocation, under load): its pilot was
lost (FAILED, its units requeued, its events ignored from then on) but its worker served on
until CloudLab's kill and the retirement we asked for took effect, and Dask still had it as
a worker of ours. It stole queued units from busy pilots and took requeued ones; they ran
there, their ``run`` and ``end`` events were ignored, and their futures ended with no result:
FAILED "unit result lost" (or "dask future lost" once the worker went with the result).
Now a pilot lost or cancelled is withdrawn at the scheduler first: Dask sends it nothing
more, and what it held already is requeued."""
from __future__ import annotations

from pathlib import Path

import pytest

from elasticslice.rpc.pki import make_ca
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask import DaskFramework
from tests.troy.frameworks.nodes import member, nodes

pytestmark = pytest.mark.slow

WAIT = 120


@pytest.fixture(scope="module")
def ca() -> tuple[bytes, bytes]:
    return make_ca("troy lost pilot test CA")


@pytest.fixture
def fw(tmp_path: Path, ca: tuple[bytes, bytes]):  # noqa: ANN201
    f = DaskFramework("elastic", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                      tls=member(tmp_path / "control", ca, "control"))
    f.start()
    yield f
    f.close()


def test_a_lost_pilot_whose_worker_lives_on_gets_no_unit_and_none_fails(
        fw: DaskFramework, ca: tuple[bytes, bytes], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the machine outlives its pilot: the retirement we ask for has not taken effect yet
    monkeypatch.setattr(fw, "_retire", lambda addr: None)
    with nodes(fw, ca, tmp_path, ["node-a", "node-b"]):
        pa, pb = fw.find_pilot("node-a"), fw.find_pilot("node-b")
        assert fw.lose_pilot(pb, "node reclaimed") == [] and pb.state is State.FAILED
        # more units than node-a has cores: Dask would give node-b's idle worker some
        units = [fw.submit_unit(CUD(executable="/bin/sleep", arguments=["0.5"]))
                 for _ in range(8)]
        ends = [(u.wait(WAIT), u.pilot, u.result.error if u.result else None) for u in units]
        assert ends == [(State.DONE, pa.id, None)] * len(units), ends
        assert fw.unit_stats().lost == 0
