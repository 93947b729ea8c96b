"""``troy run --store FILE``: a run that survives its process, and resumes.

The store is the session's SQLite store (``troy.store``): every unit and the dispatched
workload are in it. ``troy run`` also keeps, under the meta key ``troy run``, which workload
file it runs (path, SHA-256 of its content, ``--time-scale``) and the workload's id. Running
again with the same store:

- no record yet (a new or empty store, or a run killed before it dispatched): a fresh run;
- a record of the same file: the workload is rebuilt from the store with the same task and
  unit ids (``Session.resume_workload``); units that ended keep their state (a DONE task is
  not run again), the others are dispatched again once pilots run (``troy.WorkloadRun``
  provisions the pilots and waits for them);
- a record of another file, or workloads that ``troy run`` did not start: a ``UsageError``.

``run_session`` closes the store before the session: a run interrupted (Ctrl-C, a timeout)
leaves its unfinished units unfinished in the store (the session's close would record them
CANCELED), so the next run picks them up.
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from troy.errors import UsageError
from troy.states import State
from troy.store import StoreError

if TYPE_CHECKING:
    from troy.session import Session
    from troy.workload import Workload

log = logging.getLogger(__name__)

META_KEY = "troy run"


@dataclass
class RunRecord:
    """What ``troy run --store`` keeps to recognise its own run."""

    file: str
    sha256: str
    time_scale: float
    workload: str


def file_digest(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def run_session(store: str | None, config: dict[str, Any] | None = None
                ) -> Iterator[Session]:
    """A session on ``store`` (None: a temporary one) whose store is closed first at the
    end, so that closing frameworks does not record unfinished units CANCELED."""
    import troy
    session = troy.Session(store_path=store, config=config or None)
    try:
        yield session
    finally:
        session.close(keep_unfinished=store is not None)


def prepare(session: Session, store: str, file: str, workload: Workload,
            time_scale: float) -> Workload | None:
    """Check ``store`` against the workload file being run. Returns the workload rebuilt
    from the store (units in flight dispatched again) when this is a resumed run, else
    None after recording this run (``workload`` is the fresh one it will dispatch)."""
    try:
        record = session.store.get_meta(META_KEY)
        known = session.store.workloads()
    except StoreError as err:
        raise UsageError(f"--store {store}: not a Troy store ({_reason(err)})") from None
    digest = file_digest(file)
    if record is None and known:
        raise UsageError(f"--store {store}: holds workload(s) that troy run did not start; "
                         f"give a new --store")
    if record is not None:
        old = RunRecord(**record)
        if old.sha256 != digest:
            raise UsageError(f"--store {store}: a run of another workload file ({old.file}); "
                             f"give that file, or a new --store for {file}")
        if old.time_scale != time_scale:
            raise UsageError(f"--store {store}: its run has --time-scale {old.time_scale:g}, "
                             f"not {time_scale:g}; resume with the same --time-scale")
        spec = session.store.workload_spec(old.workload)
        if spec is not None:
            return _rebuild(session, old.workload, spec)
    session.store.set_meta(META_KEY, asdict(RunRecord(os.path.abspath(file), digest,
                                                      time_scale, workload.id)))
    return None


def _reason(err: StoreError) -> str:
    text = str(err)
    return text.rsplit(": ", 1)[-1] if ": " in text else text


def _rebuild(session: Session, wid: str, spec: dict[str, Any]) -> Workload:
    """The stored workload ``wid``, rebuilt; its unfinished units dispatched again."""
    return session.resume_workload(wid)


def resume_line(workload: Workload) -> str:
    """"resuming: 12/58 tasks already done" (and the failed and canceled ones, if any)."""
    states = [t.state for t in workload.tasks.values()]
    done = sum(s is State.DONE for s in states)
    extra = [f"{n} {name}" for n, name in ((sum(s is State.FAILED for s in states), "failed"),
                                           (sum(s is State.CANCELED for s in states),
                                            "canceled")) if n]
    return (f"resuming: {done}/{len(states)} tasks already done"
            + (f" ({', '.join(extra)}: not run again)" if extra else ""))
