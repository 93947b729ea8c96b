"""``CloudLabProvider``: Parsl's ``ExecutionProvider`` whose blocks are CloudLab nodes, a thin
adapter in Parsl's style: Parsl's blocks in (``submit``, ``cancel``), their states out
(``status``); the nodes are the :class:`~elasticslice.parsl.manager.ParslSliceManager`'s
(see :mod:`elasticslice.parsl`)."""
from __future__ import annotations

import atexit
import logging
import re
import sys
import threading
import types
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parsl.jobs.states import JobState, JobStatus
from parsl.providers.base import ExecutionProvider

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.config import EndpointConfig
from elasticslice.managers.cycle import PARSL_INTERVALS
from elasticslice.managers.policy import NodeState
from elasticslice.parsl.blocks import Block, BlockBook, BlockState, job_state
from elasticslice.parsl.keys import AuthorisedKeys
from elasticslice.parsl.manager import ParslSliceManager
from elasticslice.parsl.node import (CommandRefused, ParslNodeHelper, node_command,
                                     node_software)
from elasticslice.pilots.failures import NodeFailures
from elasticslice.validate import is_command, is_count, is_seconds

log = logging.getLogger(__name__)

#: how often each cycle method runs (seconds): the cycle's table (managers/cycle.py)
DEFAULT_INTERVALS = PARSL_INTERVALS
_BLOCK_ID = re.compile(r"--block_id[= ](\S+)")


class ProviderError(ElasticSliceError, ValueError):
    """A CloudLabProvider argument or use that cannot work (one line saying why)."""


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
    provider; ``max_nodes``: the policy's ``maxthreshold``, nodes that count at most (not
    those leaving, revoked or failed; default ``max_blocks * nodes_per_block``).
    What a node is: ``hardware_type``, ``disk_image`` (default the CM's), ``image_python``
    (its ``python3``'s version; default known from the image), ``node_python`` (an image
    that already has Parsl, e.g. the box's ``ELASTICSLICE-PILOT``: the ``python3`` to run
    its worker pool with; default None: each node builds the environment from the
    wheelhouse the provider publishes), ``cores_per_node``
    (``PARSL_CORES`` on the node). ``margin``: seconds kept before a notice's deadline;
    ``listen``: where the tarball publisher, the nodes' enrolment service (their worker
    certificates and CurveZMQ keys: :mod:`elasticslice.parsl.keys`) and the callback endpoint
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
        self.helper: ParslNodeHelper | None = None
        #: the tarball publisher and the enrolment service (started with the manager)
        self.services: Any = None
        self.publish_port = None if publish_port is None else _count(
            "publish_port", publish_port, 0)
        #: nodes that failed to start, with the cause their start script sent
        self.failures = NodeFailures()
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
        node's key once it is authorised (:func:`elasticslice.parsl.keys.interchange_main`)."""
        return [sys.executable, "-m", "elasticslice.parsl.keys", "interchange"]

    def _node_command(self, command: str) -> str:
        """The worker command as a node runs it (:func:`~elasticslice.parsl.node.node_command`;
        ProviderError if it cannot be); an encrypted pool only with our interchange."""
        try:
            command, cert_dir = node_command(command, self.address)
        except CommandRefused as err:
            raise ProviderError(f"CloudLabProvider: {err}") from None
        if cert_dir is not None:
            executor = self._find_executor()
            launch = list(getattr(executor, "interchange_launch_cmd", None) or [])
            if executor is not None and launch[-2:] != self.interchange_launch_cmd[-2:]:
                raise ProviderError(
                    "CloudLabProvider: the executor's interchange reads its nodes' keys only "
                    "when it starts: pass interchange_launch_cmd=provider."
                    "interchange_launch_cmd to HighThroughputExecutor")
            self.keys = AuthorisedKeys(cert_dir)
        return command

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
            if rec is None:
                continue
            state = NodeState.from_cm(rec.state)
            # gone: taken (None), or given back after it failed to start (still failed)
            return state if rec.gone_at is None or state is NodeState.FAILED else None
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
        from elasticslice.managers.statedir import StateDirLock, make_state_dir
        from elasticslice.pilots.ca import ClusterCA
        from elasticslice.pilots.services import ControlServices
        if self.server is None:
            from elasticslice.config import load_config
            from elasticslice.rpc.client import ProtoGeniServer
            self.server = ProtoGeniServer(load_config(self.config_path))
            self._own_server = True
        try:
            make_state_dir(self.state_dir, "the provider's")
        except ElasticSliceError as err:
            raise ProviderError(str(err)) from err
        self._lockfile = StateDirLock(self.state_dir / "state").acquire()
        ca = ClusterCA.open(self.state_dir / "pki")
        # the pilots' services and rules: the slice's tarball at a URL kept across
        # restarts, a token only from its node's manifest address, a node's certificates
        # denied once it left (elasticslice.pilots.services)
        services = self.services = ControlServices(
            self.state_dir, ca, self.address, manager=lambda: self.manager,
            helper=lambda: self.helper, failures=self.failures, on_key=self._on_key,
            publish_port=self.publish_port, public_url=self.public_url).start()
        env_lines = node_software(services, server=self.server, node_python=self.node_python,
                                  disk_image=self.disk_image, image_python=self.image_python)
        helper = ParslNodeHelper(
            self.book, services.publisher, self.state_dir / "tarballs", env_lines,
            cores=self.cores_per_node, server=self.server, image_urn=self.disk_image,
            nodetype=self.hardware_type, token=services.token, failures=self.failures,
            report_url=services.report_url, ca=ca, enrolment=services.enrolment,
            on_gone=self._on_gone, enrol_url=services.enrol_url)
        self.helper = helper
        helper.tarball_url()  # served before any sliver change: the CM fetches it again
        self.manager = ParslSliceManager(
            self.server, book=self.book, executor=self._find_executor, margin=self.margin,
            minthreshold=0, maxthreshold=self.max_nodes, manage_intervals=self.intervals,
            retry_interval=1.0, nodetype=self.hardware_type, enable_delete=True,
            email=False, helper=helper, state_dir=self.state_dir / "state",
            endpoint=EndpointConfig(address=self.address, port=self.endpoint_port))
        self.manager.start()
        atexit.register(self.close)
        log.info("CloudLab provider %s: state in %s", self.label, self.state_dir)

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

    @property
    def publisher(self) -> Any:
        """The tarball publisher (None: not started)."""
        return self.services.publisher if self.services is not None else None

    @property
    def enrolment(self) -> Any:
        """The nodes' enrolment service (None: not started)."""
        return self.services.enrolment if self.services is not None else None

    def _stop(self, *, give_back: bool) -> None:
        manager, self.manager = self.manager, None
        try:
            if manager is not None:
                manager.stop()
                if give_back:
                    manager.actuator.give_back_slivers()
                manager.state.close()
        finally:
            if self.helper is not None:
                self.helper.close(remove=manager is not None and give_back)
                self.helper = None
            if self.keys is not None and give_back:  # no node of ours is left
                for client_id in self.keys.allowed():
                    self.keys.withdraw(client_id)
            services, self.services = self.services, None
            if services is not None:
                services.close(remove=manager is not None and give_back)
            lock, self._lockfile = self._lockfile, None
            if lock is not None:
                lock.release()
            if self._own_server and self.server is not None:
                self.server.close()
                self.server, self._own_server = None, False
