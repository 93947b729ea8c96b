"""``troy plot REPORT -o run.png``: a picture of a run from its JSON report.

Two panels over one time axis (seconds since the first task started): a Gantt chart, one
band per pilot and one bar per task coloured by its state (tasks that overlapped on a pilot
get lanes of their own), and the cores busy over time. It reads ``troy run --report`` files
(the task list ``tasks`` at the top level, or ``units`` in reports of older versions) and the
demo's ``--report`` files (``troy.tasks``); an entry is ``{"task", "pilot", "state", "start",
"end", "cores", ...}`` with ``start``/``end`` in epoch seconds (or null). matplotlib is an
extra (``pip install 'elasticslice[plot]'``); the Agg backend draws without a display.

A report may say more, and the picture shows it: ``started`` (or ``timeline.started``, epoch
seconds: the axis starts at the run's start, so the time spent waiting for nodes shows),
``timeline.pilots`` (pilot id -> ``{"node", "host"}``: a band is named by its node, else by
the pilot id) and ``timeline.events`` (``{"time", "kind", "node"}``, kind ``notice``,
``drain`` or ``release``: vertical markers on the time axis, with a legend). Troy writes
``started``; an elastic run's report (``elasticslice run``, the demo) the ``timeline``.
"""
from __future__ import annotations

import heapq
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from troy.errors import TroyError

INSTALL = "pip install 'elasticslice[plot]'"
COLOURS = {"DONE": "#4c9a2a", "FAILED": "#d62728", "CANCELED": "#7f7f7f"}
OTHER_COLOUR = "#ff7f0e"  # still RUNNING (or any other state) when the report was written
MAX_PILOT_LABELS = 40
#: the markers of a timeline's events: colour, line style, legend text
MARKERS = {"notice": ("#9467bd", "--", "notice (CloudLab wants the node)"),
           "drain": ("#8c564b", ":", "drained (its pilot empty)"),
           "release": ("#17becf", "-", "node given back")}


class ReportFileError(TroyError):
    """The report cannot be read or is not a report (a usage error: exit status 2)."""


class NothingToPlot(TroyError):
    """A report whose tasks never started."""


@dataclass(frozen=True)
class Bar:
    """One task on the Gantt chart: times in seconds since the first start."""

    task: str
    pilot: str
    state: str
    start: float
    end: float
    cores: int
    lane: int  # 0.. within its pilot's band


@dataclass(frozen=True)
class Marker:
    """An event of the run on the time axis (seconds since ``PlotData.t0``)."""

    time: float
    kind: str           # a key of MARKERS
    node: str = ""


@dataclass
class PlotData:
    """What the two panels show, computed from a report (no matplotlib needed)."""

    t0: float                                  # epoch seconds of the first start
    bars: list[Bar]
    lanes: dict[str, int]                      # pilot -> lanes in its band, in band order
    busy: list[tuple[float, int]]              # (time, cores busy from then on), a step line
    not_started: int = 0
    capacity: int | None = None                # cores of all pilots, when the report says
    title: str = ""
    states: dict[str, int] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)   # pilot -> its band's name
    markers: list[Marker] = field(default_factory=list)
    from_start: bool = False                   # t0 is the run's start (else the first task's)

    @property
    def makespan(self) -> float:
        return max((b.end for b in self.bars), default=0.0)

    @property
    def span(self) -> float:
        """Up to the last bar or marker."""
        return max([self.makespan, *(m.time for m in self.markers)])

    def name(self, pilot: str) -> str:
        return self.names.get(pilot, pilot)

    def bars_per_pilot(self) -> dict[str, int]:
        return dict(Counter(b.pilot for b in self.bars))

    def peak(self) -> int:
        return max((n for _, n in self.busy), default=0)

    def line(self, out: str | Path) -> str:
        states = ", ".join(f"{n} {s}" for s, n in sorted(self.states.items()))
        skipped = f"; {self.not_started} never started" if self.not_started else ""
        kinds = Counter(m.kind for m in self.markers)
        marks = ("; marked: " + ", ".join(f"{kinds[k]} {k}" for k in MARKERS if kinds[k])
                 if kinds else "")
        return (f"{out}: {len(self.bars)} tasks ({states}) on {len(self.lanes)} pilots over "
                f"{self.makespan:.3g} s, at most {self.peak()} cores busy{skipped}{marks}")


