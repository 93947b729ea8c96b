"""Helpers for the hostile-input tests: the corpus, one-line errors, what a managed slice must
still hold after an attack, what a caller was told."""
from __future__ import annotations

import json
import subprocess
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from elasticslice.cli import cli
from tests.elasticslice.emulator.helpers import RunningEmulator
from tests.elasticslice.managers.helpers import cm_nodes

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


def describe(status: int, body: bytes) -> str:
    """What the caller was told, in one line: ``http N``, ``fault N: ...`` or ``code N: ...``."""
    if status != 200:
        return f"http {status}"
    try:
        ((answer,), _) = xmlrpc.client.loads(body)
    except xmlrpc.client.Fault as fault:
        return f"fault {fault.faultCode}: {fault.faultString}"
    return f"code {answer['code']}: {answer['output']}"


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
