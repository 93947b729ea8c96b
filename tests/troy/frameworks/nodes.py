"""Helpers for tests with real node agents (``python -m troy.frameworks.dask node``) joining
a ``dask`` framework over mutual TLS, with certificates made here by ``cryptography``."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import troy
from elasticslice.rpc.pki import issue_certificate
from troy.frameworks.dask import DaskFramework
from troy.frameworks.dask.tls import DaskTLS
from troy.states import State
from tests.helpers import wait_for


def member(directory: Path, ca: tuple[bytes, bytes], name: str,
           role: str | None = "auto") -> DaskTLS:
    """A member's files: the CA certificate, and a certificate + key signed by it, with
    ``role`` as its OU (``"auto"``: ``control`` for the member called "control", as the
    elastic cluster's control node, ``worker`` for any other, as its nodes; None: none)."""
    directory.mkdir(parents=True, exist_ok=True)
    if role == "auto":
        role = "control" if name == "control" else "worker"
    cert, key = issue_certificate(*ca, name, hostnames=["localhost"], ips=["127.0.0.1"],
                                  role=role, key_type="ec")  # as the cluster's (and nodes')
    (directory / "ca.pem").write_bytes(ca[0])
    (directory / f"{name}.pem").write_bytes(cert)
    (directory / f"{name}-key.pem").write_bytes(key)
    return DaskTLS(str(directory / "ca.pem"), str(directory / f"{name}.pem"),
                   str(directory / f"{name}-key.pem"))


def node_agent(scheduler: str, cores: int, tls: DaskTLS | None, log: Path,
               name: str = "node-x", own_group: bool = False) -> subprocess.Popen:
    """``python -m troy.frameworks.dask node``, as a node's startup command runs it
    (``own_group``: in a process group of its own, with its units, as on a node)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env["DASK_LOGGING__DISTRIBUTED"] = "info"   # the tests read "Waiting to connect"
    if tls is not None:
        env.update(tls.environ())
    return subprocess.Popen([sys.executable, "-m", "troy.frameworks.dask", "node", scheduler,
                             str(cores), name], env=env, stdout=subprocess.PIPE,
                            stderr=open(log, "wb"), stdin=subprocess.DEVNULL,
                            start_new_session=own_group)


def stop(proc: subprocess.Popen) -> int:
    proc.terminate()
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@contextmanager
def nodes(fw: DaskFramework, ca: tuple[bytes, bytes], directory: Path, names: list[str],
          cores: int = 2, adopted: bool = True) -> Iterator[dict[str, subprocess.Popen]]:
    """Node agents called ``names`` joining ``fw`` with certificates of ``ca``; waits until
    each is a RUNNING pilot (``adopted``); stops them all at the end."""
    procs = {n: node_agent(fw.scheduler_address, cores, member(directory / n, ca, n),
                           directory / f"{n}.log", n) for n in names}
    try:
        for n in names if adopted else ():
            wait_for(lambda n=n: (p := fw.find_pilot(n)) is not None
                     and p.state is State.RUNNING, 120, what=f"node {n} to become a pilot")
        yield procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                stop(proc)


def running_pilot(fw, size: int, timeout: float = 30.0):  # noqa: ANN001, ANN201
    """A pilot of ``size`` cores submitted to ``fw``, once it runs."""
    p = fw.submit_pilot(troy.PilotDescription(size=size))
    assert p.wait_running(timeout) is troy.State.RUNNING
    return p
