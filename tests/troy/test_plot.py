"""``troy plot``: a Gantt chart per pilot and the cores busy, from troy run and demo reports."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.helpers import REPO
from troy.cli import cli
from troy.plot import load_tasks, read_report, render, summarise

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T0 = 1_700_000_000.0
# pilot A: a [0, 2] 1 core and b [1, 3] 2 cores overlap (two lanes); pilot B: c [2, 4] 1 core
# (FAILED); d never started
TASKS = [
    {"task": "a", "unit": "u.1", "pilot": "A", "framework": "local", "state": "DONE",
     "start": T0, "end": T0 + 2, "cores": 1, "error": None, "stdout": None, "stderr": None},
    {"task": "b", "unit": "u.2", "pilot": "A", "framework": "local", "state": "DONE",
     "start": T0 + 1, "end": T0 + 3, "cores": 2, "error": None, "stdout": None,
     "stderr": None},
    {"task": "c", "unit": "u.3", "pilot": "B", "framework": "local", "state": "FAILED",
     "start": T0 + 2, "end": T0 + 4, "cores": 1, "error": "exit status 3", "stdout": None,
     "stderr": None},
    {"task": "d", "unit": None, "pilot": None, "framework": None, "state": "CANCELED",
     "start": None, "end": None, "cores": 1, "error": None, "stdout": None, "stderr": None},
]
BUSY = [(0.0, 1), (1.0, 3), (2.0, 3), (3.0, 1), (4.0, 0)]


def write(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def run_report(tasks=TASKS) -> dict:
    return {"state": "FAILED", "tasks_total": len(tasks), "tasks": tasks}


def demo_report(tasks=TASKS) -> dict:
    return {"ok": False, "troy": {"state": "FAILED", "workflow_name": "w.json", "tasks": tasks,
                                  "pilots": {"node-0": {"cores": 2}, "node-1": {"cores": 2}}}}


def test_summary_has_bars_per_pilot_and_the_busy_cores(tmp_path):
    data = read_report(write(tmp_path, "r.json", run_report()))
    assert data.bars_per_pilot() == {"A": 2, "B": 1}
    assert data.lanes == {"A": 2, "B": 1}        # a and b overlap: one lane each
    assert {b.task: (b.start, b.end, b.lane) for b in data.bars} == {
        "a": (0.0, 2.0, 0), "b": (1.0, 3.0, 1), "c": (2.0, 4.0, 0)}
    assert data.busy == BUSY and data.peak() == 3
    assert data.not_started == 1 and data.states == {"DONE": 2, "FAILED": 1}
    assert data.capacity is None and data.title == "r.json: FAILED"


def test_a_task_running_when_the_report_was_written_lasts_to_the_end(tmp_path):
    running = {**TASKS[0], "task": "r", "pilot": "B", "state": "RUNNING", "start": T0 + 0.5,
               "end": None}
    data = read_report(write(tmp_path, "r.json", run_report(TASKS + [running])))
    bar = next(b for b in data.bars if b.task == "r")
    assert (bar.start, bar.end, bar.lane) == (0.5, 4.0, 0) and data.lanes["B"] == 2
    assert data.states["RUNNING"] == 1 and data.peak() == 4


def test_demo_report_and_old_units_reports_plot_the_same_way(tmp_path):
    run = read_report(write(tmp_path, "r.json", run_report()))
    demo = read_report(write(tmp_path, "d.json", demo_report()))
    old = read_report(write(tmp_path, "o.json", {"state": "FAILED", "units": [
        {k: v for k, v in e.items() if k not in ("cores", "stdout", "stderr")}
        for e in TASKS]}))
    assert demo.bars == run.bars and demo.busy == run.busy
    assert demo.capacity == 4 and demo.title == "w.json: FAILED"
    assert old.bars_per_pilot() == run.bars_per_pilot()
    assert old.peak() == 2  # no cores in old reports: one each


def test_png_panels_reflect_the_data(tmp_path):
    out = tmp_path / "run.png"
    result = CliRunner().invoke(cli, ["plot", write(tmp_path, "r.json", run_report()),
                                      "-o", str(out), "--title", "my run"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (f"{out}: 3 tasks (2 DONE, 1 FAILED) on 2 pilots over "
                                     f"4 s, at most 3 cores busy; 1 never started")
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 5000
    fig = render(read_report(tmp_path / "r.json"), "my run")
    gantt, busy = fig.axes
    bars = sorted((round(box.x0, 6), round(box.width, 6), round((box.y0 + box.y1) / 2, 6),
                   tuple(c.get_facecolor()[0][:3]))
                  for c in gantt.collections for box in (p.get_extents() for p in c.get_paths()))
    red, green = (214 / 255, 39 / 255, 40 / 255), (76 / 255, 154 / 255, 42 / 255)
    # y: pilot A's band holds lanes 0 and 1 (centres 0.5, 1.5); B's lane is below (2.5)
    assert [b[:3] for b in bars] == [(0.0, 2.0, 0.5), (1.0, 2.0, 1.5), (2.0, 2.0, 2.5)]
    assert [tuple(round(c, 3) for c in b[3]) for b in bars] == [
        tuple(round(c, 3) for c in green)] * 2 + [tuple(round(c, 3) for c in red)]
    assert [t.get_text() for t in gantt.get_yticklabels()] == ["A", "B"]
    line = busy.lines[0]
    assert list(zip(line.get_xdata(), line.get_ydata())) == BUSY
    assert gantt.get_title() == "my run"


@pytest.mark.slow
def test_real_troy_run_report_plots(tmp_path):
    report, png = tmp_path / "run.json", tmp_path / "run.png"
    wf = REPO / "examples" / "workflows" / "helloworld-forkjoin-10-chameleon.json"
    run = subprocess.run([sys.executable, "-m", "troy.cli", "run", str(wf), "--pilots", "2x1",
                          "--time-scale", "0.001", "--report", str(report)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    plot = subprocess.run([sys.executable, "-m", "troy.cli", "plot", str(report), "-o",
                           str(png)], capture_output=True, text=True, timeout=240)
    assert plot.returncode == 0, plot.stderr
    assert plot.stdout.startswith(f"{png}: 10 tasks (10 DONE) on 2 pilots"), plot.stdout
    assert png.read_bytes()[:8] == PNG_MAGIC
    entries, data = load_tasks(report)
    summary = summarise(entries, data)
    assert sum(summary.bars_per_pilot().values()) == 10
    assert set(summary.lanes) == {e["pilot"] for e in entries}
    assert summary.peak() <= 2  # 2 pilots of 1 core: never more than 2 busy


@pytest.mark.parametrize("content, code, message", [
    (None, 2, "cannot read the report: No such file or directory"),
    ("{nope", 2, "not JSON (Expecting property name enclosed in double quotes, line 1)"),
    ("[1, 2]", 2, "expected a JSON object (a troy run or demo report), got list"),
    ('{"state": "DONE"}', 2, "no task list ('tasks', 'troy.tasks' or 'units')"),
    ('{"tasks": {"a": 1}}', 2, "tasks: expected a list of tasks, got dict"),
    ('{"tasks": [{"task": "a", "start": "noon"}]}', 2,
     "tasks[0].start: expected epoch seconds or null, got 'noon'"),
    ('{"troy": {"tasks": [{"task": "a", "start": 1, "cores": 0}]}}', 2,
     "troy.tasks[0].cores: expected a whole number >= 1, got 0"),
    ('{"tasks": []}', 1, "no task started (0 tasks, none with a start time): nothing to plot"),
    ('{"tasks": [{"task": "a", "start": 1}], "timeline": []}', 2,
     "timeline: expected an object, got list"),
    ('{"tasks": [{"task": "a", "start": 1}], "timeline": {"started": "dawn"}}', 2,
     "timeline.started: expected epoch seconds, got 'dawn'"),
    ('{"tasks": [{"task": "a", "start": 1}], "timeline": {"events": [{"time": 2, '
     '"kind": "boom"}]}}', 2, "timeline.events[0].kind: expected one of notice, drain, "
     "release, got 'boom'"),
    ('{"tasks": [{"task": "a", "start": null}]}', 1, "no task started (1 tasks"),
])
def test_bad_reports_are_one_line(tmp_path, content, code, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(cli, ["plot", str(path), "-o", str(tmp_path / "r.png")])
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: {message}"), result.output
    assert not (tmp_path / "r.png").exists()


def test_unwritable_png_is_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["plot", write(tmp_path, "r.json", run_report()),
                                      "-o", str(tmp_path / "no" / "r.png")])
    assert result.exit_code == 1
    assert result.output.strip() == (f"Error: {tmp_path / 'no' / 'r.png'}: cannot write the "
                                     f"picture: No such file or directory")


@pytest.mark.parametrize("name, magic", [("r.svg", b"<?xml"), ("r.pdf", b"%PDF"),
                                         ("r.PNG", b"\x89PNG")])
def test_the_output_s_suffix_says_the_format(tmp_path, name, magic):
    result = CliRunner().invoke(cli, ["plot", write(tmp_path, "r.json", run_report()),
                                      "-o", str(tmp_path / name)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / name).read_bytes().startswith(magic)


def test_a_suffix_it_cannot_write_is_one_line_and_nothing_is_written(tmp_path):
    result = CliRunner().invoke(cli, ["plot", write(tmp_path, "r.json", run_report()),
                                      "-o", str(tmp_path / "r.jpg")])
    assert result.exit_code == 1
    assert result.output.strip() == (f"Error: {tmp_path / 'r.jpg'}: troy plot writes .png, "
                                     f".svg or .pdf, not .jpg")
    assert not (tmp_path / "r.jpg").exists()


def test_without_matplotlib_names_the_extra(tmp_path):
    report = write(tmp_path, "r.json", run_report())
    code = ("import sys; sys.modules['matplotlib'] = None  # as if it were not installed\n"
            "from troy.cli import main; sys.argv = ['troy', 'plot', sys.argv[1]]; main()")
    proc = subprocess.run([sys.executable, "-c", code, report], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("Error: troy plot needs matplotlib: "
                                   "pip install 'elasticslice[plot]'")
    assert not (tmp_path / "r.png").exists()


def test_many_tasks_are_one_artist_per_state(tmp_path):
    """Broke: 20,000 tasks took over 2 minutes to draw as one matplotlib patch each."""
    tasks = [{**TASKS[i % 3], "task": f"t{i}", "start": T0 + i, "end": T0 + i + 0.5}
             for i in range(3000)]
    data = read_report(write(tmp_path, "r.json", run_report(tasks)))
    gantt, _ = render(data).axes
    assert not gantt.patches and len(gantt.collections) == 2   # DONE and FAILED
    assert sum(len(c.get_paths()) for c in gantt.collections) == 3000
    assert data.lanes == {"A": 1, "B": 1}    # no overlaps: one lane a pilot


def elastic_report() -> dict:
    """A run that waited 5 s for its nodes; pilot B's node was revoked, drained, given back."""
    return {**run_report(), "timeline": {
        "started": T0 - 5,
        "pilots": {"A": {"node": "node-1", "host": "10.0.0.1"}, "B": {"node": "node-2"}},
        "events": [{"time": T0 + 2.5, "kind": "notice", "node": "node-2"},
                   {"time": T0 + 4, "kind": "drain", "node": "node-2"},
                   {"time": T0 + 4.5, "kind": "release", "node": "node-2", "why": "early"}]}}


