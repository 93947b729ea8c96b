"""The pilot channels tried as a hostile node would (issue 34): with its node's own worker
certificate, or as a task on a node whose agent it replaced (node-3), a node registers a
worker with a framework's tag or a second worker on its certificate, forges the ``end`` of
another node's unit, its ``task-erred``, ``task-finished`` and ``add-keys``, sends pickles
in a refused op, an allowed op and its worker stream, and answers the control process with
pickles of its own. None of it goes further than the node: see docs/troy-dask.md, "Roles".
The guard's fixtures and helpers are those of tests/troy/frameworks/test_guard.py."""
from __future__ import annotations

import asyncio
import logging
import os

import pytest

from troy import State
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import stop
from tests.troy.frameworks.test_guard import (  # noqa: F401 - guarded: a fixture
    _touch, _Touched, error_chain, guarded, guarded_tasks, node_files, replaced_node,
    spy_worker, until)

pytestmark = pytest.mark.slow


async def send_raw(address: str, args: dict, msg: dict) -> str:
    """``msg`` written raw to the scheduler at ``address`` (``args``: the connection's TLS),
    and what comes back, as the attacker sees it."""
    from distributed.comm import connect
    comm = await connect(address, **args)
    try:
        await comm.write(msg)
        return repr(await asyncio.wait_for(comm.read(), 20))
    except Exception as err:  # noqa: BLE001 - what the attacker sees
        return f"refused: {type(err).__name__}"
    finally:
        comm.abort()


def test_a_node_cannot_end_or_claim_another_nodes_unit_under_its_own_address(
        guarded, tmp_path, cluster_ca, caplog) -> None:
    """A unit's events count only from the worker the scheduler runs its Dask task on: a
    node's own worker (a task replaced its agent: its certificate, its address) publishing
    ``run`` and ``end`` for a unit running on node-2, with that unit's key (keys are
    sequential, the topic is no secret to nodes) or without one, changes nothing: the unit
    goes on running, and ends with its own result."""
    from troy import ComputeUnitDescription as CUD
    from troy.frameworks.dask.agent import result_to_wire
    from troy.unit import UnitResult
    fw, _ = guarded
    node3 = replaced_node(tmp_path, cluster_ca)
    victim = fw.find_pilot("node-2")
    gate = tmp_path / "gate"
    u = fw.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 3"]), victim)
    wait_for(lambda: u.state is State.RUNNING, 60, what="the unit running on node-2")
    key = fw._records[u.id].key
    forged = result_to_wire(UnitResult(exit_code=0, value="forged", start=0.0, end=1.0))

    def dropped() -> list[str]:   # the first line a peer is a WARNING, the others DEBUG
        return [r.getMessage() for r in caplog.records
                if r.name == "troy.frameworks.dask.guard" and "dropped" in r.getMessage()]

    async def forge() -> None:
        async with spy_worker(fw, node3) as w:
            for event in (["run", u.id, w.address, 0.0, key],
                          ["end", u.id, w.address, forged, key],
                          ["end", u.id, w.address, forged]):
                w.log_event(fw.topic, ["batch", [event]])
            await until(lambda: len(dropped()) == 3)
            await asyncio.sleep(1.0)   # what the framework would do with them, it did

    with caplog.at_level(logging.DEBUG, logger="troy.frameworks.dask.guard"):
        asyncio.run(forge())
    assert u.state is State.RUNNING and u.pilot == victim.id, (u.state, u.pilot)
    lines = dropped()
    assert len(lines) == 3 and all("node-3 (role worker" in x for x in lines), lines
    assert sum("not running there" in x for x in lines) == 2
    assert "without its task" in lines[2]
    gate.touch()
    assert u.wait(60) is State.FAILED and u.result.exit_code == 3, u.result


