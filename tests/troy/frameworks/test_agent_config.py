"""The Dask settings of the framework's own processes (node agents, workers, scheduler):
quieter monitoring than Dask's defaults, unless the user's Dask configuration says
otherwise (their ``DASK_*`` variables and YAML files always win)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

SHOW = ("import json, dask; from troy.frameworks.dask.agent import apply_agent_defaults; "
        "chosen = apply_agent_defaults(); import distributed; "
        "print(json.dumps([chosen, dask.config.get('distributed.admin.tick.interval'), "
        "dask.config.get('distributed.admin.system-monitor.interval'), "
        "dask.config.get('distributed.worker.profile.interval')]))")


def agent_config(tmp_path, **env: str) -> list:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    environ.update(env, DASK_CONFIG=str(tmp_path))   # no YAML of this machine's user
    out = subprocess.run([sys.executable, "-c", SHOW], env=environ, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_agents_sample_their_loop_once_a_second_and_the_machine_every_2_s(tmp_path):
    chosen, tick, monitor, profile = agent_config(tmp_path)
    assert (tick, monitor, profile) == ("1s", "2s", "100ms")  # Dask's own: 20ms, 500ms, 10ms
    assert set(chosen) == {"distributed.admin.tick.interval",
                           "distributed.admin.system-monitor.interval",
                           "distributed.worker.profile.interval"}


def test_the_users_dask_variables_and_yaml_win(tmp_path):
    chosen, tick, monitor, profile = agent_config(
        tmp_path, DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL="50ms")
    assert (tick, monitor, profile) == ("50ms", "2s", "100ms") and list(chosen) == [
        "distributed.admin.system-monitor.interval", "distributed.worker.profile.interval"]
    (tmp_path / "dask.yaml").write_text(
        "distributed:\n  admin:\n    system-monitor:\n      interval: 750ms\n")
    chosen, tick, monitor, profile = agent_config(tmp_path)
    assert (tick, monitor) == ("1s", "750ms")


STREAMS = ("import json; from troy.frameworks.dask import DaskFramework\n"
           "fw = DaskFramework('s'); fw.start()\n"
           "ours = [(b.interval, hasattr(b, '_troy_eager'))\n"
           "        for b in fw.on_scheduler(lambda s: list(s.client_comms.values()))]\n"
           "c = fw.client.scheduler_comm\n"
           "print(json.dumps([[c.interval, hasattr(c, '_troy_eager')], ours])); fw.close()")


def stream_intervals(tmp_path, value: str | None) -> list:
    environ = {k: v for k, v in os.environ.items() if k != "TROY_DASK_STREAM_INTERVAL"}
    if value is not None:
        environ["TROY_DASK_STREAM_INTERVAL"] = value
    out = subprocess.run([sys.executable, "-c", STREAMS], env=environ, capture_output=True,
                         text=True, timeout=120, check=True, cwd=tmp_path).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_streams_are_eager_unless_the_environment_fixes_their_interval(tmp_path):
    # Dask's own intervals, eager (below): client -> scheduler, scheduler -> client
    assert stream_intervals(tmp_path, None) == [[0.01, True], [[0.002, True]]]
    assert stream_intervals(tmp_path, "0") == [[0.0, False], [[0.0, False]]]  # at once
    from troy.frameworks.dask.agent import _stream_interval
    assert _stream_interval("soon") is None and _stream_interval("") is None  # Dask's


THREADS = ("import json, os, sys\n"
           "from troy.frameworks.dask.agent import ONE_THREAD, import_dask_for_an_agent\n"
           "added = import_dask_for_an_agent() if sys.argv[1] == 'agent' else []\n"
           "import distributed\n"
           "numpy_at_start = 'numpy' in sys.modules\n"
           "threads = len(os.listdir('/proc/self/task'))\n"
           "import numpy\n"
           "from distributed.protocol import deserialize, serialize\n"
           "import dask, yaml\n"
           "print(json.dumps([added, numpy_at_start, threads,\n"
           "                  deserialize(*serialize(numpy.arange(3))).tolist(),\n"
           "                  {v: os.environ.get(v) for v in ONE_THREAD},\n"
           "                  json.dumps(dask.config.config, sort_keys=True, default=str),\n"
           "                  yaml.safe_load.__module__, yaml.__with_libyaml__]))")


def threads_after_import(how: str, **env: str) -> list:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", THREADS, how], env=environ,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_an_agent_imports_dask_without_numpy_and_units_get_the_nodes_environment():
    """Distributed imports numpy (where the node's Python has it) only for its receive
    buffers: an agent imports Dask without it (numpy's import and its BLAS pool of one
    thread per core cost ~0.1 s of CPU at every agent and worker start), numpy still
    imports afterwards and Dask serializes arrays with it; the variables that keep a BLAS
    pool small if numpy comes all the same are gone again, so a unit inherits the node's
    environment, and a node's own setting is kept. Dask's YAML defaults are read by
    libyaml (40 ms of CPU a start to 5), into the same configuration."""
    added, numpy_at_start, threads, array, env, config, safe_load, c_yaml = \
        threads_after_import("agent")
    assert not numpy_at_start and array == [0, 1, 2]
    assert added == ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"]
    assert env == dict.fromkeys(added)                       # not left for the units
    _, plain_numpy, plain_threads, _, _, plain_config, _, _ = threads_after_import("plain")
    assert plain_numpy          # what the agent avoids: Distributed imports it at once
    # Dask's YAML defaults read by libyaml (where PyYAML has it, as on the suite's machine)
    # are the same configuration as PyYAML's own loader reads, and PyYAML is left as it was
    assert c_yaml and config == plain_config and safe_load == "yaml"
    if (os.cpu_count() or 1) > 1:
        assert threads < plain_threads                       # no BLAS pool at start
    added, _, _, _, env, _, _, _ = threads_after_import("agent", OPENBLAS_NUM_THREADS="4")
    assert "OPENBLAS_NUM_THREADS" not in added and env["OPENBLAS_NUM_THREADS"] == "4"


async def _batches(make_eager: bool) -> list:
    """What a real Dask batched stream (interval 600 s, over TCP on 127.0.0.1) delivers:
    one message on a quiet stream, a second one right after it, then 10 in one loop turn,
    then one more right after those; the reader's batches after each step."""
    import asyncio
    from distributed.batched import BatchedSend
    from distributed.comm import CommClosedError, connect, listen
    from troy.frameworks.dask.agent import eager
    received: list = []

    async def reader(comm) -> None:  # noqa: ANN001
        try:
            while True:
                received.append(list(await comm.read()))
        except CommClosedError:
            pass

    async def until(count: int, patience: float) -> None:
        for _ in range(int(patience / 0.01)):
            if len(received) >= count:
                return
            await asyncio.sleep(0.01)

    listener = listen("tcp://127.0.0.1:0", reader)
    await listener.start()
    stream = BatchedSend(interval="600s")
    stream.start(await connect(listener.contact_address))
    if make_eager:
        eager(stream)
    seen = []
    try:
        # each step waits until its batch is in, up to 30 s; Dask's own stream holds the
        # second message for its interval (600 s): half a second shows it has not come
        later = 30 if make_eager else 0.5
        for step, count, patience in ((["a"], 1, 30), (["b"], 2, later),
                                      (list(range(10)), 3, later), (["c"], 4, 0.5)):
            for msg in step:
                stream.send(msg)
            await until(count, patience)
            seen.append(list(received))
    finally:
        stream.abort()
        listener.stop()
    return seen


def test_an_eager_stream_sends_at_once_while_quiet_and_batches_after_a_burst():
    import asyncio
    after_a, after_b, after_burst, after_c = asyncio.run(_batches(True))
    assert after_a == [["a"]]
    assert after_b == [["a"], ["b"]]                     # Dask's own: held for the interval
    assert after_burst == [["a"], ["b"], list(range(10))]  # one turn's messages: one batch
    assert after_c == after_burst                        # after a burst: batched again
    # the same stream without it: the second message waits for the interval (600 s)
    assert asyncio.run(_batches(False))[1] == [["a"]]