def test_bands_are_named_by_node_and_notices_drains_releases_are_marked(tmp_path):
    out = tmp_path / "e.png"
    result = CliRunner().invoke(cli, ["plot", write(tmp_path, "e.json", elastic_report()),
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("; marked: 1 notice, 1 drain, 1 release")
    data = read_report(tmp_path / "e.json")
    # the axis starts at the run's start: 5 s of waiting for nodes before the first task
    assert data.from_start and {b.task: b.start for b in data.bars} == {"a": 5.0, "b": 6.0,
                                                                        "c": 7.0}
    assert [(m.time, m.kind) for m in data.markers] == [(7.5, "notice"), (9.0, "drain"),
                                                        (9.5, "release")]
    fig = render(data)
    gantt, busy = fig.axes
    assert [t.get_text() for t in gantt.get_yticklabels()] == ["node-1 @ 10.0.0.1", "node-2"]
    for ax in (gantt, busy):   # a vertical line per event on both panels
        assert sorted(vertical_lines(ax)) == [7.5, 9.0, 9.5]
    assert [t.get_text() for t in gantt.get_legend().get_texts()] == [
        "DONE", "FAILED", "notice (CloudLab wants the node)", "drained (its pilot empty)",
        "node given back"]
    assert busy.get_xlabel() == "seconds since the run started"
    assert busy.get_xlim()[0] == 0 and busy.get_xlim()[1] >= 9.5
    plain = render(read_report(write(tmp_path, "r.json", run_report())))
    assert plain.axes[1].get_xlabel() == "seconds since the first task started"
    assert vertical_lines(plain.axes[0]) == []   # no timeline: no markers


def vertical_lines(ax) -> list[float]:
    """Where the axes' vertical lines (axvline: the same x at both ends) are."""
    return [float(ln.get_xdata()[0]) for ln in ax.lines
            if len(ln.get_xdata()) == 2 and ln.get_xdata()[0] == ln.get_xdata()[1]]