def test_a_node_cannot_finish_fail_or_hold_another_nodes_task(guarded_tasks, tmp_path,
                                                              cluster_ca, caplog) -> None:
    """Dask takes a task's outcome whose run_id matches from any worker, and ``add-keys``
    for any key in memory. A node whose agent a task replaced sends, for a unit's task on
    node-2 (its key and run_id, read here as an attacker would guess them):
    ``task-finished`` (it would hold the result others fetch), ``task-erred`` with a pickled
    exception (which the control process's client would decode) and ``add-keys``. None of
    them counts: the unit runs on, ends with its own exit status, no marker is written, and
    no worker but node-2 ever held the task."""
    import pickle

    from distributed.protocol.serialize import Serialize

    from troy import ComputeUnitDescription as CUD
    fw, _ = guarded_tasks
    node3 = replaced_node(tmp_path, cluster_ca)
    victim = fw.find_pilot("node-2")
    gate, marker = tmp_path / "gate", tmp_path / "marker"
    u = fw.submit_unit(CUD(executable="/bin/sh", arguments=[
        "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 3"]), victim)
    wait_for(lambda: u.state is State.RUNNING, 60, what="the unit running on node-2")
    key = fw._records[u.id].key
    run_id = fw.on_scheduler(lambda s: s.tasks[key].run_id)

    def dropped() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "troy.frameworks.dask.guard" and "dropped" in r.getMessage()]

    async def forge() -> None:
        common = {"key": key, "run_id": run_id, "thread": None, "startstops": [],
                  "stimulus_id": "spy"}
        async with spy_worker(fw, node3) as w:
            w.batched_stream.send({"op": "task-erred", "status": "error", **common,
                                   "exception": Serialize(_Touched(str(marker))),
                                   "traceback": None, "exception_text": "forged",
                                   "traceback_text": ""})
            w.batched_stream.send({"op": "task-finished", "status": "OK", **common,
                                   "nbytes": 8, "type": pickle.dumps(int),
                                   "typename": "int", "metadata": {}})
            w.batched_stream.send({"op": "add-keys", "keys": [key], "stimulus_id": "spy"})
            await until(lambda: len(dropped()) == 3)
            await asyncio.sleep(1.0)   # what the scheduler would do with them, it did

    with caplog.at_level(logging.DEBUG, logger="troy.frameworks.dask.guard"):
        asyncio.run(forge())
    assert not marker.exists()
    assert u.state is State.RUNNING and u.pilot == victim.id, (u.state, u.pilot)
    held = fw.on_scheduler(lambda s: (
        s.tasks[key].state, getattr(s.tasks[key].processing_on, "address", None),
        [w.address for w in s.tasks[key].who_has or ()]))
    assert held == ("processing", victim.native_id, []), held
    lines = dropped()
    assert len(lines) == 3 and all("node-3 (role worker" in x for x in lines), lines
    assert [op in x for op, x in zip(("task-erred", "task-finished", "add-keys"), lines)] \
        == [True] * 3, lines
    gate.touch()
    assert u.wait(60) is State.FAILED and u.result.exit_code == 3, u.result
    # a task Troy let go of on its unit's end event (its worker's task-finished comes
    # after) is no forgery: Dask tells that worker to free it, with no line of the guard's
    # (broke: a WARNING for every node of every run)
    assert fw.on_scheduler(lambda s: s._troy_guard._foreign_outcome(
        victim.native_id, key)) is False


def test_one_worker_a_node_certificate(guarded, tmp_path, caplog) -> None:
    """A task on node-1, with the node's own certificate, starts a second worker while the
    node's agent serves: refused with one line naming both; node-1 stays one pilot. Once a
    node's worker is gone, its certificate joins again (a rebooted node's agent)."""
    from distributed import Worker

    from troy.frameworks.dask import guard
    fw, procs = guarded
    node1 = node_files(tmp_path)
    agent = fw.find_pilot("node-1").native_id

    async def join() -> str:
        w = Worker(fw.scheduler_address, security=node1.security(), nthreads=1,
                   name="node-1-second", resources={"cores": 1}, death_timeout=20,
                   startup_information=guard.startup_information())
        try:
            await w
        except Exception as err:  # noqa: BLE001 - what the worker says
            return "refused: " + error_chain(err)
        await w.close()
        return "joined"

    with caplog.at_level(logging.WARNING, logger="troy.frameworks.dask.guard"):
        said = asyncio.run(join())
    assert said.startswith("refused") and "one worker a node certificate" in said, said
    lines = [r.getMessage() for r in caplog.records if r.name == "troy.frameworks.dask.guard"
             and "one worker a node certificate" in r.getMessage()]
    assert len(lines) == 1 and agent in lines[0] and "node-1 (role worker" in lines[0], lines
    assert [i.get("name") for i in fw.workers_info().values()].count("node-1-second") == 0
    assert fw.find_pilot("node-1").state is State.RUNNING

    stop(procs["node-1"])   # node-1's agent goes (as at a reboot): its certificate may join again
    wait_for(lambda: agent not in fw.workers_info(), 60, what="node-1's worker gone")
    assert asyncio.run(join()) == "joined"


