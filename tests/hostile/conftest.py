"""The hostile-input corpus: one emulator and one real `elasticslice manage` for the package.

Starting an emulator and a manager takes seconds, so the tests of tests/hostile share them and
each test checks, after its hostile call, that they still serve and that their state is what
it was (``ManagedSlice.assert_intact``).

``hostile_emulator``: a running emulator (package scope) with the session's PKI.
``managed``: a real `elasticslice manage` process on that emulator, with its callback endpoint
registered and 3 nodes held, logging with --debug (package scope).
``corpus(edge)``: the data files of ``tests/hostile/corpus/<edge>/``, with the expected
fragment of their one-line error from ``expected.json`` there.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from elasticslice.cli import cli
from elasticslice.emulator import EmulatorServer
from tests.conftest import wait_for
from tests.elasticslice.conftest import FAST, RunningEmulator, emulator_pki  # noqa: F401
from tests.elasticslice.managers.conftest import cm_nodes
from tests.elasticslice.managers.test_cli_manage import _managing, manager_config

CORPUS = Path(__file__).parent / "corpus"
NODES = ["node-1", "node-2", "node-3"]


def corpus(edge: str) -> list[tuple[Path, str]]:
    """(file, expected message fragment) for every file of ``corpus/<edge>/``."""
    expected = json.loads((CORPUS / edge / "expected.json").read_text())
    return [(CORPUS / edge / name, fragment) for name, fragment in sorted(expected.items())]


def one_line_error(output: str) -> str:
    """The single line of a refused command's output (fails the test if there are more)."""
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


@pytest.fixture(scope="package")
def hostile_emulator(emulator_pki: Path,  # noqa: F811
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    directory = tmp_path_factory.mktemp("hostile") / "emu"
    shutil.copytree(emulator_pki, directory)
    server = EmulatorServer(directory, port=0, **FAST)
    server.start()
    yield RunningEmulator(directory, server)
    server.stop()


@dataclass
class ManagedSlice:
    """A running `elasticslice manage` and what it must still hold after an attack."""
    emulator: RunningEmulator
    proc: subprocess.Popen[bytes]
    conf: Path
    log: Path
    work: Path
    endpoint_url: str

    @property
    def port(self) -> int:
        return int(self.endpoint_url.rsplit(":", 1)[1].strip("/"))

    def status(self) -> dict:
        result = CliRunner().invoke(cli, ["--config", str(self.conf), "status", "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    def assert_intact(self) -> None:
        """Still running, its endpoint still registered, the same nodes held and recorded,
        none of them pending delete, and no traceback in its log."""
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        store = self.emulator.server.ctx.store
        assert [e.url for e in store.all_endpoints()] == [self.endpoint_url]
        data = self.status()
        assert sorted(n["client_id"] for n in data["nodes"]) == NODES
        assert not any(n["pending_delete"] for n in data["nodes"]), data["nodes"]
        assert sorted(cm_nodes(self.emulator, self.work)) == NODES
        assert "Traceback" not in self.log.read_text()


@pytest.fixture(scope="package")
def managed(hostile_emulator: RunningEmulator,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedSlice]:
    work = tmp_path_factory.mktemp("managed")
    conf = manager_config(hostile_emulator, work, endpoint="enabled = true\n")
    log = work / "manage.log"
    store = hostile_emulator.server.ctx.store
    with _managing(conf, log, ELASTICSLICE_DEBUG="1") as proc:
        def registered() -> list:
            assert proc.poll() is None, log.read_text()[-3000:]
            return store.all_endpoints()
        (row,) = wait_for(registered, timeout=120, what="the endpoint registered")
        wait_for(lambda: sorted(cm_nodes(hostile_emulator, work)) == NODES, timeout=120,
                 what="3 nodes")
        managed = ManagedSlice(hostile_emulator, proc, conf, log, work, row.url)
        wait_for(lambda: sorted(n["client_id"] for n in managed.status()["nodes"]) == NODES,
                 timeout=60, what="3 nodes recorded")
        yield managed
