"""Several CMs in one slice: each CM's methods fail, and back off, on their own.

A slice of CloudLab's clusters holds a sliver at each CM of ``cmlist``; the methods that
act at a CM (:data:`CM_METHODS`: ``ensure_sliver``, ``update_sliver_status``,
``update_available``, ``update_all``, ``add_nodes``, ``delete_nodes``) run their work at
each CM in turn. :class:`Sites` keeps a CM that fails from holding up the others: a CM's
calls are tried twice at most (``ProtoGeniServer.fewer_retries``: the back-off below retries
them, not the call, which would hold the cycle's thread for minutes against CloudLab); its
failure is recorded against that CM and that method, the other CMs go on in the same run,
and until its own back-off has passed (``retry_interval``, doubling on each further failure,
never longer than the method's interval) the method leaves that CM alone. While a CM's
``add_nodes`` backs off, the policy grows the slice at the other CMs (``Observed.paused``).
The method still fails (one error naming each CM that failed), so ``status``, mail and
``manage --once`` say so; what changed at the other CMs still wakes what it triggers.
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ContextManager

from elasticslice.errors import ElasticSliceError, TransportError
from elasticslice.managers.cycle import MAX_BACKOFF_FACTOR, one_line
from elasticslice.rpc.codes import TRANSIENT_CODES

log = logging.getLogger("elasticslice.managers.manager")

#: the seed's methods that take a ``cm`` (``SimpleElasticSliceManager.CM_METHODS``)
CM_METHODS = ("ensure_sliver", "update_sliver_status", "update_available", "update_all",
              "add_nodes", "delete_nodes")


def cm_name(url: str) -> str:
    """A CM's short name, for lines, status and metric labels: a box's cluster
    (``.../cluster/NAME/...``), else the URL's host (``www.utah.cloudlab.us``)."""
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    segments = parts.path.split("/")
    if "cluster" in segments[:-1]:
        return segments[segments.index("cluster") + 1] or url
    return parts.hostname or url


def transient(err: BaseException) -> bool:
    """A CM down, unreachable or BUSY (what passes), not a refusal of what was asked."""
    return isinstance(err, TransportError) or getattr(err, "code", None) in TRANSIENT_CODES


#: the state's meta key of what fails at each CM now (:meth:`Sites._save`)
BACKOFF_KEY = "sites.failing"


class SitesFailed(ElasticSliceError):
    """A method failed at some CMs (the others went on): ``failed`` maps each CM's URL to
    its error, ``result`` is what the method did at the others."""

    def __init__(self, method: str, failed: Mapping[str, BaseException], result: Any) -> None:
        self.failed = dict(failed)
        self.result = result
        text = "; ".join(f"{cm_name(url)}: {one_line(err)}" for url, err in failed.items())
        super().__init__(f"{method} failed at {len(failed)} CM(s): {text}")


@dataclass
class SiteRun:
    """One method at one CM: its failures in a row, its last error, when it may run again."""

    failures: int = 0
    last_error: str | None = None
    retry_at: float | None = None


