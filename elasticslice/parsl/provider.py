"""``CloudLabProvider``: Parsl's ``ExecutionProvider`` whose blocks are CloudLab nodes, a thin
adapter in Parsl's style: Parsl's blocks in (``submit``, ``cancel``), their states out
(``status``). The nodes are held by the provider's manager daemon, another process
(:mod:`elasticslice.parsl.daemon`), the only one that opens the CloudLab credentials and
the CA's key; this one, where Parsl unpickles what nodes send, tells it the blocks over the
local channel (:class:`~elasticslice.parsl.link.BlockLink`) and holds a block's managers at
the interchange when a notice comes (see :mod:`elasticslice.parsl`)."""
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

from elasticslice.channel import ChannelError
from elasticslice.errors import ElasticSliceError
from elasticslice.managers.cycle import PARSL_INTERVALS
from elasticslice.managers.policy import NodeState
from elasticslice.parsl.blocks import Block, BlockBook, BlockState, job_state
from elasticslice.parsl.daemon import LOG_FILE, ParslDaemonCommand
from elasticslice.parsl.drain import BlockHolder
from elasticslice.parsl.keys import AuthorisedKeys
from elasticslice.parsl.link import BlockLink
from elasticslice.parsl.node import CommandRefused, node_command
from elasticslice.pilots.daemonkit import lock_pid, open_view
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

    ``config``: the path of the client config file, or ``server``: a ``ProtoGeniServer``
    (its config file is used); the provider's manager daemon opens it, in a process of its
    own: with ``config``, this process (where Parsl unpickles what nodes send) never opens
    the CloudLab credentials. ``state_dir``: the daemon's files (default
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
    Nodes that failed to start are named with their cause in :attr:`failures`; the
    daemon's state is :meth:`view` (read-only), its log ``<state_dir>/daemon.log``."""

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
        #: the channel to the manager daemon (None: not started)
        self.link: BlockLink | None = None
        #: holds a block's managers when the daemon asks (a notice)
        self.holder = BlockHolder(self.book, self._find_executor, self._answer)
        self.publish_port = None if publish_port is None else _count(
            "publish_port", publish_port, 0)
        #: nodes that failed to start, with the cause their start script sent
        self.failures = NodeFailures()
        #: the nodes' keys allowed at the executor's interchange (None: not encrypted;
        #: the daemon writes them, this process only lists them)
        self.keys: AuthorisedKeys | None = None
        self._lock = threading.Lock()
        self._view: Any = None
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
                                            self.config_path, open_files=False)))
        return self.listen

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.auto") -> str:
        """A block of ``nodes_per_block`` nodes that run ``command``; its job id."""
        if not isinstance(command, str) or not command.strip():
            raise ProviderError("CloudLabProvider.submit: the worker command is empty")
        command = self._node_command(command)
        job_id = f"{self.label}-{uuid.uuid4().hex[:8]}"
        match = _BLOCK_ID.search(command)
        block = Block(job_id, job_name, command, self.nodes_per_block,
                      block_id=match.group(1) if match else None)
        # in the book first: the daemon starts its manager once it heard the blocks, and
        # the slivers it makes then (one per CM) bind their first nodes to this one
        self.book.add(block)
        try:
            self._ensure_started()
        except BaseException:
            self.book.forget(job_id)
            raise
        assert self.link is not None
        self.resources[job_id] = {"job_id": job_id, "job_name": job_name,
                                  "block_id": block.block_id}
        log.info("block %s (%s): %d node(s) asked for", job_id, job_name, block.size)
        self.link.send_blocks()
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
        if self.link is not None:
            self.link.send_blocks()
        return out

    def _status(self, job_id: str) -> JobStatus:
        block = self.book.get(job_id)
        if block is None:
            return JobStatus(JobState.UNKNOWN, f"no block {job_id} here")
        link = self.link
        if link is not None and link.fatal and not block.over:   # nobody holds its nodes
            return JobStatus(JobState.FAILED, f"the manager daemon stopped: {link.fatal}")
        # each node's state as the daemon told it (daemon.node_state); NOTREADY until it did
        states = [block.node_states.get(cid, NodeState.NOTREADY) for cid in list(block.nodes)]
        state = job_state(block.state, states, block.open_slots)
        message = block.message
        if state is JobState.TIMEOUT:
            message = "every node of the block was taken by CloudLab"
        elif state is JobState.FAILED:
            message = "every node of the block failed to boot"
        return JobStatus(state, message)

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
            if self.link is None:
                try:
                    self._start()
                except BaseException:
                    self._stop(give_back=False)
                    raise
            if self.link.fatal:   # the daemon refused this provider for good
                raise ProviderError(f"CloudLabProvider: {self.link.fatal} (see "
                                    f"{self.state_dir / LOG_FILE})")

    def _config_file(self) -> str:
        if self.config_path is not None:
            return str(self.config_path)
        path = getattr(getattr(self.server, "config", None), "path", None)
        if path is None:
            raise ProviderError("CloudLabProvider: the server's config was not read from a "
                                "file, which the manager daemon needs: pass config=")
        return str(path)

    def _daemon_command(self) -> ParslDaemonCommand:
        arguments = {
            "max_nodes": self.max_nodes, "hardware_type": self.hardware_type,
            "disk_image": self.disk_image, "image_python": self.image_python,
            "node_python": self.node_python, "cores_per_node": self.cores_per_node,
            "margin": self.margin, "listen": self.address, "public_url": self.public_url,
            "endpoint_port": self.endpoint_port, "intervals": dict(self.intervals),
            "publish_port": self.publish_port}
        env = {}
        cache = getattr(getattr(self.server, "config", None), "credential_cache_dir", None)
        if cache is not None:   # the server's own: the daemon caches credentials there too
            env["ELASTICSLICE_CREDENTIAL_CACHE_DIR"] = str(cache)
        return ParslDaemonCommand(self._config_file(), arguments, env)

    def _start(self) -> None:
        """The manager daemon (it checks the config, then makes the state directory), and
        the link to it; ProviderError with its one line if it cannot start."""
        self.holder.stop.clear()   # a start that failed before stopped it
        try:
            link = BlockLink(self.state_dir, self._daemon_command(),
                             blocks=self._blocks_frame, on_bound=self._on_bound,
                             on_drain=self.holder.ask, on_failures=self.failures.merge)
            self.link = link
            link.open()
        except (ElasticSliceError, ChannelError) as err:
            log_file = self.state_dir / LOG_FILE
            see = f" (see {log_file})" if log_file.exists() else ""
            raise ProviderError(f"CloudLabProvider: {err}{see}") from None
        atexit.register(self.close)
        log.info("CloudLab provider %s: state in %s, manager daemon %s", self.label,
                 self.state_dir, self.daemon_pid)

    # ------------------------------------------------------------------ the daemon's word
    def _blocks_frame(self) -> dict[str, Any]:
        """The blocks Parsl wants (one the daemon no longer hears of was cancelled)."""
        blocks = [{"job_id": b.job_id, "name": b.name, "command": b.command, "size": b.size,
                   "block_id": b.block_id, "state": b.state.value, "nodes": list(b.nodes)}
                  for b in list(self.book.blocks.values()) if not b.over]
        key_dir = str(self.keys.cert_dir) if self.keys is not None else None
        return {"blocks": blocks, "key_dir": key_dir}

    def _on_bound(self, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            try:
                state = BlockState(entry["state"])
                states = [None if s is None else NodeState(s) for s in entry["states"]]
            except ValueError:
                log.warning("the manager daemon told an unknown state of %s", entry["job_id"])
                continue
            self.book.sync(entry["job_id"], entry["nodes"], states, state, entry.get("message"))

    def _answer(self, job_id: str, why: str) -> None:
        link = self.link
        if link is not None:
            link.send("block_drained", job_id=job_id, why=why[:1000])

    # ------------------------------------------------------------------ looking
    @property
    def daemon_pid(self) -> int | None:
        """The manager daemon's pid, as the state directory's lock says (None: none)."""
        return lock_pid(self.state_dir)

    def view(self) -> Any:
        """The daemon's state, read-only (a :class:`~elasticslice.pilots.snapshot.StateView`;
        None: none yet)."""
        if self._view is None:
            self._view = open_view(self.state_dir)
        return self._view

    def stats(self) -> dict[str, int]:
        """revocations, early_releases, forced_releases (from the daemon's state), blocks
        (submitted)."""
        view = self.view()
        found = view.stats() if view is not None else {}
        out = {key: int(found.get(key, 0)) for key in
               ("revocations", "early_releases", "forced_releases")}
        out["blocks"] = len(self.book.blocks)
        return out

    # ------------------------------------------------------------------ stopping
    def close(self) -> None:
        """Stop the manager daemon, which gives the slice back (unless ``keep``). Idempotent."""
        with self._lock:
            self._closed = True
            self._stop(give_back=not self.keep)

    def __enter__(self) -> CloudLabProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop(self, *, give_back: bool) -> None:
        self.holder.stop.set()
        link, self.link = self.link, None
        try:
            if link is not None and link.channel is not None and \
                    not link.close_daemon(give_back) and not link.fatal:
                log.warning("the manager daemon did not say it stopped: see %s",
                            self.state_dir / LOG_FILE)
        finally:
            if link is not None:
                link.close()
            if self._view is not None:
                self._view.state.close()
                self._view = None
