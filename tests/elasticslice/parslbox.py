"""Parsl on the box, for the tests of ``CloudLabProvider`` and of its interchange's keys:
:func:`parsl_on_box` loads Parsl with a HighThroughputExecutor (encrypted, Parsl's default)
on a provider of the box; its apps wait on a gate of a :class:`Witness`."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.elasticslice.managers.helpers import FAST_INTERVALS, client_for, cm_nodes
from tests.elasticslice.pilots.helpers import Witness, pilot_image
from tests.helpers import wait_for


# The apps, made as a script's are (``__main__``): Parsl ships them by value (the nodes have
# no ``tests`` package to import them from).
APPS = """
def square(x, gate_url):
    import subprocess, time, urllib.request
    while True:  # the test opens the gate
        try:
            urllib.request.urlopen(gate_url, timeout=5).close()
            break
        except Exception:  # closed (404) or not yet
            time.sleep(0.05)
    node = subprocess.run(["geni-get", "client_id"], capture_output=True, text=True)
    return x * x, node.stdout.strip()


def total(*parts):
    return sum(p[0] for p in parts)
"""


def apps() -> tuple[Any, Any]:
    """square(x, gate_url) -> (x * x, the node it ran on), once the gate is open;
    total(*squares) -> the sum of the squares."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(APPS, "<apps>", "exec"), namespace)  # noqa: S102 - our own text
    return namespace["square"], namespace["total"]


def cm_nodes_or_none(emulator: Any, tmp_path: Path) -> list[str] | None:
    """What the CM holds for the slice (None: no sliver)."""
    from elasticslice.errors import ElasticSliceError
    try:
        return cm_nodes(emulator, tmp_path)
    except ElasticSliceError:
        return None


def managers_of(executor: Any, block_id: str) -> list[dict[str, Any]]:
    return [m for m in executor.connected_managers() if str(m["block_id"]) == block_id]


@dataclasses.dataclass
class OnTheBox:
    """Parsl loaded with a HighThroughputExecutor on a CloudLabProvider of the box."""

    provider: Any  # elasticslice.parsl.CloudLabProvider
    executor: Any
    gate: Any
    square: Any
    total: Any

    def running_block(self) -> Any:
        """The first block, once two tasks run on it (2 workers; the rest wait)."""
        block = wait_for(lambda: next(iter(self.provider.book.blocks.values()), None), 60,
                         what="the first block")
        wait_for(lambda: sum(m["tasks"] for m in managers_of(self.executor,
                                                             block.block_id)) == 2,
                 timeout=180, what="tasks running on the first block")
        return block

    def node_id(self, client_id: str) -> str:
        """The node's node_id, as the provider's manager daemon recorded it."""
        view = self.provider.view()
        return next(r.node_id for r in view.state.nodes() if r.client_id == client_id)


@contextlib.contextmanager
def parsl_on_box(emulator: Any, tmp_path: Path, nodes_per_block: int = 1, max_blocks: int = 2,
                 max_idletime: float = 120.0, **executor_options: Any) -> Iterator[OnTheBox]:
    """Two workers a block (``nodes_per_block`` nodes, 2 // nodes_per_block workers each),
    ``max_blocks`` blocks at most, retries 2; Parsl's strategy cancels the blocks after
    ``max_idletime`` seconds without a task (Parsl's default 120). The nodes boot the box's
    pilot image, which has Parsl (``node_python``): docs/parsl.md's example runs the
    default, nodes that build the environment from the provider's wheelhouse on the stock
    image."""
    import parsl
    from parsl import python_app
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor

    from elasticslice.parsl import CloudLabProvider

    witness = Witness(emulator.control_address)
    server = client_for(emulator, tmp_path / "cache")
    provider = CloudLabProvider(server, tmp_path / "state", init_blocks=1, max_blocks=max_blocks,
                                nodes_per_block=nodes_per_block,
                                disk_image=pilot_image(emulator), node_python="python3",
                                margin=1.0, status_polling_interval=0.5,
                                intervals={**FAST_INTERVALS, "renew": 600.0})
    # Parsl's own heartbeat threshold (120 s) unless a test wants a loss seen sooner: on a
    # loaded machine a node's manager can miss 10 s of heartbeats, and be "lost" for it
    options = {"heartbeat_period": 2, "heartbeat_threshold": 120, **executor_options}
    executor = HighThroughputExecutor(
        label="cloudlab", address=provider.address, provider=provider,
        max_workers_per_node=2 // nodes_per_block, poll_period=100,
        interchange_launch_cmd=provider.interchange_launch_cmd, **options)
    config = Config(executors=[executor], retries=2, strategy_period=0.5,
                    max_idletime=max_idletime, run_dir=str(tmp_path / "runinfo"))
    square, total = (python_app(f) for f in apps())
    try:
        with parsl.load(config):
            yield OnTheBox(provider, executor, witness.gate(), square, total)
    finally:
        provider.close()
        server.close()
        witness.close()
