"""What only the Dask framework does: its own scheduler, attaching, worker loss, isolation
between frameworks on one scheduler, adopted workers, and seed 003's use cases A and B."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import troy
from troy import ComputeUnitDescription as CUD
from troy import State
from troy.frameworks.dask import DaskFramework
from tests.helpers import processes_of, wait_for
from tests.troy.helpers import diamond
from tests.troy.frameworks.nodes import running_pilot

pytestmark = pytest.mark.slow


def whoami() -> str:
    from distributed import get_worker
    return get_worker().address


def test_own_scheduler_on_localhost_and_clean_close(tmp_path):
    fw = DaskFramework("own one/x", sandbox=str(tmp_path / "sb"))  # any name works
    fw.start()
    try:
        assert fw.scheduler_address.startswith("tcp://127.0.0.1:")
        p = running_pilot(fw, 2)
        assert p.native_id.startswith("tcp://127.0.0.1:")
        info = fw.workers_info()[p.native_id]
        assert info["resources"]["cores"] == 2
        worker_pid = fw._workers[p.id].proc.pid
        u = fw.submit_unit(CUD(function=whoami))
        assert u.wait(30) is State.DONE and u.result.value == p.native_id
    finally:
        fw.close()
    wait_for(lambda: subprocess.run(["ps", "-p", str(worker_pid)],
                                    capture_output=True).returncode != 0, 10,
             what="worker process gone")
    assert p.state is State.CANCELED


def test_attach_with_dask_url(dask_scheduler, tmp_path):
    url = dask_scheduler.replace("tcp://", "dask://")
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        fw = s.add_framework("dask", scheduler_address=url)
        assert fw.scheduler_address == dask_scheduler
        running_pilot(fw, 1)
        u = fw.submit_unit(CUD(executable="/bin/true"))
        assert u.wait(30) is State.DONE


def test_unreachable_scheduler_is_one_clear_error(tmp_path):
    fw = DaskFramework("nowhere", scheduler_address="dask://127.0.0.1:9", connect_timeout=1,
                       sandbox=str(tmp_path))
    with pytest.raises(troy.NoSuccess, match="cannot reach Dask scheduler tcp://127.0.0.1:9"):
        fw.start()


def test_frameworks_sharing_a_scheduler_keep_their_units(dask_scheduler, tmp_path):
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        a = s.add_framework("dask", name="a", scheduler_address=dask_scheduler)
        b = s.add_framework("dask", name="b", scheduler_address=dask_scheduler)
        pa, pb = running_pilot(a, 2), running_pilot(b, 2)
        ua = [a.submit_unit(CUD(function=whoami)) for _ in range(10)]
        ub = [b.submit_unit(CUD(function=whoami)) for _ in range(10)]
        for u in ua + ub:
            assert u.wait(30) is State.DONE
        assert {u.result.value for u in ua} == {pa.native_id}
        assert {u.result.value for u in ub} == {pb.native_id}


def gated_unit_on_one_of_two(fw: DaskFramework, tmp_path):  # noqa: ANN201
    """A unit running on a 1-core pilot (it writes ``run`` to ``runs`` each time it starts,
    then waits for ``gate``) and a second, idle pilot: ``(first, second, unit, gate, runs)``."""
    first = running_pilot(fw, 1)
    gate, runs = tmp_path / "gate", tmp_path / "runs"
    u = fw.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"echo run >> {runs}; while [ ! -e {gate} ]; do sleep 0.02; done"]))
    wait_for(lambda: u.state is State.RUNNING and runs.exists(), 30, what="first run")
    return first, running_pilot(fw, 1), u, gate, runs


def test_worker_that_dies_fails_its_pilot_and_units_requeue(dask_scheduler, tmp_path):
    fw = DaskFramework("dies", scheduler_address=dask_scheduler, sandbox=str(tmp_path))
    fw.start()
    try:
        doomed, spare, u, gate, runs = gated_unit_on_one_of_two(fw, tmp_path)
        os.kill(fw._workers[doomed.id].proc.pid, signal.SIGKILL)
        wait_for(lambda: doomed.state is State.FAILED, 30, what="pilot FAILED")
        wait_for(lambda: u.state is State.RUNNING and u.pilot == spare.id, 30,
                 what="unit rerun on the spare pilot")
        gate.touch()
        assert u.wait(30) is State.DONE
    finally:
        fw.close()


def test_a_canceled_pilots_unit_runs_once_more_not_twice_when_its_cancel_comes_late(
        dask_scheduler, tmp_path, monkeypatch):
    """CI, test_contract's cancel: a unit ran three times where two were due. The moved
    attempt's Dask task was canceled on the client's batched stream, and the canceled
    pilot's worker left the scheduler before that message came: Dask, which still had the
    old task as wanted, ran it on the other pilot too. Here the client's stream stalls for
    two seconds; the framework lets go of the old task at the scheduler itself, before the
    worker goes."""
    fw = DaskFramework("late-cancel", scheduler_address=dask_scheduler, sandbox=str(tmp_path))
    fw.start()
    try:
        first, second, u, gate, runs = gated_unit_on_one_of_two(fw, tmp_path)
        send = fw.client._send_to_scheduler

        def late(msg):   # the client's stream stalls (its loop starved under load): the
            fw.client.loop.call_later(2.0, send, msg)  # worker's leaving comes first

        monkeypatch.setattr(fw.client, "_send_to_scheduler", late)
        monkeypatch.setattr(fw, "_kill_later", lambda *a: None)  # the kill is slow as well
        first.cancel()
        wait_for(lambda: u.state is State.RUNNING and u.pilot == second.id, 30,
                 what="the second run, on the other pilot")
        wait_for(lambda: runs.read_text().count("run") >= 2, 30, what="its process")
        gate.touch()
        assert u.wait(30) is State.DONE and u.pilot == second.id
        time.sleep(3)   # what the stalled stream still carries has come
        assert runs.read_text() == "run\nrun\n"
    finally:
        fw.close()


def test_adopted_workers_become_pilots(dask_scheduler, tmp_path):
    """A worker started outside Troy (as on an elastic slice node) with a cores resource.
    Broke once: the worker's info was read from ``client.scheduler_info()``, a cache that a
    periodic refresh without workers can overwrite right after the fetch, so the new worker
    looked absent and was never adopted (now ``workers_info()`` asks the scheduler). Also:
    another Troy framework's workers (ours, or leaving) are never adopted."""
    owner = DaskFramework("owner", scheduler_address=dask_scheduler,
                          sandbox=str(tmp_path / "owner"))
    owner.start()
    running_pilot(owner, 1)  # there before the adopter starts: seen by its first scan
    fw = DaskFramework("adopt", scheduler_address=dask_scheduler, adopt_workers=True,
                       sandbox=str(tmp_path))
    fw.start()
    running_pilot(owner, 1)  # joins while the adopter listens: its event comes first
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", dask_scheduler, "--nthreads", "2",
         "--resources", "cores=3", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pilots = wait_for(lambda: [p for p in fw.list_pilots() if p.state is State.RUNNING],
                          30, what="adopted pilot")
        assert len(pilots) == 1 and pilots[0].size == 3
        owner.close()  # (an adopter's units need only cores: they could run on its workers)
        wait_for(lambda: len(fw.workers_info()) == 1, 30,
                 what="owner's workers gone")
        u = fw.submit_unit(CUD(function=whoami))
        assert u.wait(30) is State.DONE and u.result.value == pilots[0].native_id
        assert fw.list_pilots() == pilots
    finally:
        fw.close()
        owner.close()
        proc.terminate()
        proc.wait(10)