def test_a_node_cannot_register_a_worker_with_a_framework_s_tag(guarded, tmp_path,
                                                                 caplog) -> None:
    """A worker's resources at registration are its cores only: with a node's certificate,
    a worker that says it has the framework's tag (the topic is no secret to nodes) or a
    million cores is refused with one line, and gets no unit."""
    from distributed import Worker

    from troy.frameworks.dask import guard
    fw, _ = guarded
    node1 = node_files(tmp_path)

    async def join(resources: dict) -> str:
        w = Worker(fw.scheduler_address, security=node1.security(), nthreads=1,
                   name="node-1-greedy", resources=resources, death_timeout=20,
                   startup_information=guard.startup_information())
        try:
            await w
        except Exception as err:  # noqa: BLE001 - what the worker says
            return f"refused: {err}"
        await w.close()
        return "joined"

    with caplog.at_level(logging.WARNING, logger="troy.frameworks.dask.guard"):
        tagged = asyncio.run(join({"cores": 1, fw.topic: 10 ** 6, f"{fw.topic}-long": 10 ** 6}))
        huge = asyncio.run(join({"cores": 10 ** 9}))
    assert tagged.startswith("refused") and huge.startswith("refused"), (tagged, huge)
    lines = [r.getMessage() for r in caplog.records if r.name == "troy.frameworks.dask.guard"
             and "'register-worker' with resources" in r.getMessage()]
    assert len(lines) == 2 and all("node-1 (role worker" in x for x in lines), lines
    assert fw.topic in lines[0]
    assert all(info.get("name") != "node-1-greedy" for info in fw.workers_info().values())
    # a node's own agent (cores only) is a pilot as before
    assert fw.find_pilot("node-1").state is State.RUNNING


def test_a_node_s_pickle_is_never_decoded_in_the_control_process(guarded, tmp_path,
                                                                  cluster_ca, caplog) -> None:
    """Dask's decoder unpickles every ``__Pickled__`` field while it reads a message, before
    any handler (or a guard that checks decoded messages) sees it. With a node's certificate:
    a pickle in a refused op, in an allowed op and on the node's worker stream; none of them
    is decoded in the scheduler's process (the control process: the CloudLab key, the
    cluster CA), each closes the node's connection with one log line, and the pilots go
    on."""
    from distributed.protocol.serialize import ToPickle

    from troy import ComputeUnitDescription as CUD
    fw, _ = guarded
    node1 = node_files(tmp_path)
    args = node1.security().get_connection_args("client")
    markers = {name: tmp_path / f"marker-{name}" for name in ("rpc", "allowed", "stream")}

    async def send(msg: dict) -> str:
        return await send_raw(fw.scheduler_address, args, msg)

    async def stream() -> None:
        async with spy_worker(fw, replaced_node(tmp_path, cluster_ca)) as w:
            w.batched_stream.send({"op": "log-event", "topic": "spy",
                                   "msg": ToPickle(_Touched(str(markers["stream"])))})
            await until(lambda: "pickle" in caplog.text and "stream" in caplog.text, 10)

    async def attacks() -> dict[str, str]:
        return {"rpc": await send({"op": "run_function",
                                   "x": ToPickle(_Touched(str(markers["rpc"])))}),
                "allowed": await send({"op": "who_has",
                                       "keys": ToPickle(_Touched(str(markers["allowed"])))})}

    with caplog.at_level(logging.WARNING, logger="troy.frameworks.dask.guard"):
        out = asyncio.run(attacks())
        asyncio.run(stream())
    assert [name for name, marker in markers.items() if marker.exists()] == []
    assert all(v.startswith("refused") for v in out.values()), out
    lines = [r.getMessage() for r in caplog.records if r.name == "troy.frameworks.dask.guard"]
    assert len([x for x in lines if "a pickle" in x and "(role worker" in x]) == 3, lines
    assert "Traceback" not in caplog.text
    # the pilots go on, and the control identity's own pickles still work
    u = fw.submit_unit(CUD(executable="/bin/true"), fw.find_pilot("node-1"))
    assert u.wait(60) is State.DONE
    assert fw.client.run_on_scheduler(_touch, str(tmp_path / "control-ran")) == "ran"


