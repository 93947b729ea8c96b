"""The guard, tried as an attacker would: with a node's certificate (role ``worker``) a peer
acts only as a worker. The scheduler refuses it every client operation (a client, ``run``,
``run_on_scheduler``, ``broadcast``, ``scatter``, plugins, dumps), another worker refuses it
``run``; no code runs and the control process's files stay untouched. Dask's own data
transfer between workers still works; the control identity keeps every power; a worker of
other versions is refused with one line naming both.

``attack`` is also what a unit runs on a node (tests/hostile/test_worker_role.py)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from pathlib import Path

import pytest

from troy import State
from troy.frameworks.dask import DaskFramework
from troy.frameworks.dask.tls import DaskTLS
from tests.helpers import wait_for
from tests.troy.frameworks.nodes import member, nodes

pytestmark = pytest.mark.slow


def _touch(path: str) -> str:   # what the attacker's code does where it runs
    Path(path).write_text("pwned")
    return "ran"


async def attack(tls: DaskTLS, scheduler: str, worker: str, marker: str) -> dict[str, str]:
    """Every client power tried with ``tls`` (a node's files) against ``scheduler`` and
    another node's ``worker``: op -> "refused: ..." or what it returned. ``marker`` is the
    file the attacker's code would write."""
    from distributed import Client
    from distributed.comm import connect
    from distributed.core import rpc
    from distributed.protocol.pickle import dumps
    sec = tls.security()
    args = sec.get_connection_args("client")
    code = dumps(_touch)
    out: dict[str, str] = {}

    async def one(name: str, call) -> None:  # noqa: ANN001
        try:
            out[name] = f"returned {await asyncio.wait_for(call(), 20)!r}"
        except Exception as err:  # noqa: BLE001 - what the attacker sees
            out[name] = f"refused: {type(err).__name__}: {err}"[:300]

    async def client() -> object:
        c = await Client(scheduler, security=sec, asynchronous=True, timeout="5s",
                         set_as_default=False)
        try:
            r = {"run": await c.run(_touch, marker),
                 "run_on_scheduler": await c.run_on_scheduler(_touch, marker),
                 "submit": await c.submit(_touch, marker, pure=False)}
            return r
        finally:
            await c.close()

    await one("client", client)
    s = rpc(scheduler, connection_args=args)
    w = rpc(worker, connection_args=args)
    try:
        await one("run_function", lambda: s.run_function(function=code, args=(marker,)))
        await one("broadcast", lambda: s.broadcast(
            msg={"op": "run", "function": code, "args": (marker,)}))
        await one("scatter", lambda: s.scatter(data={"x": b"1"}, client="spy",
                                               broadcast=False))
        await one("register_worker_plugin", lambda: s.register_worker_plugin(
            plugin=code, name="spy", idempotent=False))
        await one("register_scheduler_plugin", lambda: s.register_scheduler_plugin(
            plugin=code, name="spy", idempotent=False))
        await one("dump_state", lambda: s.dump_state())
        await one("set_resources", lambda: s.set_resources(worker=worker,
                                                           resources={"cores": 0}))
        await one("retire_workers", lambda: s.retire_workers(workers=[worker]))
        async def register_client() -> object:   # the first step of submitting a task
            comm = await connect(scheduler, **args)
            try:
                await comm.write({"op": "register-client", "client": "spy", "reply": False,
                                  "versions": {}})
                return await comm.read()
            finally:
                comm.abort()
        await one("register-client", register_client)
        await one("worker run", lambda: w.run(function=code, args=(marker,)))
        await one("worker plugin-add", lambda: w.plugin_add(plugin=code, name="spy"))
    finally:
        await s.close_rpc()
        await w.close_rpc()
    return out


@pytest.fixture
def guarded(tmp_path, cluster_ca):  # noqa: ANN001, ANN201
    yield from _guarded(tmp_path, cluster_ca)


def _guarded(tmp_path, cluster_ca, **options):  # noqa: ANN001, ANN003, ANN202
    fw = DaskFramework("guarded", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                       tls=member(tmp_path / "control", cluster_ca, "control"), **options)
    fw.start()
    try:
        with nodes(fw, cluster_ca, tmp_path / "nodes", ["node-1", "node-2"]) as procs:
            yield fw, procs
    finally:
        fw.close()


@pytest.fixture
def guarded_tasks(tmp_path, cluster_ca):  # noqa: ANN001, ANN201
    """As ``guarded``, with Troy's units as Dask tasks (``unit_channel=False``): what the
    guard keeps from them (on the unit channel, tests/troy/frameworks/test_unit_channel.py
    tries the same)."""
    yield from _guarded(tmp_path, cluster_ca, unit_channel=False)


def node_files(tmp_path: Path, name: str = "node-1") -> DaskTLS:
    """The TLS files of the node ``name`` of ``guarded``, as a task on that node finds them."""
    home = tmp_path / "nodes" / name
    return DaskTLS(str(home / "ca.pem"), str(home / f"{name}.pem"), str(home / f"{name}-key.pem"))


def replaced_node(tmp_path: Path, cluster_ca) -> DaskTLS:  # noqa: ANN001
    """The files of node-3, a node whose agent a task of its own killed and replaced: its
    worker certificate, and no worker of it registered (a second worker of a node whose
    agent runs is refused: test_one_worker_a_node_certificate)."""
    return member(tmp_path / "nodes" / "node-3", cluster_ca, "node-3")


@contextlib.asynccontextmanager
async def spy_worker(fw: DaskFramework, tls: DaskTLS,  # noqa: ANN201 - async generator
                     cores: int | None = None, name: str = "spy"):
    """A worker on a node's certificate, as a task on that node can start one (with
    ``cores``: one that can run units, as a pilot)."""
    from distributed import Worker

    from troy.frameworks.dask import guard
    w = await Worker(fw.scheduler_address, security=tls.security(), nthreads=1,
                     name=name, death_timeout=20,
                     resources={"cores": cores} if cores else None,
                     startup_information=guard.startup_information())
    try:
        yield w
    finally:
        await w.close()


def error_chain(err: BaseException | None) -> str:
    """What a worker refused when joining says, causes included."""
    chain = []
    while err is not None:
        chain.append(f"{type(err).__name__}: {err}")
        err = err.__cause__ or err.__context__
    return " <- ".join(chain)


async def until(check, seconds: float = 20.0) -> bool:  # noqa: ANN001
    """Poll ``check()`` every 50 ms until it is true (True) or ``seconds`` passed (False)."""
    for _ in range(int(seconds / 0.05)):
        if check():
            return True
        await asyncio.sleep(0.05)
    return False


def test_a_node_certificate_acts_only_as_a_worker(guarded, tmp_path, cluster_ca,
                                                  caplog) -> None:
    fw, _ = guarded
    node1 = node_files(tmp_path)
    node2 = fw.find_pilot("node-2").native_id
    marker = tmp_path / "marker"
    with caplog.at_level(logging.WARNING, logger="troy.frameworks.dask.guard"):
        out = asyncio.run(attack(node1, fw.scheduler_address, node2, str(marker)))
    assert all(v.startswith("refused") for v in out.values()), json.dumps(out, indent=1)
    assert not marker.exists()
    assert "troy guard" in caplog.text and "run_function" in caplog.text \
        and "node-1 (role worker" in caplog.text
    assert "Traceback" not in caplog.text
    # the cluster goes on: both nodes are still pilots
    assert {fw.find_pilot(n).state for n in ("node-1", "node-2")} == {State.RUNNING}

    # Dask's own transfers between the nodes work: a task on node-2 needs a result on node-1
    c = fw.client
    addr = {n: fw.find_pilot(n).native_id for n in ("node-1", "node-2")}
    a = c.submit(lambda: 20, workers=[addr["node-1"]], pure=False)
    b = c.submit(lambda x: x + 22, a, workers=[addr["node-2"]], pure=False)
    assert b.result(60) == 42

    # the control identity keeps every power
    assert c.run(_touch, str(marker), workers=[addr["node-2"]]) == {addr["node-2"]: "ran"}
    marker.unlink()
    assert c.run_on_scheduler(_touch, str(marker)) == "ran"
    [x] = c.scatter([7], workers=[addr["node-1"]])
    assert c.submit(lambda v: v * 6, x, pure=False).result(60) == 42


def test_a_certificate_without_a_role_is_no_member(guarded, tmp_path, cluster_ca) -> None:
    fw, _ = guarded
    stranger = member(tmp_path / "norole", cluster_ca, "norole", role=None)
    marker = tmp_path / "marker"
    out = asyncio.run(attack(stranger, fw.scheduler_address,
                             fw.find_pilot("node-1").native_id, str(marker)))
    assert all(v.startswith("refused") for v in out.values()), json.dumps(out, indent=1)
    assert not marker.exists()


def test_a_worker_of_other_versions_is_refused_with_both(tmp_path, cluster_ca,
                                                         caplog) -> None:
    from distributed import Worker

    from troy.frameworks.dask import guard
    fw = DaskFramework("versions", sandbox=str(tmp_path / "sb"), adopt_workers=True,
                       tls=member(tmp_path / "control", cluster_ca, "control"))
    fw.start()
    try:
        tls = member(tmp_path / "old", cluster_ca, "node-old")

        async def join() -> str:
            w = Worker(fw.scheduler_address, security=tls.security(), nthreads=1,
                       name="node-old", resources={"cores": 1}, death_timeout=20,
                       startup_information={guard.VERSION_KEY: lambda _: "0.0.1+src.old"})
            try:
                await w
            except Exception as err:  # noqa: BLE001 - what the worker says
                return error_chain(err)
            await w.close()
            return "joined"

        with caplog.at_level(logging.WARNING, logger="troy.frameworks.dask.guard"):
            said = asyncio.run(join())
        assert said != "joined" and "versions differ" in said, said
        lines = [r.getMessage() for r in caplog.records
                 if r.name == "troy.frameworks.dask.guard" and "versions differ" in r.getMessage()]
        assert len(lines) == 1, lines
        ours = guard.versions()
        assert "troy 0.0.1+src.old" in lines[0] and f"troy {ours['troy']}" in lines[0]
        assert f"dask {ours['dask']}" in lines[0] and "node-old" in lines[0]
        assert fw.workers_info() == {} and fw.find_pilot("node-old") is None
    finally:
        fw.close()


if __name__ == "__main__":   # a unit's attack: python -m tests.troy.frameworks.test_guard
    ca, cert, key, scheduler, worker, marker = sys.argv[1:7]
    print(json.dumps(asyncio.run(attack(DaskTLS(ca, cert, key), scheduler, worker, marker))))


def test_a_node_cannot_report_another_nodes_units(guarded, tmp_path, cluster_ca,
                                                 caplog) -> None:
    """A worker's events are its own: a node's certificate cannot end a unit that runs on
    another node by publishing its ``end`` event (the unit goes on running)."""
    from troy import ComputeUnitDescription as CUD
    from troy.frameworks.dask.agent import result_to_wire
    from troy.unit import UnitResult
    fw, _ = guarded
    node3 = replaced_node(tmp_path, cluster_ca)
    victim = fw.find_pilot("node-2")
    u = fw.submit_unit(CUD(executable="/bin/sleep", arguments=["60"]), victim)
    wait_for(lambda: u.state is State.RUNNING, 60, what="the unit running on node-2")
    forged = ["batch", [["end", u.id, victim.native_id,
                         result_to_wire(UnitResult(exit_code=0, start=0.0, end=1.0))]]]

    def refused() -> bool:
        return any("log-event" in r.getMessage() for r in caplog.records
                   if r.name == "troy.frameworks.dask.guard")

    async def forge() -> None:
        async with spy_worker(fw, node3) as w:
            w.log_event(fw.topic, forged)
            await until(refused)

    with caplog.at_level(logging.WARNING, logger="troy.frameworks.dask.guard"):
        asyncio.run(forge())
    assert refused()
    assert u.state is State.RUNNING
    fw.cancel_unit(u)


class _Touched:
    """Unpickling this writes its marker file: what a pickle of an attacker's does where it
    is decoded (pickle calls ``_touch(path)`` while it reads the object)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return _touch, (self.path,)


def test_a_copy_the_scheduler_asked_for_may_be_announced_once_by_that_worker_only() -> None:
    """A retiring worker's data moves to others on the scheduler's ask (Dask's Active
    Memory Manager: ``acquire-replicas``), and the recipient announces its copy with
    ``add-keys``: that worker may, for that key, once; no other worker, nor that one for
    another key (the guard's rule for inputs of tasks running there stays)."""
    from troy.frameworks.dask.guard import Guard

    class Task:
        dependents = ()   # an input of nothing running anywhere

    class Scheduler:
        tasks = {"k": Task(), "other": Task()}
        workers = {"tls://a:1": object(), "tls://b:1": object()}

        def __init__(self) -> None:
            self.sent: list[tuple[str, list[str]]] = []

        def handle_comm(self, comm: object) -> None:
            return None

        def request_acquire_replicas(self, addr: str, keys: list[str], *,
                                     stimulus_id: str) -> None:
            self.sent.append((addr, list(keys)))

    scheduler = Scheduler()
    guard = Guard(scheduler, "scheduler")
    guard.watch_replicas()
    assert not guard._fetched_for("tls://a:1", "k")        # nobody asked yet
    scheduler.request_acquire_replicas("tls://a:1", iter(["k"]), stimulus_id="retire")
    assert scheduler.sent == [("tls://a:1", ["k"])]          # the ask goes out as before
    assert not guard._fetched_for("tls://b:1", "k")        # another worker: no
    assert not guard._fetched_for("tls://a:1", "other")    # another key: no
    assert guard._fetched_for("tls://a:1", "k")            # the asked copy: yes
    assert not guard._fetched_for("tls://a:1", "k")        # once