class Sites:
    """Each (method, CM)'s failures and back-off (the module's doc). ``intervals``: the
    methods' intervals (the back-off's cap), ``clock``: the manager's."""

    def __init__(self, *, retry_interval: float, intervals: Mapping[str, float],
                 clock: Callable[[], float],
                 quick: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
                 state: Any = None) -> None:
        self.retry_interval = max(0.01, float(retry_interval))
        self.state = state   # where status reads what fails at each CM (meta BACKOFF_KEY)
        self.quick = quick   # a CM's calls among several: few retries (the back-off's job)
        self.intervals = dict(intervals)
        self.clock = clock
        self._runs: dict[tuple[str, str], SiteRun] = {}
        self._lock = threading.Lock()
        with self._lock:
            self._save()   # what a manager of this state saw failing before is past

    def each(self, method: str, cms: Iterable[Any], work: Callable[[Any], Any],
             add: Callable[[Any, Any], Any] = lambda a, b: (a or 0) + (b or 0)) -> Any:
        """``work(cm)`` at each of ``cms`` whose back-off for ``method`` has passed, the
        results summed (``add``); a CM that raises is recorded and the others go on, then
        :class:`SitesFailed` names them. One CM (asked alone, or the only one) is just
        ``work(cm)``: its error is its own, the cycle's back-off its back-off."""
        cms = list(cms)
        if len(cms) == 1:   # one CM (asked alone, or the only one): as the cycle runs it
            return add(None, work(cms[0]))
        result: Any = None
        failed: dict[str, BaseException] = {}
        for cm in cms:
            if self.waiting(method, cm.url):
                log.debug("%s at %s: backing off until its retry", method, cm.url)
                continue
            try:
                with self.quick():
                    done = work(cm)
                result = add(result, done)
            except Exception as err:
                self.failed(method, cm.url, err)
                failed[cm.url] = err
            else:
                self.succeeded(method, cm.url)
        if failed:
            raise SitesFailed(method, failed, result)
        return result

    def failed(self, method: str, url: str, err: BaseException) -> None:
        with self._lock:
            run = self._runs.setdefault((method, url), SiteRun())
            run.failures += 1
            run.last_error = f"{type(err).__name__}: {one_line(err)}"
            cap = max(self.retry_interval, min(self.intervals.get(method, 60.0),
                                               self.retry_interval * MAX_BACKOFF_FACTOR))
            delay = min(cap, self.retry_interval * 2 ** (run.failures - 1))
            # only a CM that is down or BUSY is left alone; one that refused what we asked
            # (a node taken meanwhile) is asked again at the next run
            run.retry_at = self.clock() + delay if transient(err) else None
            self._save()
        log.warning("%s at %s failed (%d in a row%s): %s", method, url, run.failures,
                    f"; this CM's next try in {delay:.0f} s, the other CMs go on"
                    if run.retry_at is not None else "", run.last_error)

    def succeeded(self, method: str, url: str) -> None:
        with self._lock:
            if self._runs.pop((method, url), None) is not None:
                self._save()

    def _save(self) -> None:
        """What fails at each CM now, for ``status`` (another process): CM URL -> method ->
        failures in a row, last error, next try (None: the next run). Under the lock."""
        if self.state is None:
            return
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (method, url), run in sorted(self._runs.items()):
            out.setdefault(url, {})[method] = {"failures": run.failures,
                                               "last_error": run.last_error,
                                               "retry_at": run.retry_at}
        try:
            self.state.set_meta(BACKOFF_KEY, json.dumps(out))
        except Exception as err:   # a status detail: never the method's failure
            log.debug("cannot record the CMs' failures: %s", err)

    def waiting(self, method: str, url: str) -> bool:
        """Whether ``method`` leaves the CM at ``url`` alone for now (its back-off)."""
        with self._lock:
            run = self._runs.get((method, url))
            return run is not None and run.retry_at is not None and run.retry_at > self.clock()

    def paused(self, method: str) -> frozenset[str]:
        """The CMs ``method`` backs off from now (``add_nodes``'s: where the policy does
        not add)."""
        with self._lock:
            keys = [url for (m, url), run in self._runs.items()
                    if m == method and run.retry_at is not None and run.retry_at > self.clock()]
        return frozenset(keys)


def site_counts(state: Any) -> dict[str, dict[str, Any]]:
    """Per CM of a manager's state (by :func:`cm_name`, in the order the state knows them):
    its URL, the nodes held there now (``nodes``) and ever (``held_ever``, the gone
    included), CloudLab's revocations there and how they ended (``early``, ``forced``)."""
    out: dict[str, dict[str, Any]] = {}

    def site(url: str) -> dict[str, Any]:
        return out.setdefault(cm_name(url), {"cm": url, "nodes": 0, "held_ever": 0,
                                             "revocations": 0, "early": 0, "forced": 0})
    for sliver in state.slivers():
        site(sliver.cm)
    for rec in state.nodes(include_gone=True):
        counts = site(rec.cm)
        counts["held_ever"] += 1
        counts["nodes"] += rec.gone_at is None
    for url, counts in state.revocations.counts_by_cm().items():
        for key in ("revocations", "early", "forced"):
            site(url)[key] += counts[key]
    try:
        failing = json.loads(state.get_meta(BACKOFF_KEY) or "{}")
    except ValueError:
        failing = {}
    for url, methods in failing.items():   # a manager of several CMs: what fails where
        site(url)["failing"] = methods
    return out


def sites_line(sites: Mapping[str, Mapping[str, Any]]) -> str:
    """``utah 3 nodes, 0 revoked; wisc 1 node, 1 revoked (1 early)`` (a live line's)."""
    def one(name: str, c: Mapping[str, Any]) -> str:
        ended = ", ".join(f"{c[k]} {k}" for k in ("early", "forced") if c[k])
        return (f"{name} {c['nodes']} node{'s' if c['nodes'] != 1 else ''}, "
                f"{c['revocations']} revoked" + (f" ({ended})" if ended else ""))
    return "; ".join(one(name, c) for name, c in sites.items())
