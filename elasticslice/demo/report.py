"""What the elastic demo tells: the live progress line, the event lines, the summary and
the report (``--report OUT.json``, and ``DIR/report.json`` always)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elasticslice.demo.console import Console, DemoError, rel

if TYPE_CHECKING:
    from troy.output import OutputKeeper

# The counters the cluster's stats() carries, with what the summary calls them.
COUNTERS = ("revocations", "early_releases", "forced_releases", "units_requeued",
            "duplicates", "nodes_peak", "node_seconds")


@dataclass
class Progress:
    """One look at the cluster and the workload (the progress line)."""

    elapsed: float
    nodes: int
    pilots: int
    queued: int
    running: int
    done: int
    total: int
    revocations: int
    sites: str = ""   # our nodes at each site (--sites): "utah 2, wisc 1"

    def line(self) -> str:
        where = f" ({self.sites})" if self.sites else ""
        return (f"{self.elapsed:5.1f}s  nodes {self.nodes}{where}  pilots {self.pilots}  units "
                f"queued {self.queued} running {self.running} done {self.done}/{self.total}"
                f"  revocations {self.revocations}")

    def key(self) -> tuple[int, ...]:
        return (self.nodes, self.pilots, self.queued, self.running, self.done,
                self.revocations)


@dataclass
class ProgressPrinter:
    """A terminal gets one line rewritten in place; a pipe gets a line when something
    changed (at most one per ``every`` seconds) and at least one per ``quiet_every``."""

    console: Console
    every: float = 2.0
    quiet_every: float = 10.0
    _last_at: float = -1e9
    _last_key: tuple[int, ...] = ()

    def show(self, p: Progress, final: bool = False) -> None:
        if self.console.tty:
            self.console.progress(p.line(), final)
            return
        changed = p.key() != self._last_key
        due = p.elapsed - self._last_at
        if final or (changed and due >= self.every) or due >= self.quiet_every:
            self.console.progress(p.line(), final)
            self._last_at, self._last_key = p.elapsed, p.key()


def event_lines(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What happened between two looks at the cluster's counters, in words."""
    out = []

    def grew(key: str) -> int:
        return int(after.get(key, 0)) - int(before.get(key, 0))

    if n := grew("revocations"):
        out.append(f"revocation: CloudLab wants {n} node(s) back; no new unit goes there, "
                   f"the pilot drains before the deadline")
    if n := grew("units_requeued"):
        out.append(f"requeued: {n} unit(s) would not end before the deadline; they run "
                   f"elsewhere")
    if n := grew("early_releases"):
        out.append(f"early release: {n} drained node(s) given back before the deadline")
    if n := grew("forced_releases"):
        out.append(f"forced release: {n} node(s) taken at the deadline; their units "
                   f"requeued")
    return out


@dataclass
class ElasticReport:
    """The report's fields (the issue's, then what else helps)."""

    units_total: int = 0
    units_done: int = 0
    units_lost: int = 0
    units_requeued: int = 0
    duplicates: int = 0
    revocations: int = 0
    early_releases: int = 0
    forced_releases: int = 0
    nodes_peak: int = 0
    node_seconds: float = 0.0
    makespan_s: float = 0.0
    units_failed: int = 0
    workload: str = ""
    workload_state: str = ""
    time_scale: float = 1.0
    wall_s: float = 0.0
    emulator_url: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    tenant_load: dict[str, Any] = field(default_factory=dict)
    reclamations: list[dict[str, Any]] = field(default_factory=list)
    cluster: dict[str, Any] = field(default_factory=dict)
    troy: dict[str, Any] = field(default_factory=dict)
    timeline: dict[str, Any] = field(default_factory=dict)  # pilots' nodes, notices, releases
    # --sites: per cluster, our nodes at most at once and its reclamations by outcome
    sites: dict[str, dict[str, int]] = field(default_factory=dict)
    ok: bool = False
    error: str | None = None

    def take_stats(self, stats: dict[str, Any]) -> None:
        for key in COUNTERS:
            if key in stats:
                value = stats[key]
                setattr(self, key, round(float(value), 3) if key == "node_seconds"
                        else int(value))
        self.cluster = {k: v for k, v in stats.items() if _plain(v)}

    def take_tasks(self, workload: Any, outputs: OutputKeeper | None, base: Path) -> None:
        """``troy.tasks``: one entry per task, the shape of ``troy run``'s report, output
        paths relative to ``base`` (the first report's directory)."""
        from troy.report import task_entries
        self.troy = {"base": str(base), "tasks": task_entries(workload, outputs, str(base))}

    def to_json(self, directory: Path | None = None) -> dict[str, Any]:
        """The report as written into ``directory`` (output paths relative to it)."""
        out = asdict(self)
        for key in ("node_seconds", "makespan_s", "wall_s"):
            out[key] = round(out[key], 3)
        troy = dict(out["troy"])
        base = troy.pop("base", None)
        if base is not None and directory is not None:
            from troy.report import rebase
            troy["tasks"] = rebase(troy["tasks"], base, str(directory))
        out["troy"] = troy
        return out

    def write(self, *paths: Path) -> None:
        for path in paths:
            text = json.dumps(self.to_json(path.parent), indent=1) + "\n"
            try:
                path.write_text(text, encoding="utf-8")
            except OSError as err:
                raise DemoError(f"--report {path}: cannot write it: "
                                f"{err.strerror or err}") from err

    def summary(self, console: Console, report_paths: list[Path], log_path: Path) -> None:
        w = console.write
        w("")
        w("Summary")
        w(f"  workload        {self.workload}: {self.units_done}/{self.units_total} units "
          f"done, {self.units_lost} lost, {self.units_requeued} requeued, "
          f"{self.duplicates} duplicates; makespan {self.makespan_s:.1f} s")
        w(f"  nodes           peak {self.nodes_peak}, {self.node_seconds:.0f} node-seconds "
          f"(every node a pilot: a Dask worker joined over TLS)")
        w(f"  revocations     {self.revocations}: {self.early_releases} released early "
          f"after a drain, {self.forced_releases} forced at the deadline")
        for name, site in self.sites.items():
            w(f"  site {name:<10} its own CM: up to {site.get('nodes_peak', 0)} of our nodes, "
              f"{site.get('revocations', 0)} revocation(s): {site.get('early', 0)} released "
              f"early, {site.get('forced', 0)} forced")
        w("  processes       none left: emulator, node agents and Dask scheduler stopped")
        w(f"  report          {', '.join(rel(p) for p in report_paths)}")
        w(f"  log             {rel(log_path)}")
        w(f"  took            {self.wall_s:.1f} s")


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool, type(None), list, dict))


def check_report_path(path: Path | None) -> None:
    """``--report`` must name a file in a directory that exists (said before anything
    starts, not after a minute of demo)."""
    if path is None:
        return
    if path.is_dir():
        raise DemoError(f"--report {path}: is a directory")
    if not path.parent.resolve().is_dir():
        raise DemoError(f"--report {path}: no such directory {rel(path.parent)}")

