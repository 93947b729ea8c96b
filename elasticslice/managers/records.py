"""The records of the manager's state (:mod:`elasticslice.managers.state`): frozen
dataclasses, plus the state's error and the intent log's kinds and outcomes."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from elasticslice.errors import ElasticSliceError


class StateError(ElasticSliceError):
    """The manager's state directory cannot be opened, read or written."""


class IntentKind(str, Enum):
    ADD = "add"
    DELETE = "delete"


class IntentOutcome(str, Enum):
    DONE = "done"
    FAILED = "failed"
    RECONCILED = "reconciled"


@dataclass(frozen=True)
class SliceRecord:
    urn: str
    expires: float | None
    updated: float | None


@dataclass(frozen=True)
class SliverRecord:
    cm: str
    urn: str | None
    expires: float | None
    status: str | None
    updated: float | None


@dataclass(frozen=True)
class NodeRecord:
    """A node as last seen; ``value`` and ``pending_deadline`` come from CloudLab's calls."""

    cm: str
    client_id: str
    node_id: str | None
    hostname: str | None
    state: str
    initial: bool
    added_at: float
    gone_at: float | None = None
    value: float | None = None
    pending_deadline: float | None = None   # the open NotifyDeletePending's deadline
    gone_reason: str | None = None
    ipv4: str | None = None                 # its control address, as its manifest says


@dataclass(frozen=True)
class PendingDelete:
    """One revocation: CloudLab takes ``node_id`` back by ``deadline`` (the first notice's
    arrival plus its max_wait_time, brought earlier by the countdown). ``released``: when
    we were done with the node (answered max_wait_time 0 from then on); ``finished``: when
    it left the slice; ``outcome``: early or forced."""

    cm: str
    node_id: str
    client_id: str | None
    deadline: float
    first_seen: float
    finished: float | None = None
    outcome: str | None = None
    released: float | None = None
    note: str | None = None
    id: int = 0
    last_seen: float | None = None


class ReleaseSource(str, Enum):
    """Why a node is to be given back: the policy chose it (a victim, or a node it replaces),
    or CloudLab revoked it and we are done with it (drained, no pilot on it, its delete
    commands finished)."""

    POLICY = "policy"
    NOTICE = "notice"


@dataclass(frozen=True)
class Release:
    """A node to give back (``to_release``): asked at ``asked``, given back by the
    actuator's next DeleteNodes at ``cm``."""

    cm: str
    client_id: str
    node_id: str | None
    source: str
    reason: str
    asked: float
    id: int = 0


@dataclass(frozen=True)
class Intent:
    id: int
    kind: str
    cm: str
    client_ids: tuple[str, ...]
    created: float
    finished: float | None = None
    outcome: str | None = None


@dataclass(frozen=True)
class CycleRecord:
    """One cycle method's runs. ``last_error`` is the most recent failure (kept after a later
    success, with ``last_error_at``); ``failures`` counts consecutive ones (0: healthy)."""

    method: str
    last_run: float | None
    last_ok: float | None
    next_run: float | None
    last_error: str | None
    failures: int
    last_error_at: float | None = None
    runs: int = 0
    last_duration: float | None = None