def test_troy_never_decodes_what_a_node_sent(guarded_tasks, tmp_path, cluster_ca,
                                             caplog) -> None:
    """A unit's result is data: nothing a node made is decoded in Troy's process (the
    control process). A node running a unit of its own (a pilot) sends for that unit's task
    a ``task-erred`` with a pickled exception (Dask would hand it to Troy's client, which
    decodes it on arrival), an ``end`` event with a serialized object, and answers the
    framework's call on it (setting its tags, which ``client.run`` did) with a pickled
    result. No marker is written; the unit fails with the node's text; the framework's call
    gets a line."""
    from distributed.protocol.serialize import Serialize

    from troy import ComputeUnitDescription as CUD
    fw, _ = guarded_tasks
    markers = {name: tmp_path / f"marker-{name}" for name in ("erred", "event", "run")}
    gate = tmp_path / "gate"
    out: dict[str, object] = {}

    ran: list[str] = []

    def evil(w):  # noqa: ANN001, ANN202 - the node's worker's "run": does it, answers a pickle
        run = w.handlers["run"]

        async def evil_run(comm, function, args=(), wait=True,  # noqa: ANN001, ANN202
                           kwargs=None):  # noqa: ANN001
            await run(comm, function, args=args, wait=wait, kwargs=kwargs)
            ran.append("run")
            return {"status": "OK", "result": Serialize(_Touched(str(markers["run"])))}
        return evil_run

    async def scenario() -> None:
        async with spy_worker(fw, replaced_node(tmp_path, cluster_ca), cores=2,
                              name="node-3") as w:
            w.handlers["run"] = evil(w)
            await until(lambda: fw.find_pilot("node-3") is not None)
            pilot = fw.find_pilot("node-3")
            loop = asyncio.get_running_loop()
            out["grant"] = await loop.run_in_executor(
                None, fw._grant, w.address, {fw.topic: 1})
            u = fw.submit_unit(CUD(executable="/bin/sh", arguments=[
                "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]), pilot)
            await until(lambda: u.id in fw._records and fw._records[u.id].key in w.state.tasks)
            key = fw._records[u.id].key
            run_id = w.state.tasks[key].run_id
            w.batched_stream.send({"op": "task-erred", "status": "error", "key": key,
                                   "run_id": run_id, "thread": None, "startstops": [],
                                   "stimulus_id": "spy",
                                   "exception": Serialize(_Touched(str(markers["erred"]))),
                                   "traceback": None, "exception_text": "forged failure",
                                   "traceback_text": ""})
            await until(lambda: u.state is State.FAILED)
            out["unit"] = (u.state, u.result.error)
            w.batched_stream.send({"op": "log-event", "topic": fw.topic, "msg": [
                "batch", [["end", u.id, w.address,
                           Serialize(_Touched(str(markers["event"]))), key]]]})
            await until(lambda: "serialized object" in caplog.text)
            gate.touch()

    try:
        with caplog.at_level(logging.WARNING, logger="troy.frameworks.dask.guard"):
            asyncio.run(scenario())
    finally:
        gate.touch()   # the unit's process ends, whatever happened
    assert [name for name, marker in markers.items() if marker.exists()] == []
    state, error = out["unit"]
    assert state is State.FAILED and "NodeError" in error and "forged failure" in error, error
    assert out["grant"] is True and ran   # its tags were set; its answer not decoded
    assert "'log-event' with a serialized object" in caplog.text
    assert "Traceback" not in caplog.text


@pytest.fixture
def guarded_apart(tmp_path, cluster_ca):  # noqa: ANN001, ANN201
    """As ``guarded``, with the scheduler in a process of its own (``elasticslice run``'s)."""
    from tests.troy.frameworks.nodes import member, nodes
    from troy.frameworks.dask import DaskFramework
    fw = DaskFramework("apart", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                       scheduler_process=True,
                       tls=member(tmp_path / "control", cluster_ca, "control"))
    fw.start()
    try:
        with nodes(fw, cluster_ca, tmp_path / "nodes", ["node-1"]) as procs:
            yield fw, procs
    finally:
        fw.close()


def test_a_node_s_pickle_is_never_decoded_by_a_scheduler_in_its_own_process(
        guarded_apart, tmp_path) -> None:
    """The scheduler `elasticslice run` starts in a process of its own has the same guard:
    with a node's certificate, a pickle in a refused op and in an allowed op is never
    decoded there (no marker), the node's connection is closed, and the pilot goes on."""
    from distributed.protocol.serialize import ToPickle

    from troy import ComputeUnitDescription as CUD
    fw, _ = guarded_apart
    assert fw.scheduler_pid not in (None, os.getpid())
    args = node_files(tmp_path).security().get_connection_args("client")
    markers = {name: tmp_path / f"marker-{name}" for name in ("rpc", "allowed")}

    async def send(msg: dict) -> str:
        return await send_raw(fw.scheduler_address, args, msg)

    async def attacks() -> dict[str, str]:
        return {"rpc": await send({"op": "run_function",
                                   "x": ToPickle(_Touched(str(markers["rpc"])))}),
                "allowed": await send({"op": "who_has",
                                       "keys": ToPickle(_Touched(str(markers["allowed"])))})}

    out = asyncio.run(attacks())
    assert [name for name, marker in markers.items() if marker.exists()] == []
    assert all(v.startswith("refused") for v in out.values()), out
    u = fw.submit_unit(CUD(executable="/bin/true"), fw.find_pilot("node-1"))
    assert u.wait(60) is State.DONE


def test_a_node_cannot_announce_a_copy_another_node_was_asked_to_make(
        guarded_tasks, tmp_path, cluster_ca, caplog) -> None:
    """A retiring worker's data moves on the scheduler's ask (``acquire-replicas``), and
    the guard lets the worker asked announce its copy (``add-keys``). A node whose agent a
    task replaced (node-3) announces, with its own certificate, a copy the scheduler asked
    node-2 to make: dropped; the scheduler never thinks node-3 holds it."""
    fw, _ = guarded_tasks
    node3 = replaced_node(tmp_path, cluster_ca)
    holder = fw.find_pilot("node-1").native_id
    asked = fw.find_pilot("node-2").native_id
    future = fw.client.submit(lambda: 42, pure=False, workers=[holder])
    assert future.result(60) == 42
    key = future.key
    # node-2 was asked for a copy and has not announced it yet: what the guard notes when
    # the scheduler asks (the guard's own test watches that call; here the ask is noted
    # without sending it, so node-2's announcement cannot come first)
    fw.on_scheduler(lambda s: s._troy_guard.asked.setdefault(asked, set()).add(key))

    def dropped() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "troy.frameworks.dask.guard" and "dropped" in r.getMessage()]

    async def forge() -> str:
        async with spy_worker(fw, node3) as w:
            w.batched_stream.send({"op": "add-keys", "keys": [key], "stimulus_id": "spy"})
            await until(lambda: dropped())
            await asyncio.sleep(0.5)   # what the scheduler would do with it, it did
            return w.address

    with caplog.at_level(logging.DEBUG, logger="troy.frameworks.dask.guard"):
        spy = asyncio.run(forge())
    lines = dropped()
    assert len(lines) == 1 and "node-3 (role worker" in lines[0] and "add-keys" in lines[0]
    holders = fw.on_scheduler(lambda s: {w.address for w in s.tasks[key].who_has or ()})
    assert spy not in holders and holder in holders, holders
    # node-2's ask stands: the spy's announcement did not use it up
    assert fw.on_scheduler(lambda s: key in s._troy_guard.asked.get(asked, ()))
    del future
