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
the environment the node builds from the wheelhouse this provider publishes (the agent's
wheelhouse plus Parsl: :func:`~elasticslice.pilots.bootstrap.env_script`). The nodes are
held by a :class:`ParslSliceManager`, the project's manager (state dir, intent log, callback
endpoint, notice book, cycle) with Parsl as its policy: ``add_nodes`` fills the open slots
of live blocks, ``delete_nodes`` gives back the nodes of blocks that ended.

On NotifyDeletePending for a node of a block, :class:`BlockDrainer` holds every manager of
the block at the interchange (no new task reaches it), waits until the tasks they hold are
done or the notice's deadline less ``margin`` comes, then releases the revoked node early
(and the block's other nodes go back too). A node taken without notice takes its tasks
with it: the interchange sees its manager lost and Parsl retries them (``Config(retries=N)``;
the default is 0). Node states map to Parsl's ``JobState`` in :func:`job_state`.

The interchange is encrypted (Parsl's default, ``encrypted=True``): each node enrols at the
provider's :class:`~elasticslice.pilots.enrol.EnrolmentService` (a single-use token in the
tarball, its own key, a worker certificate of the provider's CA), makes its own CurveZMQ key
pair and has its public key authorised over mutual TLS (:mod:`elasticslice.parslkeys`); the
interchange refuses any other manager. ``encrypted=False`` is refused unless the interchange
is on loopback only.
"""
from __future__ import annotations

import atexit
import dataclasses
import enum
import logging
import re
import shlex
import sys
import threading
import time
import types
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from parsl.jobs.states import JobState, JobStatus
from parsl.providers.base import ExecutionProvider

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.background import Background
from elasticslice.managers.config import EndpointConfig
from elasticslice.managers.cycle import PARSL_INTERVALS
from elasticslice.managers.helpers import SimpleElasticSliceHelper
from elasticslice.managers.manager import SimpleElasticSliceManager
from elasticslice.managers.policy import NodeState, PolicyConfig
from elasticslice.managers.records import PendingDelete
from elasticslice.parslkeys import AuthorisedKeys, is_loopback
from elasticslice.pilots.failures import NodeFailures
from elasticslice.pilots.helper import script_head
from elasticslice.pilots.manager import EarlyReleases
from elasticslice.pilots.slicetar import NAME as SLICE_TARBALL
from elasticslice.pilots.slicetar import NODES, Member, SliceTarball
from elasticslice.validate import is_command, is_count, is_seconds

log = logging.getLogger(__name__)

INSTALL_PATH = "/local/parsl"
#: how often each cycle method runs (seconds): the cycle's table (managers/cycle.py)
DEFAULT_INTERVALS = PARSL_INTERVALS
_BLOCK_ID = re.compile(r"--block_id[= ](\S+)")
_CERT_DIR = re.compile(r"--cert_dir[= ](\S+)")
_ADDRESSES = re.compile(r"(?:^|\s)(?:-a|--addresses)[= ](\S+)")
#: on the node: its CurveZMQ pair and the interchange's public key (the pool's --cert_dir)
NODE_KEYS = f"{INSTALL_PATH}/curve"


class ProviderError(ElasticSliceError, ValueError):
    """A CloudLabProvider argument or use that cannot work (one line saying why)."""


class BlockState(str, enum.Enum):
    """What the provider knows of a block beyond its nodes' states."""

    LIVE = "live"            # wants its nodes; their states say the rest
    DRAINING = "draining"    # a node has a notice: its managers are held
    DRAINED = "drained"      # drained for a notice; its nodes go back
    CANCELLED = "cancelled"  # Parsl cancelled it; its nodes go back


_FINAL = {BlockState.DRAINED: JobState.COMPLETED, BlockState.CANCELLED: JobState.CANCELLED}


def job_state(block: BlockState, nodes: Sequence[NodeState | None], slots: int = 0
              ) -> JobState:
    """Parsl's state of a block: the provider's ``block`` state and its nodes' states
    (None: the node is gone), ``slots`` nodes not asked for yet (see docs/parsl.md)."""
    if block in _FINAL:
        return _FINAL[block]
    if block is BlockState.DRAINING:
        return JobState.HELD
    alive = [s for s in nodes if s is not None]
    if any(s is NodeState.READY for s in alive):
        return JobState.RUNNING
    if nodes and not alive and not slots:
        return JobState.TIMEOUT   # taken by CloudLab: expected in a pilot model, no failure
    if alive and not slots and all(s is NodeState.FAILED for s in alive):
        return JobState.FAILED
    return JobState.PENDING


@dataclasses.dataclass
class Block:
    """A submitted block: its command, size and the client_ids bound to it."""

    job_id: str
    name: str
    command: str
    size: int
    block_id: str | None = None       # Parsl's, from --block_id (managers report it)
    nodes: list[str] = dataclasses.field(default_factory=list)
    state: BlockState = BlockState.LIVE
    message: str | None = None
    deadline: float | None = None     # draining: CloudLab takes a node then
    revoked: dict[str, PendingDelete] = dataclasses.field(default_factory=dict)

    @property
    def open_slots(self) -> int:
        return self.size - len(self.nodes) if self.state is BlockState.LIVE else 0

    @property
    def over(self) -> bool:
        return self.state in _FINAL


class BlockBook:
    """The blocks and which node is whose; its own short lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.blocks: dict[str, Block] = {}
        self._of: dict[str, Block] = {}   # client_id -> block

    def add(self, block: Block) -> None:
        with self._lock:
            self.blocks[block.job_id] = block

    def get(self, job_id: str) -> Block | None:
        with self._lock:
            return self.blocks.get(job_id)

    def of(self, client_id: str | None) -> Block | None:
        with self._lock:
            return self._of.get(client_id or "")

    def bind(self, client_id: str) -> Block | None:
        """Bind a new node to the oldest block with an open slot (None: no block wants one)."""
        with self._lock:
            for block in self.blocks.values():
                if block.open_slots > 0:
                    block.nodes.append(client_id)
                    self._of[client_id] = block
                    return block
            return None

    def unbind(self, client_ids: Sequence[str]) -> None:
        """These nodes were never added (AddNodes failed): their slots open again."""
        with self._lock:
            for cid in client_ids:
                block = self._of.pop(cid, None)
                if block is not None and cid in block.nodes:
                    block.nodes.remove(cid)

    def open_slots(self) -> int:
        with self._lock:
            return sum(b.open_slots for b in self.blocks.values())

    def wanted(self, client_id: str) -> bool:
        """Whether the node belongs to a block that still wants it."""
        block = self.of(client_id)
        return block is not None and not block.over

    def set_state(self, block: Block, state: BlockState, message: str | None = None) -> bool:
        """Move ``block`` on (a final block stays final); whether it moved."""
        with self._lock:
            if block.over:
                return False
            block.state, block.message = state, message or block.message
            return True

    def drain(self, block: Block, rev: PendingDelete) -> bool:
        """Record a notice for a node of ``block``; True when its drain must start."""
        with self._lock:
            block.revoked[rev.node_id] = rev
            block.deadline = min(rev.deadline, block.deadline or rev.deadline)
            if block.state is not BlockState.LIVE:
                return False
            block.state = BlockState.DRAINING
            block.message = f"draining: CloudLab takes {rev.client_id} back"
            return True


class ParslNodeHelper(SimpleElasticSliceHelper):
    """Nodes named ``parsl-<n>``, each bound to a block when it is asked for. The slice's
    nodes share one install tarball (at ``/``, published by ``publisher`` under ``token``:
    :mod:`elasticslice.pilots.slicetar`) holding ``start.sh`` (build the environment,
    ``env_lines``, then run the node's block's worker command), the cluster CA's
    certificate (``ca``) and, per held node, its command (``nodes/<client_id>/command``)
    and, until it enrolled, its single-use enrolment token (``nodes/<client_id>/token``,
    0600, from ``enrolment``). A command whose worker pool is encrypted (``--cert_dir``
    :data:`NODE_KEYS`) makes the node enrol at ``enrol_url`` and have its own CurveZMQ key
    authorised (:mod:`elasticslice.parslkeys`) before it runs; no key is in the tarball.
    ``failures``: where nodes that failed to start are named; ``report_url``: where their
    start scripts say why; ``on_gone(client_id)``: called when a node left."""

    def __init__(self, book: BlockBook, publisher: Any, tarball_dir: Path, env_lines: str,
                 *, cores: int | None = None, server: Any = None, token: str | None = None,
                 report_url: str | None = None, failures: NodeFailures | None = None,
                 ca: Any = None, enrolment: Any = None, enrol_url: str | None = None,
                 enrol_within: float = 1800.0,
                 on_gone: Callable[[str], object] | None = None, **options: Any) -> None:
        super().__init__(server, None, node_prefix="parsl",
                         startup_command=f"sh {INSTALL_PATH}/start.sh", **options)
        self.book = book
        self.publisher = publisher
        self.token = token
        self.report_url = report_url
        self.env_lines = env_lines
        self.cores = cores
        self.ca, self.enrolment, self.enrol_url = ca, enrolment, enrol_url
        self.enrol_within = enrol_within
        self.on_gone = on_gone
        self.failures = failures if failures is not None else NodeFailures()
        self.slice_tarball = SliceTarball(Path(tarball_dir) / SLICE_TARBALL, INSTALL_PATH,
                                          {})
        self._url: str | None = None

    def start_script(self) -> str:
        cores = f"export PARSL_CORES={int(self.cores)}\n" if self.cores else ""
        head = script_head("this node runs Parsl's worker pool for its block", INSTALL_PATH,
                           self.report_url)
        url = shlex.quote(self.enrol_url or "")
        keys = '"$here/curve"'
        return (f"{head}"
                f'cmd=$(asroot cat "$here/{NODES}/$name/command" 2>/dev/null) && '
                f'printf "%s" "$cmd" > "$here/command" || '
                f'cmd=$(cat "$here/command" 2>/dev/null) || '
                f'fail "no Parsl block for $name in the tarball"\n'
                f"# --- an encrypted pool: this node's own CurveZMQ key, authorised after it "
                f"enrols\n"
                f'case "$cmd" in *"--cert_dir {NODE_KEYS}"*) keys=yes ;; *) keys= ;; esac\n'
                f'if [ -n "$keys" ] && [ -s {keys}/client.key_secret ] && '
                f'[ -s {keys}/server.key_secret ]; then\n'
                f"    keys=  # a reboot: its key is still allowed while the node is held\n"
                f"fi\n"
                f'if [ -n "$keys" ]; then\n'
                f'    asroot cat "$here/{NODES}/$name/token" > "$here/token" 2>/dev/null || '
                f'rm -f "$here/token"\n'
                f"fi\n"
                f'asroot rm -rf "$here/{NODES}" || fail "cannot remove $here/{NODES}"\n'
                f"{self.env_lines.rstrip()}\n"
                f'if [ -n "$keys" ]; then\n'
                f'    [ -s "$here/token" ] || fail "no enrolment token for $name in the '
                f'tarball and no key in $here/curve"\n'
                f'    "$py" -m troy.frameworks.dask.enrol {url} "$here/token" "$here/ca.pem" '
                f'"$name" "$here" || exit 1\n'
                f'    "$py" -m elasticslice.parslkeys node {url} "$here/ca.pem" '
                f'"$here/node.pem" "$here/node.key" "$name" {keys} || exit 1\n'
                f"fi\n"
                f'mkdir -p "$here/bin"\n'
                f"cat > \"$here/bin/process_worker_pool.py\" <<PARSL_POOL\n"
                f"#!/bin/sh\n"
                f'exec "$py" -m parsl.executors.high_throughput.process_worker_pool "\\$@"\n'
                f"PARSL_POOL\n"
                f'chmod 755 "$here/bin/process_worker_pool.py"\n'
                f'export PATH="$here/bin:$(dirname "$py"):$PATH"\n'
                f"{cores}"
                f'cd "$here"\n'
                f'[ -s "$err" ] && cat "$err" >&3\n'
                f"trap - EXIT\n"
                f"exec 2>&3 3>&-\n"
                f'exec /bin/sh -c "$cmd"\n')

    def tarball_url(self) -> str:
        """The slice's tarball URL (published once; the file made now if it is not there)."""
        if self._url is None:
            common = {"start.sh": Member(self.start_script().encode(), 0o755)}
            if self.ca is not None:
                common["ca.pem"] = Member(self.ca.cert_pem, 0o644)
            self.slice_tarball.set_common(common)
            self._url = self.publisher.publish(self.slice_tarball.path, SLICE_TARBALL,
                                               token=self.token)
        return self._url

    def node_spec(self, client_id: str) -> Any:
        spec = super().node_spec(client_id)
        block = self.book.bind(client_id)
        if block is None:  # the sliver's first node with no block yet: it runs nothing
            spec.executes = []
            return spec
        url = self.tarball_url()
        files = {"command": Member(block.command.encode())}
        if self.enrolment is not None and f"--cert_dir {NODE_KEYS}" in block.command:
            token = self.enrolment.token_for(client_id,
                                             deadline=time.time() + self.enrol_within)
            files["token"] = Member(token.encode(), 0o600)
        self.slice_tarball.set_node(client_id, files)
        spec.installs = [*spec.installs, (url, "/")]
        return spec

    def enrolled(self, client_id: str) -> None:
        """The node spent its token: the tarball keeps only its command."""
        block = self.book.of(client_id)
        if block is not None:
            self.slice_tarball.set_node(client_id, {"command": Member(block.command.encode())})

    def handle_added_node(self, node: dict[str, Any], status: str) -> None:
        if status == "failed":
            self.failures.failed(str(node.get("client_id")), str(node.get("node_id") or ""),
                                 "failed (the CM says; see the manager's log)")

    def handle_deleted_node(self, node: dict[str, Any]) -> None:
        """The node left: its token, its files and its CurveZMQ key go."""
        cid = str(node.get("client_id") or "")
        self.failures.forget(cid)
        if self.enrolment is not None:
            self.enrolment.forget(cid)
        if self.on_gone is not None:
            self.on_gone(cid)
        self.slice_tarball.drop_node(cid)

    def close(self, *, remove: bool) -> None:
        url, self._url = self._url, None
        if url is not None:
            self.publisher.withdraw(url)
        if remove:
            self.slice_tarball.path.unlink(missing_ok=True)


class BlockDrainer:
    """A :class:`~elasticslice.managers.endpoint.Releaser` for blocks: a notice holds the
    block's managers at the interchange (the call HTEX's own ``scale_in`` makes) and, on a
    thread of its own, waits until they hold no task or the deadline less ``margin``
    comes; then the revoked nodes are released (``release(node_id, client_id, why)``) and
    the block's other nodes go back with it (``wake()``)."""

    def __init__(self, book: BlockBook, executor: Callable[[], Any], *, margin: float,
                 release: Callable[[str, str | None, str], None], wake: Callable[[], None],
                 clock: Callable[[], float] = time.time, poll: float = 0.2) -> None:
        self.book, self.executor, self.margin = book, executor, margin
        self.release, self.wake, self.clock, self.poll = release, wake, clock, poll
        self.work = Background("parsl-drain", threads=4)
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._draining = 0

    def start(self, revocations: Sequence[PendingDelete]) -> None:
        for rev in revocations:
            block = self.book.of(rev.client_id)
            if block is None or block.over:
                self.release(rev.node_id, rev.client_id, "no Parsl block on it")
            elif self.book.drain(block, rev):
                self.work.post(self._drain, block)

    def hurry(self, revocation: PendingDelete) -> None:
        """The deadline came earlier: the drain waits for that one."""
        block = self.book.of(revocation.client_id)
        if block is not None and not block.over and self.book.drain(block, revocation):
            self.work.post(self._drain, block)

    def gone(self, revocations: Sequence[PendingDelete], *, now: bool = False) -> None:
        """Taken (or taken now): the interchange finds their managers lost and Parsl
        retries what they held; a block draining for them ends."""
        for rev in revocations:
            block = self.book.of(rev.client_id)
            if block is not None and block.state is BlockState.DRAINING:
                self.book.set_state(block, BlockState.DRAINED,
                                    f"{rev.client_id} taken by CloudLab")
                self.wake()

    def running(self) -> int:
        return self._draining

    def close(self) -> None:
        self._closing.set()
        self.work.close()

    def _managers(self, executor: Any, block: Block) -> list[dict[str, Any]]:
        if executor is None or block.block_id is None:
            return []
        return [m for m in executor.connected_managers()
                if str(m.get("block_id")) == block.block_id]

    def _drain(self, block: Block) -> None:
        with self._lock:
            self._draining += 1
        try:
            why = self._wait_empty(block)
        except Exception as err:  # noqa: BLE001 - the node goes anyway
            log.warning("cannot drain %s (%s): its node goes now", block.name, err)
            why = f"not drained: {err}"
        finally:
            with self._lock:
                self._draining -= 1
        self.book.set_state(block, BlockState.DRAINED, why)
        for rev in list(block.revoked.values()):
            self.release(rev.node_id, rev.client_id, why)
        self.wake()

    def _wait_empty(self, block: Block) -> str:
        executor = self.executor()
        held: set[str] = set()
        log.warning("draining %s (block %s): CloudLab takes a node in %.0f s", block.name,
                    block.block_id, (block.deadline or self.clock()) - self.clock())
        while True:
            managers = self._managers(executor, block)
            fresh = [m["manager"] for m in managers if m["manager"] not in held]
            for manager in fresh:  # managers joining late are held too
                executor._hold_manager(manager)
                held.add(manager)
            if fresh:  # what they hold once held (a task may have gone to them meanwhile)
                managers = self._managers(executor, block)
            tasks = sum(int(m.get("tasks", 0)) for m in managers)
            if tasks == 0:
                return "drained"
            if block.state is not BlockState.DRAINING:
                return block.message or "ended"
            if self.clock() >= (block.deadline or 0) - self.margin:
                return f"{tasks} task(s) still on it at the deadline: Parsl retries them"
            if self._closing.wait(self.poll):
                return "the provider closed"


class ParslSliceManager(EarlyReleases, SimpleElasticSliceManager):
    """The project's manager with Parsl as its policy: ``add_nodes`` asks for the open
    slots of live blocks (up to ``maxthreshold`` held), ``delete_nodes`` gives back the
    nodes no live block wants (CloudLab keeps one node in a sliver: the last stays until
    another comes or the provider closes); a notice drains the node's block
    (:class:`BlockDrainer`) and the node is released early. ``executor``: returns the
    HighThroughputExecutor (None: not known, nothing to drain)."""

    RELEASE_WAKES = ("update_sliver_status", "delete_nodes")  # the block's other nodes too

    def __init__(self, server: Any, *, book: BlockBook, executor: Callable[[], Any],
                 margin: float = 5.0, **options: Any) -> None:
        self.book, self._executor, self.margin = book, executor, margin
        self.releases = Background("node-release", threads=2)
        super().__init__(server, **options)

    def _releaser(self) -> BlockDrainer:
        self.drainer = BlockDrainer(self.book, self._executor, margin=self.margin,
                                    release=self._release, clock=self._now,
                                    wake=lambda: self.wake("delete_nodes"))
        return self.drainer

    def add_nodes(self, count: int = 0, cm: Any = None) -> int:
        c = self._cms(cm)[0]
        wanted = min(self.book.open_slots(), self.maxthreshold - len(self.state.nodes(c.url)))
        if wanted <= 0 or self.state.open_intents():
            return 0
        args = self.get_add_args(wanted)
        try:
            return self.actuator.add(c, args)
        finally:  # failed, or some left out (too few free of the type): their slots free
            self._unbind_unheld()

    def ensure_sliver(self, cm: Any = None) -> Any:
        try:
            return super().ensure_sliver(cm)
        except Exception:
            self._unbind_unheld()
            raise

    def _unbind_unheld(self) -> None:
        """Nodes bound to blocks that no CM holds (their AddNodes or CreateSliver failed)
        free their slots; one the CM added after all is found by the reconcile, and given
        back as no block's."""
        bound = [cid for block in list(self.book.blocks.values()) for cid in list(block.nodes)]
        self.book.unbind([cid for cid in bound
                          if all(self.state.node(url, cid) is None for url in self.cmlist)])

    def delete_nodes(self, cm: Any = None) -> int:
        deleted = 0
        revoked = {p.node_id for p in self.state.pending_deletes(open_only=True)}
        for c in self._cms(cm):
            held = self.state.nodes(c.url)
            extra = [r.client_id for r in held
                     if not self.book.wanted(r.client_id) and r.node_id not in revoked]
            if extra and len(extra) == len(held):
                extra.pop()  # CloudLab refuses to take a sliver's every node
            if extra:
                deleted += self.actuator.delete(c, extra, "their Parsl block ended")
        return deleted

    def _threads(self) -> list[Background]:
        return [*super()._threads(), self.drainer.work, self.releases]

    def stats(self) -> dict[str, int]:
        """revocations, early_releases, forced_releases (as the CM reported them)."""
        counts = self.notices.counts()
        return {"revocations": counts["revocations"], "early_releases": counts["early"],
                "forced_releases": counts["forced"]}


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def _count(name: str, value: Any, least: int) -> int:
    if not is_count(value, least):
        raise ProviderError(f"CloudLabProvider: {name} must be a whole number >= {least}, "
                            f"not {value!r}")
    return value


def _seconds(name: str, value: Any, *, positive: bool = False) -> float:
    if not is_seconds(value, positive=positive):
        raise ProviderError(f"CloudLabProvider: {name} must be a number of seconds "
                            f"{'> 0' if positive else '>= 0'}, not {value!r}")
    return float(value)


class CloudLabProvider(ExecutionProvider):
    """A Parsl ``ExecutionProvider`` whose blocks are CloudLab nodes (the module's doc).

    ``server``: a ``ProtoGeniServer``, or ``config``: the path of its config file (the
    provider opens and closes the client); ``state_dir``: the manager's files (default
    ``~/.elasticslice/parsl/<label>``; one provider at a time). ``nodes_per_block``,
    ``init_blocks``, ``min_blocks``, ``max_blocks``, ``parallelism``: as every Parsl
    provider; ``max_nodes``: nodes held at most (default ``max_blocks * nodes_per_block``).
    What a node is: ``hardware_type``, ``disk_image`` (default the CM's), ``image_python``
    (its ``python3``'s version; default known from the image), ``node_python`` (an image
    that already has Parsl, e.g. the box's ``ELASTICSLICE-PILOT``: the ``python3`` to run
    its worker pool with; default None: each node builds the environment from the
    wheelhouse the provider publishes), ``cores_per_node``
    (``PARSL_CORES`` on the node). ``margin``: seconds kept before a notice's deadline;
    ``listen``: where the tarball publisher, the nodes' enrolment service (their worker
    certificates and CurveZMQ keys: :mod:`elasticslice.parslkeys`) and the callback endpoint
    listen (None: the config's ``[pilots] listen``, else the address routed to the CM:
    :attr:`address`);
    ``public_url``: the base URL the CM fetches tarballs from (default the publisher's);
    ``publish_port``: a fixed port for the publisher (default: the one this state directory
    used last, else any free one: the slice's tarball keeps its URL across restarts);
    ``keep``: ``close()`` leaves the slice. Nothing starts before the first ``submit``.
    Nodes that failed to start are named with their cause in :attr:`failures`."""

    def __init__(self, server: Any = None, state_dir: str | Path | None = None, *,
                 config: str | Path | None = None, label: str = "cloudlab",
                 nodes_per_block: int = 1, init_blocks: int = 1, min_blocks: int = 0,
                 max_blocks: int = 4, parallelism: float = 1.0, max_nodes: int | None = None,
                 hardware_type: str | None = None, disk_image: str | None = None,
                 image_python: str | None = None, node_python: str | None = None,
                 cores_per_node: int | None = None, margin: float = 5.0,
                 listen: str | None = None, public_url: str | None = None,
                 endpoint_port: int = 0, status_polling_interval: float = 2.0,
                 intervals: Mapping[str, float] | None = None, keep: bool = False,
                 publish_port: int | None = None) -> None:
        if (server is None) == (config is None):
            raise ProviderError("CloudLabProvider needs the CloudLab client (server=) or "
                                "the path of its config file (config=), one of them")
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", label):
            raise ProviderError(f"CloudLabProvider: label must be letters, digits, . _ -, "
                                f"not {label!r}")
        self._label = label
        self.nodes_per_block = _count("nodes_per_block", nodes_per_block, 1)
        self.init_blocks = _count("init_blocks", init_blocks, 0)
        self.min_blocks = _count("min_blocks", min_blocks, 0)
        self.max_blocks = _count("max_blocks", max_blocks, max(1, self.min_blocks))
        if self.init_blocks > self.max_blocks:
            raise ProviderError(f"CloudLabProvider: init_blocks ({init_blocks}) is more than "
                                f"max_blocks ({max_blocks})")
        if isinstance(parallelism, bool) or not isinstance(parallelism, (int, float)) \
                or not 0 <= parallelism <= 1:
            raise ProviderError(f"CloudLabProvider: parallelism must be between 0 and 1, "
                                f"not {parallelism!r}")
        self.parallelism = float(parallelism)
        self.max_nodes = _count("max_nodes", max_nodes if max_nodes is not None
                                else self.max_blocks * self.nodes_per_block, 1)
        self.cores_per_node = None if cores_per_node is None else _count(
            "cores_per_node", cores_per_node, 1)
        self.mem_per_node: float | None = None
        self.margin = _seconds("margin", margin)
        self._polling = _seconds("status_polling_interval", status_polling_interval,
                                 positive=True)
        self.endpoint_port = _count("endpoint_port", endpoint_port, 0)
        self.server, self.config_path = server, config
        self.state_dir = Path(state_dir if state_dir is not None
                              else Path("~/.elasticslice/parsl") / label).expanduser()
        self.hardware_type, self.disk_image = hardware_type, disk_image
        self.image_python, self.listen, self.public_url = image_python, listen, public_url
        if node_python is not None and not is_command(node_python):
            raise ProviderError(f"CloudLabProvider: node_python must be the image's Python "
                                f"command (e.g. python3), not {node_python!r}")
        self.node_python = node_python
        self.intervals = {**DEFAULT_INTERVALS, **(intervals or {})}
        self.keep = keep
        self.script_dir: str | None = None   # Parsl sets it; nothing is written there
        self.resources: dict[object, Any] = {}
        self.book = BlockBook()
        #: the HighThroughputExecutor (default: found in parsl.dfk() by its provider)
        self.executor: Any = None
        self.manager: ParslSliceManager | None = None
        self.publisher: Any = None
        self.helper: ParslNodeHelper | None = None
        self._published: Any = None
        self.wheelroot: Any = None  # the nodes' software, a wheelhouse per node (closed
        # with the publisher)
        self.publish_port = None if publish_port is None else _count(
            "publish_port", publish_port, 0)
        #: nodes that failed to start, with the cause their start script sent
        self.failures = NodeFailures()
        #: the enrolment service of the nodes (started with the manager)
        self.enrolment: Any = None
        #: the nodes' keys allowed at the executor's interchange (None: not encrypted)
        self.keys: AuthorisedKeys | None = None
        self._lock = threading.Lock()
        self._lockfile: Any = None
        self._own_server = False
        self._closed = False

    def __repr__(self) -> str:  # Parsl logs its config with it
        return (f"CloudLabProvider(label={self.label!r}, nodes_per_block={self.nodes_per_block}, "
                f"init_blocks={self.init_blocks}, min_blocks={self.min_blocks}, "
                f"max_blocks={self.max_blocks}, state_dir={str(self.state_dir)!r})")

    # ------------------------------------------------------------------ Parsl's interface
    @property
    def label(self) -> str:
        return self._label

    @property
    def status_polling_interval(self) -> float:
        return self._polling

    @property
    def address(self) -> str:
        """Where the nodes reach this machine, and so where the executor's interchange
        must listen (``HighThroughputExecutor(address=provider.address)``): ``listen``,
        else the config's ``[pilots] listen`` (the box writes its control address there),
        else the address that routes to the CM (:func:`~elasticslice.config.default_listen`)."""
        if self.listen is None:
            from elasticslice.config import load_config
            from elasticslice.pilots.helper import pilots_listen
            self.listen = pilots_listen(self.server if self.server is not None else
                                        types.SimpleNamespace(config=load_config(
                                            self.config_path)))
        return self.listen

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.auto") -> str:
        """A block of ``nodes_per_block`` nodes that run ``command``; its job id."""
        if not isinstance(command, str) or not command.strip():
            raise ProviderError("CloudLabProvider.submit: the worker command is empty")
        command = self._node_command(command)
        self._ensure_started()
        assert self.manager is not None
        job_id = f"{self.label}-{uuid.uuid4().hex[:8]}"
        match = _BLOCK_ID.search(command)
        block = Block(job_id, job_name, command, self.nodes_per_block,
                      block_id=match.group(1) if match else None)
        self.book.add(block)
        self.resources[job_id] = {"job_id": job_id, "job_name": job_name,
                                  "block_id": block.block_id}
        log.info("block %s (%s): %d node(s) asked for", job_id, job_name, block.size)
        self.manager.wake("ensure_sliver", "add_nodes")
        return job_id

    @property
    def interchange_launch_cmd(self) -> list[str]:
        """The executor's ``interchange_launch_cmd``: Parsl's interchange, which allows each
        node's key once it is authorised (:func:`elasticslice.parslkeys.interchange_main`)."""
        return [sys.executable, "-m", "elasticslice.parslkeys", "interchange"]

    def _node_command(self, command: str) -> str:
        """The worker command as a node runs it: an encrypted pool's ``--cert_dir`` is the
        node's own key folder; an unencrypted one only on loopback (else ProviderError)."""
        found = _CERT_DIR.search(command)
        if found is None or found.group(1) == "None":
            where = _ADDRESSES.search(command)
            addresses = where.group(1).split(",") if where else [self.address]
            exposed = [a for a in addresses if not is_loopback(a)]
            if exposed:
                raise ProviderError(
                    f"CloudLabProvider: HighThroughputExecutor(encrypted=False) would serve "
                    f"Parsl's interchange in the clear on {exposed[0]}, where anyone who "
                    f"reaches it can take the tasks and send it pickles: keep Parsl's "
                    f"default encrypted=True (unencrypted is for loopback only)")
            return command
        cert_dir = Path(found.group(1))
        if not (cert_dir / "server.key").is_file():
            raise ProviderError(f"CloudLabProvider: the executor's key folder {cert_dir} has "
                                f"no server.key: is this the executor's command?")
        executor = self._find_executor()
        launch = list(getattr(executor, "interchange_launch_cmd", None) or [])
        if executor is not None and launch[-2:] != self.interchange_launch_cmd[-2:]:
            raise ProviderError(
                "CloudLabProvider: the executor's interchange reads its nodes' keys only "
                "when it starts: pass interchange_launch_cmd=provider.interchange_launch_cmd "
                "to HighThroughputExecutor")
        self.keys = AuthorisedKeys(cert_dir)
        return command[:found.start()] + f"--cert_dir {NODE_KEYS}" + command[found.end():]

    def _on_key(self, client_id: str, public_key: str) -> dict[str, str]:
        """A node enrolled and sends its public key: allowed at the interchange while its
        block wants it (a ValueError: refused, its line goes to the node)."""
        keys = self.keys
        if keys is None:
            raise ValueError("the executor is not encrypted: no key to authorise")
        if not self.book.wanted(client_id):
            raise ValueError(f"{client_id} is in no live Parsl block")
        return keys.authorise(client_id, public_key)

    def _on_gone(self, client_id: str) -> None:
        if self.keys is not None:
            self.keys.withdraw(client_id)

    def _is_held(self, client_id: str) -> bool:
        manager = self.manager
        return manager is not None and manager.holdings.holds(client_id)

    def _address_of(self, client_id: str) -> str | None:
        manager = self.manager
        return manager.holdings.address_of(client_id) if manager is not None else None

    def status(self, job_ids: Sequence[object]) -> list[JobStatus]:
        return [self._status(str(j)) for j in job_ids]

    def cancel(self, job_ids: Sequence[object]) -> list[bool]:
        """Each block's nodes go back (a draining block's once drained)."""
        out = []
        for job_id in job_ids:
            block = self.book.get(str(job_id))
            if block is None:
                out.append(False)
                continue
            if block.state is not BlockState.DRAINING:
                self.book.set_state(block, BlockState.CANCELLED, "cancelled by Parsl")
            out.append(True)
        if self.manager is not None:
            self.manager.wake("delete_nodes")
        return out

    def _status(self, job_id: str) -> JobStatus:
        block = self.book.get(job_id)
        if block is None:
            return JobStatus(JobState.UNKNOWN, f"no block {job_id} here")
        states = [self._node_state(cid) for cid in list(block.nodes)]
        state = job_state(block.state, states, block.open_slots)
        message = block.message
        if state is JobState.TIMEOUT:
            message = "every node of the block was taken by CloudLab"
        elif state is JobState.FAILED:
            message = "every node of the block failed to boot"
        return JobStatus(state, message)

    def _node_state(self, client_id: str) -> NodeState | None:
        manager = self.manager
        if manager is None:
            return NodeState.NOTREADY
        for cm in manager.cmlist:
            rec = manager.state.node(cm, client_id)
            if rec is not None:
                return None if rec.gone_at is not None else NodeState.from_cm(rec.state)
        return NodeState.NOTREADY  # being added

    # ------------------------------------------------------------------ running
    def _find_executor(self) -> Any:
        if self.executor is None:
            try:
                import parsl
                kernel = parsl.dfk()
            except Exception:  # noqa: BLE001 - no Parsl loaded: nothing to drain
                return None
            self.executor = next((e for e in kernel.executors.values()
                                  if getattr(e, "provider", None) is self), None)
        return self.executor

    def _ensure_started(self) -> None:
        with self._lock:
            if self._closed:
                raise ProviderError("CloudLabProvider: closed; make a new one")
            if self.manager is None:
                try:
                    self._start()
                except BaseException:
                    self._stop(give_back=False)
                    raise

    def _start(self) -> None:
        from elasticslice.managers.statedir import StateDirLock
        from elasticslice.pilots.ca import ClusterCA
        from elasticslice.pilots.enrol import EnrolmentService
        from elasticslice.pilots.slicetar import PublishedSlice
        from troy.frameworks.dask import DenyList
        if self.server is None:
            from elasticslice.config import load_config
            from elasticslice.rpc.client import ProtoGeniServer
            self.server = ProtoGeniServer(load_config(self.config_path))
            self._own_server = True
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise ProviderError(f"{self.state_dir}: cannot use it as the provider's state "
                                f"directory: {err.strerror or err}") from err
        self._lockfile = StateDirLock(self.state_dir / "state").acquire()
        self._published = PublishedSlice(self.state_dir, self.address,
                                         port=self.publish_port, public_url=self.public_url)
        self.publisher = self._published.start()
        token = self._published.token
        ca = ClusterCA.open(self.state_dir / "pki")
        # a token only from its node's manifest address; a node's certificates denied
        # once it left (the same rules as the pilots': elasticslice.pilots.enrol)
        self.enrolment = EnrolmentService(
            ca, self.address, 0, is_held=self._is_held, address_of=self._address_of,
            on_enrolled=self._enrolled, deny=DenyList(self.state_dir / "denied-certs.json"),
            on_key=self._on_key).start()
        helper = ParslNodeHelper(
            self.book, self.publisher, self.state_dir / "tarballs", self._node_software(),
            cores=self.cores_per_node, server=self.server, image_urn=self.disk_image,
            nodetype=self.hardware_type, token=token, failures=self.failures,
            report_url=self.publisher.accept_reports("report", self._on_report, token=token),
            ca=ca, enrolment=self.enrolment, on_gone=self._on_gone,
            enrol_url=f"https://{_url_host(self.address)}:{self.enrolment.bound_port}")
        self.helper = helper
        helper.tarball_url()  # served before any sliver change: the CM fetches it again
        self.manager = ParslSliceManager(
            self.server, book=self.book, executor=self._find_executor, margin=self.margin,
            minthreshold=0, maxthreshold=self.max_nodes, manage_intervals=self.intervals,
            retry_interval=1.0, nodetype=self.hardware_type, enable_delete=True,
            email=False, helper=helper, state_dir=self.state_dir / "state",
            policy=PolicyConfig(idle_timeout=float("inf")),
            endpoint=EndpointConfig(address=self.address, port=self.endpoint_port))
        self.manager.start()
        atexit.register(self.close)
        log.info("CloudLab provider %s: state in %s", self.label, self.state_dir)

    def _enrolled(self, client_id: str) -> None:
        helper = self.helper
        if helper is not None:
            helper.enrolled(client_id)

    def _on_report(self, data: dict[str, Any], peer: str) -> None:
        """A node's start failed, it says why (a claim: the CM's status decides)."""
        client_id = data.get("client_id")
        manager = self.manager
        if isinstance(client_id, str) and manager is not None and \
                manager.holdings.holds(client_id) and \
                self.failures.report(client_id, data.get("line")):
            manager.wake("update_sliver_status")

    def _node_software(self) -> str:
        """sh lines building the nodes' environment (the agent's wheelhouse and Parsl: each
        node gets the wheelhouse of its own Python and machine), or naming the image's
        Python that has Parsl (``node_python``)."""
        from elasticslice.config import cm_is_local
        from elasticslice.pilots.bootstrap import env_script
        from elasticslice.pilots.ca import ClusterCA
        from elasticslice.pilots.wheelroot import serve_for_image
        if self.node_python is not None:
            return env_script(None, python=self.node_python)
        # the nodes verify their software against this CA (its certificate in start.sh)
        ca = ClusterCA.open(self.state_dir / "pki")
        urls = list(getattr(getattr(self.server, "config", None), "cm_urls", None) or [])
        self.wheelroot, url = serve_for_image(
            self.publisher, image_urn=self.disk_image, image_python=self.image_python,
            cm_local=bool(urls) and all(map(cm_is_local, urls)), extra=("parsl",),
            token=self._published.token, ca=ca, keep=self.state_dir / "wheelhouse.json")
        self._published.serving.append(self.wheelroot)
        return env_script(url, target=f"{INSTALL_PATH}/env", ca=ca.cert_pem)

    def stats(self) -> dict[str, int]:
        """revocations, early_releases, forced_releases, blocks (submitted)."""
        out = self.manager.stats() if self.manager is not None else {
            "revocations": 0, "early_releases": 0, "forced_releases": 0}
        out["blocks"] = len(self.book.blocks)
        return out

    def close(self) -> None:
        """Stop the manager and give the slice back (unless ``keep``). Idempotent."""
        with self._lock:
            self._closed = True
            self._stop(give_back=not self.keep)

    def __enter__(self) -> CloudLabProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop(self, *, give_back: bool) -> None:
        manager, self.manager = self.manager, None
        try:
            if manager is not None:
                manager.stop()
                if give_back:
                    for cm in manager.cms:
                        try:
                            cm.delete_slice(cancel=True)
                        except ElasticSliceError as err:
                            log.warning("cannot give the slice back at %s: %s", cm.url, err)
                manager.state.close()
        finally:
            if self.helper is not None:
                self.helper.close(remove=manager is not None and give_back)
                self.helper = None
            if self.enrolment is not None:
                self.enrolment.stop()
                self.enrolment = None
            if self.keys is not None and give_back:  # no node of ours is left
                for client_id in self.keys.allowed():
                    self.keys.withdraw(client_id)
            if self._published is not None:
                self._published.stop()
                self._published = None
            self.publisher = None
            self.wheelroot = None  # closed with the publisher
            lock, self._lockfile = self._lockfile, None
            if lock is not None:
                lock.release()
            if self._own_server and self.server is not None:
                self.server.close()
                self.server, self._own_server = None, False