def load_tasks(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The report's task entries and the report itself; ReportFileError names what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ReportFileError(f"{path}: cannot read the report: "
                              f"{getattr(err, 'strerror', None) or err}") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ReportFileError(f"{path}: not JSON ({err.msg}, line {err.lineno})") from err
    except RecursionError as err:
        raise ReportFileError(f"{path}: JSON nested too deeply") from err
    if not isinstance(data, dict):
        raise ReportFileError(f"{path}: expected a JSON object (a troy run or demo report), "
                              f"got {type(data).__name__}")
    troy_part = data.get("troy") if isinstance(data.get("troy"), dict) else {}
    for where, tasks in (("tasks", data.get("tasks")), ("troy.tasks", troy_part.get("tasks")),
                         ("units", data.get("units"))):
        if tasks is not None:
            if not isinstance(tasks, list):
                raise ReportFileError(f"{path}: {where}: expected a list of tasks, got "
                                      f"{type(tasks).__name__}")
            return [_entry(e, f"{path}: {where}[{i}]") for i, e in enumerate(tasks)], data
    raise ReportFileError(f"{path}: no task list ('tasks', 'troy.tasks' or 'units'); "
                          f"expected a 'troy run --report' or a demo '--report' file")


def _entry(e: Any, place: str) -> dict[str, Any]:
    if not isinstance(e, dict):
        raise ReportFileError(f"{place}: expected an object, got {type(e).__name__}")
    for key in ("start", "end"):
        v = e.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v)):
            raise ReportFileError(f"{place}.{key}: expected epoch seconds or null, got {v!r}")
    cores = e.get("cores", 1)
    if cores is None:
        cores = 1
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ReportFileError(f"{place}.cores: expected a whole number >= 1, got {cores!r}")
    return {"task": str(e.get("task", "?")), "pilot": str(e.get("pilot") or "no pilot"),
            "state": str(e.get("state") or "UNKNOWN"), "start": e.get("start"),
            "end": e.get("end"), "cores": cores}


def summarise(entries: list[dict[str, Any]], report: dict[str, Any] | None = None,
              name: str = "report") -> PlotData:
    """The bars (with lanes) and the busy-cores series of the started tasks."""
    started = [e for e in entries if e["start"] is not None]
    if not started:
        raise NothingToPlot(f"{name}: no task started ({len(entries)} tasks, none with a "
                            f"start time): nothing to plot")
    report = report or {}
    first = min(e["start"] for e in started)
    begun = run_start(report, name)
    t0 = min(first, begun) if begun is not None else first
    last = max(max(e["start"], e["end"] or e["start"]) for e in started)
    lanes: dict[str, _Lanes] = {}
    bars = []
    for e in sorted(started, key=lambda e: (e["start"], e["task"])):
        end = e["end"] if e["end"] is not None else last  # running when the report was written
        end = max(end, e["start"])
        lane = lanes.setdefault(e["pilot"], _Lanes()).take(e["start"], end)
        bars.append(Bar(e["task"], e["pilot"], e["state"], e["start"] - t0, end - t0,
                        e["cores"], lane))
    timeline = _timeline(report, name)
    return PlotData(t0=t0, bars=bars, lanes={p: ls.count for p, ls in lanes.items()},
                    busy=busy_series(bars), not_started=len(entries) - len(started),
                    capacity=_capacity(report), title=_title(report, Path(name).name),
                    states=dict(Counter(b.state for b in bars)),
                    names=band_names(timeline.get("pilots"), f"{name}: timeline.pilots"),
                    markers=markers(timeline.get("events"), t0, f"{name}: timeline.events"),
                    from_start=begun is not None)


def _timeline(report: dict[str, Any], name: str) -> dict[str, Any]:
    timeline = report.get("timeline")
    if timeline is None:
        return {}
    if not isinstance(timeline, dict):
        raise ReportFileError(f"{name}: timeline: expected an object, got "
                              f"{type(timeline).__name__}")
    return timeline


