"""``CloudLabProvider``: CloudLab nodes as the blocks of Parsl's HighThroughputExecutor.

    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    provider = CloudLabProvider(server, state_dir, max_blocks=4)
    config = Config(executors=[HighThroughputExecutor(
        address=provider.address, provider=provider,
        interchange_launch_cmd=provider.interchange_launch_cmd)], retries=2)
    with parsl.load(config): ...
    provider.close()                       # gives the slice back

A block (``submit``) is ``nodes_per_block`` nodes of one slice; each runs the executor's
worker command (``process_worker_pool.py ... --block_id=N``) from its startup script, in
the environment the node builds from the wheelhouse the provider publishes (the agent's
wheelhouse plus Parsl: :func:`~elasticslice.pilots.bootstrap.env_script`). The nodes are
held by a :class:`~.manager.ParslSliceManager`, the project's manager (state dir, intent
log, callback endpoint, notice book, cycle) whose demand is Parsl's blocks: its stock
policy asks for the open slots of live blocks and gives back the nodes of blocks that
ended (never the sliver's last). That manager runs in the provider's manager daemon
(:mod:`.daemon`), the one process that opens the CloudLab credentials and the CA's key and
never loads Parsl; the provider's process, where Parsl unpickles what nodes send, tells it
the blocks over the local channel (:mod:`.link`, its end there :mod:`.remote`).

On NotifyDeletePending for a node of a block, :class:`~.drain.BlockDrainer` (in the
daemon) has the provider's process hold every manager of the block at the interchange (no
new task reaches it) until the tasks they hold are done or the notice's deadline less
``margin`` comes, then releases the revoked node early (and the block's other nodes go
back too). A node taken without notice takes its tasks with it: the interchange sees its
manager lost and Parsl retries them (``Config(retries=N)``; the default is 0). Node states
map to Parsl's ``JobState`` in :func:`~.blocks.job_state`.

The interchange is encrypted (Parsl's default, ``encrypted=True``): each node enrols at the
provider's :class:`~elasticslice.pilots.enrol.EnrolmentService` (a single-use token in the
tarball, its own key, a worker certificate of the provider's CA), makes its own CurveZMQ key
pair and has its public key authorised over mutual TLS (:mod:`elasticslice.parsl.keys`); the
interchange refuses any other manager. ``encrypted=False`` is refused unless the interchange
is on loopback only.

The package's modules: :mod:`.provider` (``CloudLabProvider``, Parsl's side) and
:mod:`.link` (its end of the channel), :mod:`.daemon` (the manager daemon; ``python -m
elasticslice.parsl.daemon``) and :mod:`.remote` (its end of the channel), :mod:`.blocks`
(blocks, which node is whose, Parsl's states of them), :mod:`.manager` (the slice's manager),
:mod:`.drain` (a block drained on a notice), :mod:`.node` (what a node runs: its start
script, the slice's tarball) and :mod:`.keys` (the nodes' CurveZMQ keys; ``python -m
elasticslice.parsl.keys``). The names below are imported from them when first used, so
that a node running ``elasticslice.parsl.keys`` imports neither Parsl's provider nor the
manager.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from elasticslice import lazy

#: name -> the module of this package that defines it
_WHERE = {
    "CloudLabProvider": "provider", "ProviderError": "provider",
    "DEFAULT_INTERVALS": "provider",
    "Block": "blocks", "BlockBook": "blocks", "BlockState": "blocks", "job_state": "blocks",
    "BlockDrainer": "drain", "ParslSliceManager": "manager",
    "ParslNodeHelper": "node", "INSTALL_PATH": "node", "NODE_KEYS": "node",
}
__all__ = sorted(_WHERE)

if TYPE_CHECKING:
    from elasticslice.parsl.blocks import Block, BlockBook, BlockState, job_state
    from elasticslice.parsl.drain import BlockDrainer
    from elasticslice.parsl.manager import ParslSliceManager
    from elasticslice.parsl.node import INSTALL_PATH, NODE_KEYS, ParslNodeHelper
    from elasticslice.parsl.provider import DEFAULT_INTERVALS, CloudLabProvider, ProviderError


__getattr__, __dir__ = lazy.exports(__name__, _WHERE)