def test_use_case_a_same_workload_on_dask(dask_scheduler, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        s.add_framework("dask", scheduler_address=dask_scheduler)
        w = diamond(out)
        overlay = troy.Overlay([{"size": 2, "framework": "dask"}])
        assert troy.execute_workload(s, w, overlay) is State.DONE
        overlay.cancel()
    assert (out / "join").read_text() == "go\n" * 3
    assert {u.framework for t in w.tasks.values() for u in t.units} == {"dask"}


def test_use_case_b_wide_unit_on_big_dask_pilot(dask_scheduler, tmp_path):
    """Seed 003 (B): 32 one-core local pilots ("small"), one 32-core Dask pilot ("big"),
    first_fit: the 32-core unit runs on big, the one-core units on the small pilots."""
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        small = s.add_framework("local", name="small", sandbox=str(tmp_path / "small"))
        big = s.add_framework("dask", name="big", scheduler_address=dask_scheduler,
                              threads_per_pilot=2, sandbox=str(tmp_path / "big"))
        for _ in range(32):
            small.submit_pilot(troy.PilotDescription(size=1))
        bp = running_pilot(big, 32)
        us = s.unit_service(scheduler="first_fit")
        gate = tmp_path / "gate"
        wide = us.submit_unit(CUD(executable="/bin/sh", cores=32, arguments=[
            "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]))
        wait_for(lambda: wide.state is State.RUNNING, 30, what="wide unit running")
        narrow = [us.submit_unit(CUD(executable="/bin/true")) for _ in range(8)]
        for u in narrow:
            assert u.wait(30) is State.DONE
        gate.touch()
        us.wait_units()
        assert wide.state is State.DONE
        assert wide.framework == "big" and wide.pilot == bp.id
        assert {u.framework for u in narrow} == {"small"}


def test_backlog_lets_units_queue_in_dask_with_exact_free_cores(dask_scheduler, tmp_path):
    """Broke: a prefetch made free_cores lie (a busy pilot read as free). Units beyond the
    free cores now queue in the pilot's backlog; free_cores counts them as taken."""
    fw = DaskFramework("prefetch", scheduler_address=dask_scheduler, prefetch=2,
                       sandbox=str(tmp_path))
    fw.start()
    try:
        p = running_pilot(fw, 1)
        gate = tmp_path / "gate"
        seen = [(p.free_cores, p.room)]
        units = []
        for _ in range(3):
            units.append(fw.submit_unit(CUD(executable="/bin/sh", arguments=[
                "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])))
            seen.append((p.free_cores, p.room))
        assert seen == [(1, 3), (0, 2), (0, 1), (0, 0)]  # size 1 + backlog 2
        gate.touch()
        assert [u.wait(30) for u in units] == [State.DONE] * 3
        wait_for(lambda: p.free_cores == 1, 10, what="cores back")
    finally:
        fw.close()
    with pytest.raises(troy.BadParameter, match="prefetch"):
        DaskFramework("bad", prefetch=-1)


def test_backfill_hands_units_to_a_busy_dask_pilot_up_to_its_backlog(dask_scheduler, tmp_path):
    """Broke (slow): backfill handed a unit over only when a pilot had free cores, one Dask
    round trip per unit. Now a busy pilot's backlog takes units (free_cores stays exact)."""
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        fw = s.add_framework("dask", name="d", scheduler_address=dask_scheduler, prefetch=2,
                             sandbox=str(tmp_path / "sb"))
        p = running_pilot(fw, 1)
        us = s.unit_service(scheduler="backfill")
        gate = tmp_path / "gate"
        block = CUD(executable="/bin/sh", arguments=[
            "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])
        units = us.submit_units([block] * 4)
        wait_for(lambda: [u.framework for u in units] == ["d", "d", "d", None], 30,
                 what="three units handed to the framework, the fourth kept")
        assert p.free_cores == 0 and p.room == 0 and units[3].state is State.PENDING
        gate.touch()
        assert us.wait_units(timeout=30) == [State.DONE] * 4


def test_a_unit_canceled_while_its_task_is_handed_to_dask_leaves_no_process(
        dask_scheduler, tmp_path):
    """The cancel comes while the framework hands the unit's task to Dask (``client.map``
    returned, the task already started on the worker, its future not yet the unit's): the
    dispatch only cancelled the future, and Dask never interrupts a task that runs, so the
    process of the canceled unit ran on (a gated one for ever, on its core)."""
    marker = str(tmp_path / "never")
    with troy.Session(store_path=tmp_path / "s.sqlite") as s:
        fw = s.add_framework("dask", scheduler_address=dask_scheduler,
                             sandbox=str(tmp_path / "sb"), unit_channel=False)
        a = running_pilot(fw, 1)
        units: dict[str, troy.ComputeUnit] = {}
        dask_map = fw.client.map

        def map_then_cancel(function, descriptions, ids, *rest, **options):  # noqa: ANN001
            futures = dask_map(function, descriptions, ids, *rest, **options)
            wait_for(lambda: processes_of(marker), 60, what="the unit's process started")
            wait_for(lambda: set(ids) <= set(units), 60, what="the units submitted")
            for uid in ids:
                units[uid].cancel()
            return futures

        fw.client.map = map_then_cancel
        u = fw.submit_unit(CUD(executable="/bin/sh", arguments=[
            "-c", f"while [ ! -e {marker} ]; do sleep 0.02; done"]), pilot=a)
        units[u.id] = u
        wait_for(lambda: u.state is State.CANCELED, 60, what="the unit canceled")
        wait_for(lambda: not processes_of(marker), 60, what="its process killed")
        fw.client.map = dask_map
        v = fw.submit_unit(CUD(executable="/bin/true"), pilot=a)   # its core is free again
        assert v.wait(60) is State.DONE
        fw.cancel_pilot(a.id)
    assert not processes_of(marker)