def _seconds(value: Any, place: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportFileError(f"{place}: expected epoch seconds, got {value!r}")
    return float(value)


def run_start(report: dict[str, Any], name: str = "report") -> float | None:
    """When the run started (epoch seconds): ``timeline.started``, else ``started``."""
    timeline = _timeline(report, name)
    for place, value in (("timeline.started", timeline.get("started")),
                         ("started", report.get("started"))):
        if value is not None:
            return _seconds(value, f"{name}: {place}")
    return None


def band_names(pilots: Any, place: str) -> dict[str, str]:
    """pilot id -> "client_id @ host" (or what of them the report has)."""
    if pilots is None:
        return {}
    if not isinstance(pilots, dict):
        raise ReportFileError(f"{place}: expected an object, got {type(pilots).__name__}")
    out = {}
    for pilot, where in pilots.items():
        if not isinstance(where, dict):
            raise ReportFileError(f"{place}.{pilot}: expected an object, got "
                                  f"{type(where).__name__}")
        parts = [str(where[k]) for k in ("node", "host") if where.get(k)]
        if parts:
            out[str(pilot)] = " @ ".join(parts)
    return out


def markers(events: Any, t0: float, place: str) -> list[Marker]:
    """The timeline's events as markers, in time order."""
    if events is None:
        return []
    if not isinstance(events, list):
        raise ReportFileError(f"{place}: expected a list, got {type(events).__name__}")
    out = []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise ReportFileError(f"{place}[{i}]: expected an object, got {type(e).__name__}")
        if e.get("kind") not in MARKERS:
            raise ReportFileError(f"{place}[{i}].kind: expected one of "
                                  f"{', '.join(MARKERS)}, got {e.get('kind')!r}")
        out.append(Marker(_seconds(e.get("time"), f"{place}[{i}].time") - t0, e["kind"],
                          str(e.get("node") or "")))
    return sorted(out, key=lambda m: (m.time, m.kind))


@dataclass
class _Lanes:
    """A pilot's lanes: a task takes the lowest lane free at its start (interval
    partitioning, O(log n) a task)."""

    count: int = 0
    free: list[int] = field(default_factory=list)               # lane numbers, a heap
    busy: list[tuple[float, int]] = field(default_factory=list)  # (end, lane), a heap

    def take(self, start: float, end: float) -> int:
        while self.busy and self.busy[0][0] <= start:
            heapq.heappush(self.free, heapq.heappop(self.busy)[1])
        if self.free:
            lane = heapq.heappop(self.free)
        else:
            lane, self.count = self.count, self.count + 1
        heapq.heappush(self.busy, (end, lane))
        return lane


def busy_series(bars: list[Bar]) -> list[tuple[float, int]]:
    """Cores busy from each change on: ``[(t, cores), ...]`` (ends before starts at a tie)."""
    changes = sorted([(b.start, 1, b.cores) for b in bars] + [(b.end, 0, -b.cores)
                                                                for b in bars])
    out: list[tuple[float, int]] = []
    busy = 0
    for t, _, delta in changes:
        busy += delta
        if out and out[-1][0] == t:
            out[-1] = (t, busy)
        else:
            out.append((t, busy))
    return out


def _capacity(report: dict[str, Any]) -> int | None:
    pilots = report.get("pilots")
    if not isinstance(pilots, dict) and isinstance(report.get("troy"), dict):
        pilots = report["troy"].get("pilots")
    if isinstance(pilots, dict):
        cores = [p.get("cores") for p in pilots.values() if isinstance(p, dict)]
        if cores and all(isinstance(c, int) for c in cores):
            return sum(cores)
    return None


def _title(report: dict[str, Any], name: str) -> str:
    troy_part = report.get("troy") if isinstance(report.get("troy"), dict) else {}
    workflow = troy_part.get("workflow_name") or report.get("workload") or name
    state = (troy_part.get("state") or report.get("state") or report.get("workload_state")
             or "")
    return f"{workflow}{': ' + state if state else ''}"


def render(data: PlotData, title: str | None = None) -> Any:
    """The figure (a ``matplotlib.figure.Figure`` on the Agg canvas, no display needed)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as err:
        raise TroyError(f"troy plot needs matplotlib: {INSTALL}") from err
    rows = sum(data.lanes.values())
    fig = Figure(figsize=(10, 3.5 + min(rows, 60) * 0.12), layout="constrained")
    FigureCanvasAgg(fig)
    gantt, busy = fig.subplots(2, 1, sharex=True,
                               gridspec_kw={"height_ratios": [max(2.0, min(rows, 60) / 8), 1.5]})
    base, ticks, top = {}, [], 0
    for pilot, n in data.lanes.items():  # bands from the top down, in order of first use
        base[pilot], top = top, top + n
        ticks.append(base[pilot] + n / 2)
    least = data.makespan / 2000  # a task of no time still shows
    for state in sorted({b.state for b in data.bars}):  # one collection a state: fast
        gantt.add_collection(PolyCollection(
            [_box(b.start, max(b.end, b.start + least), base[b.pilot] + b.lane + 0.1,
                  base[b.pilot] + b.lane + 0.9) for b in data.bars if b.state == state],
            facecolors=COLOURS.get(state, OTHER_COLOUR), edgecolors="white",
            linewidths=0.4, label=state))
    for y in list(base.values())[1:]:
        gantt.axhline(y, color="#cccccc", linewidth=0.6)
    gantt.set_ylim(rows, 0)
    if len(data.lanes) <= MAX_PILOT_LABELS:
        gantt.set_yticks(ticks, [_short(data.name(p)) for p in data.lanes], fontsize=7)
    else:
        gantt.set_yticks([])
    gantt.set_ylabel(f"pilots ({len(data.lanes)})" if not data.names
                     else f"pilots by node ({len(data.lanes)})")
    kinds = [k for k in MARKERS if any(m.kind == k for m in data.markers)]
    gantt.legend(handles=[Patch(color=COLOURS.get(s, OTHER_COLOUR), label=s)
                          for s in sorted(data.states)]
                 + [Line2D([], [], color=MARKERS[k][0], linestyle=MARKERS[k][1],
                           label=MARKERS[k][2]) for k in kinds],
                 loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    gantt.set_title(title or data.title)
    times = [t for t, _ in data.busy]
    cores = [n for _, n in data.busy]
    busy.step(times, cores, where="post", color="#1f77b4")
    busy.fill_between(times, cores, step="post", alpha=0.3, color="#1f77b4")
    if data.capacity:
        busy.axhline(data.capacity, color="#555555", linestyle="--", linewidth=0.8,
                     label=f"{data.capacity} cores")
        busy.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    for m in data.markers:   # on both panels: the events over the tasks and the cores
        colour, style, _ = MARKERS[m.kind]
        for ax in (gantt, busy):
            ax.axvline(m.time, color=colour, linestyle=style, linewidth=1.0)
    busy.set_ylim(0, max(data.capacity or 0, data.peak()) * 1.1 + 0.5)
    busy.yaxis.get_major_locator().set_params(integer=True)
    busy.set_ylabel("cores busy")
    busy.set_xlabel("seconds since the run started" if data.from_start
                    else "seconds since the first task started")
    busy.set_xlim(0, data.span * 1.01 or 1)
    return fig


def _box(x0: float, x1: float, y0: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _short(pilot: str) -> str:
    return pilot if len(pilot) <= 32 else pilot[:14] + "…" + pilot[-16:]


def read_report(report: str | Path) -> PlotData:
    """What a report's picture shows (ReportFileError, NothingToPlot: what is wrong)."""
    entries, data = load_tasks(report)
    return summarise(entries, data, str(report))


#: what ``troy plot`` writes, by the output's suffix
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def picture_format(out: str | Path) -> str:
    """The format of the picture ``out`` names by its suffix (TroyError: not one we write)."""
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise TroyError(f"{out}: troy plot writes .png, .svg or .pdf, not "
                        f"{suffix or 'a file without a suffix'}")
    return FORMATS[suffix]


def plot_report(report: str | Path, out: str | Path, title: str | None = None) -> PlotData:
    """Read ``report``, draw it, write the picture ``out`` (PNG, SVG or PDF by its suffix);
    returns what was drawn."""
    kind = picture_format(out)
    summary = read_report(report)
    fig = render(summary, title)
    try:
        fig.savefig(out, format=kind, dpi=110)
    except OSError as err:
        raise TroyError(f"{out}: cannot write the picture: {err.strerror or err}") from err
    return summary


class _UsageExit(click.ClickException):
    exit_code = 2


@click.command("plot")
@click.argument("report", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="The picture to write: .png, .svg or .pdf (default: REPORT with .png).")
@click.option("--title", default=None, help="The chart's title (default: from the report).")
def plot_cmd(report: str, output: str | None, title: str | None) -> None:
    """Draw a run's REPORT (from 'troy run --report' or the demo's --report) as a picture:
    tasks per pilot over time (coloured by state) and the cores busy.

    Needs matplotlib: pip install 'elasticslice[plot]'."""
    out = output or str(Path(report).with_suffix(".png"))
    try:
        summary = plot_report(report, out, title)
    except ReportFileError as err:
        raise _UsageExit(str(err)) from err
    click.echo(summary.line(out))
