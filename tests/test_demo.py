"""The elastic demo (``bin/demo``, ``elasticslice demo``, ``make demo``) as users run it: a
real subprocess, the emulator over TLS, the manager, a TLS Dask scheduler, a node agent on
every emulated node, tenant load that takes a node back mid-run; assertions on what the
user sees (progress, events, summary, report, exit codes) and on what is left behind.
The helpers are in tests/demo_helpers.py, shared with tests/test_demo_static.py (``--static``)."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elasticslice.demo.console import Console, port_open
from elasticslice.demo.report import Progress, ProgressPrinter, event_lines
from elasticslice.emulator.adminclient import AdminClient
from elasticslice.emulator.daemon import lock_holder
from troy.plot import MARKERS
from troy.report import ENTRY_KEYS
from tests.demo_helpers import DEMO, ELASTICSLICE, DemoRun, emulator_port, leftovers
from tests.helpers import REPO, wait_for
from tests.screenshots import Page, browser, has_colour

FAST = ["--boot-delay", "0.2"]

@pytest.mark.slow
def test_elasticslice_demo_without_revocations_takes_no_node(tmp_path: Path) -> None:
    """The same demo through ``elasticslice demo`` (the CLI group), on a small workflow of
    the examples (--workload): --revocations 0 leaves the other tenants alone; the demo's
    own emulator is stopped at the end (``--quiet``, which keeps the progress and detail
    lines out, is tried on the static demo, tests/test_demo_static.py)."""
    d, out_json = tmp_path / "run", tmp_path / "out.json"
    run = DemoRun("demo", "--dir", str(d), *FAST, "--workload",
                  str(REPO / "examples" / "workflows" / "helloworld-forkjoin-10-chameleon.json"),
                  "--time-scale", "0.05", "--revocations", "0", "--report",
                  str(out_json), cwd=tmp_path, command=[str(ELASTICSLICE)])
    code, out, err = run.finish()
    assert code == 0, err[-3000:]
    assert err == "" and "Traceback" not in out
    report = json.loads(out_json.read_text())
    assert report["units_done"] == report["units_total"] and report["units_lost"] == 0
    assert report["revocations"] == report["early_releases"] == 0
    assert report["reclamations"] == [] and report["tenant_load"]["events"] == []
    assert "CloudLab reclaims" not in out and "revocation:" not in out
    assert "  revocations     0: 0 released early after a drain, 0 forced" in out
    for n in range(1, 5):
        assert f"[{n}/4] " in out
    assert report == json.loads((d / "report.json").read_text())
    # the demo checks its own emulator's port closed after stopping it, before it exits (a
    # check here, after the exit, would race with other tests' servers binding port 0)
    assert f"emulator      stopped; port {emulator_port(report)} closed" in out
    assert leftovers(run.proc.pid, d) == []


@pytest.mark.slow
def test_two_sites_grow_past_the_first_and_each_revocation_goes_back_at_its_own_cm(
        tmp_path: Path) -> None:
    """``--sites 2``: a box of two clusters, utah (2 nodes) and wisc (8), a CM each behind
    one SA. The slice takes what it may at utah and grows at wisc; units run on pilots at
    both sites; the other tenants take one of our nodes at each site, and each is drained
    and given back early at its own CM (its emulator's record of the reclamation), 0 lost."""
    d = tmp_path / "run"
    run = DemoRun("--dir", str(d), *FAST, "--sites", "2", cwd=tmp_path)
    code, out, err = run.finish()
    assert code == 0, err[-3000:] + out[-3000:]
    assert err == "" and "Traceback" not in out
    assert "cluster utah  its own CM, 2 m510 nodes" in out
    assert "cluster wisc  its own CM, 8 c220g5 nodes" in out
    report = json.loads((d / "report.json").read_text())
    assert report["ok"] and report["units_done"] == report["units_total"] == 58
    assert report["units_lost"] == 0 and report["forced_releases"] == 0
    # our nodes at both sites, pilots at both, and units ran at both
    pilots = report["timeline"]["pilots"]
    assert {p["site"] for p in pilots.values()} == {"utah", "wisc"}
    ran_at = {pilots[t["pilot"]]["site"] for t in report["troy"]["tasks"] if t["pilot"]}
    assert ran_at == {"utah", "wisc"}
    assert all(report["sites"][site]["nodes_peak"] >= 1 for site in ("utah", "wisc"))
    assert any("(utah " in line and ", wisc " in line for line in out.splitlines())
    # one revocation at each site, released early at that site's CM: the CM's own record
    by_site = {(r["site"], r["outcome"]) for r in report["reclamations"]}
    assert by_site == {("utah", "early"), ("wisc", "early")}, report["reclamations"]
    prefix = {"utah": "ms10", "wisc": "c220g5n"}
    assert all(r["node_id"].startswith(prefix[r["site"]]) for r in report["reclamations"])
    for site in ("utah", "wisc"):
        assert report["sites"][site]["revocations"] == report["sites"][site]["early"] == 1
        assert f"other tenants at {site} now want" in out
    assert "  site wisc       its own CM: up to" in out
    assert leftovers(run.proc.pid, d) == []


@pytest.mark.slow
def test_interrupt_stops_every_process(tmp_path: Path) -> None:
    d = tmp_path / "run"
    emu = tmp_path / "emu"     # --emulator-dir: made, started and stopped by the demo
    # two nodes at most (not the default four): each stock node builds the agent's
    # environment, and the processes of two nodes are as many to stop as four's
    run = DemoRun("--dir", str(d), *FAST, "--time-scale", "5", "--emulator-dir", str(emu),
                  "--nodes-max", "2", cwd=tmp_path)
    wait_for(lambda: run.saw("units queued") or run.proc.poll() is not None, 180,
             what="the workload's first progress line")
    wait_for(lambda: any(f"pilots {n}" in line for line in run.lines for n in range(1, 9))
             or run.proc.poll() is not None, 120, what="a pilot")
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish()
    assert code == 130, f"exit {code}: {err[-2000:]}"
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("demo: interrupted in step 3/4 (workload); everything it started "
                          "is stopped")
    assert "Traceback" not in out + err
    report = json.loads((d / "report.json").read_text())
    assert not report["ok"]
    # the emulator ran in the demo's process, which has exited: nothing holds its serve lock
    # any more (its port is not checked here: other tests' servers bind port 0, and a
    # fresh-clone run found one on it); its nodes and their processes are checked here
    assert lock_holder(emu) is None
    assert leftovers(run.proc.pid, d) == [] and leftovers(run.proc.pid, emu) == []
    assert (emu / "ca.pem").exists() and not (d / "emulator").exists()


@pytest.mark.slow
def test_a_running_emulator_is_used_as_it_is_revokes_a_node_and_is_left_running(
        tmp_path: Path) -> None:
    """--emulator-dir of an emulator that serves already (its own inventory, 8-core
    nodes): the demo uses it, CloudLab takes a node back mid-run and no unit is lost, the
    demo gives its nodes back, puts the tenant load back, and leaves the emulator running."""
    emu, d, out_json = tmp_path / "emu", tmp_path / "run", tmp_path / "out.json"
    subprocess.run([str(ELASTICSLICE), "emulator", "init", "--dir", str(emu), "--port", "0"],
                   check=True, capture_output=True, timeout=120)
    serve = subprocess.Popen([str(ELASTICSLICE), "emulator", "serve", "--dir", str(emu),
                              "--boot-delay", "0.2", "--notify-interval", "2",
                              "--max-wait", "30"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def serving() -> int:
            try:
                port = int(json.loads((emu / "server.json").read_text())["port"])
            except (OSError, ValueError, KeyError):
                return 0
            return port if port_open(port) else 0
        port = wait_for(serving, 120, what="the emulator serving")
        # two nodes held from the start: on a loaded machine one 8-core node once finished
        # the workflow before a second one joined, and the other tenants took nothing
        run = DemoRun("--dir", str(d), "--emulator-dir", str(emu), "--time-scale", "0.5",
                      "--nodes-min", "2", "--report", str(out_json), cwd=tmp_path)
        code, out, err = run.finish()
        assert code == 0, err[-3000:]
        assert err == "" and "Traceback" not in out
        assert f"serves already (port {port}): used as it is, left running" in out
        report = json.loads(out_json.read_text())
        assert report["ok"] and report["units_done"] == report["units_total"] == 58
        assert report["units_lost"] == 0
        assert report["revocations"] >= 1 and report["early_releases"] >= 1
        assert_revoked_mid_run(report, out, tmp_path, d)
        assert port_open(port) and serve.poll() is None
        status = AdminClient(emu).call("Status")
        assert status["tenant_target"] == 0
        assert sum(row["slice"] for row in status["pool"].values()) == 0
        assert leftovers(run.proc.pid, d) == []
        # the nodes' agents end with the nodes, which the emulator now holds for no one
        wait_for(lambda: leftovers(-1, emu) == [], 60, what="the node agents gone")
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)


def assert_revoked_mid_run(report: dict, out: str, tmp_path: Path, d: Path) -> None:
    """What a user sees of a demo whose node CloudLab took back mid-run."""
    # the per-task list has the shape of troy run's report
    assert len(report["troy"]["tasks"]) == 58
    assert all(tuple(e) == ENTRY_KEYS and e["state"] == "DONE" for e in report["troy"]["tasks"])
    assert report["nodes_peak"] >= 2 and report["node_seconds"] > 0
    assert report["makespan_s"] > 0
    # the emulator's own record agrees: the node was given back early, not taken
    assert any(r["outcome"] == "early" for r in report["reclamations"])
    # a pipe gets progress lines (not a rewritten line) with every figure
    progress = [line for line in out.splitlines() if "units queued" in line]
    assert len(progress) >= 3 and "\r" not in out
    assert all("nodes " in p and "pilots " in p and "revocations " in p for p in progress)
    assert progress[-1].split("done ")[1].startswith("58/58")
    assert "revocation: CloudLab wants 1 node(s) back" in out
    assert "early release: 1 drained node(s) given back before the deadline" in out
    assert "CloudLab reclaims one of ours" in out
    assert (f"  workload        montage-chameleon-2mass-005d-001.json: 58/58 units done, "
            f"0 lost, {report['units_requeued']} requeued") in out
    assert (f"  revocations     {report['revocations']}: {report['early_releases']} released "
            f"early") in out
    # afterwards, troy plot of the run, the revocation marked on it, as a browser shows it
    # (docs/troy-plot-revocation.png)
    plot = tmp_path / "plot.png"
    plotted = subprocess.run([str(Path(sys.executable).with_name("troy")), "plot",
                              str(d / "report.json"), "-o", str(plot)], capture_output=True,
                             text=True, timeout=120, check=False)
    assert plotted.returncode == 0 and "; marked: " in plotted.stdout, plotted.stderr
    if browser():
        page_file = tmp_path / "plot.html"
        page_file.write_text('<!doctype html><body style="margin:0">'
                             '<img src="plot.png" style="max-width:100%;max-height:100vh"></body>')
        with Page(page_file.as_uri(), size=(1100, 740)) as page:
            shot = tmp_path / "troy-plot-revocation.png"
            wait_for(lambda: has_colour(page.screenshot(shot), MARKERS["notice"][0])
                     and has_colour(shot, MARKERS["release"][0]), 30,
                     what="the plot with its notice and release markers")


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--time-scale", "0"], "demo: Invalid value for '--time-scale': 0.0 is not in the "
                            "range x>0."),
    (["--nodes", "3"], "demo: --nodes: only with --static"),
    (["--static", "--notice", "10"], "demo: --notice: not with --static"),
    (["--nodes-min", "5", "--nodes-max", "2"], "demo: --nodes-min 5 is above --nodes-max 2"),
    (["--workload", "nosuch.json"], "demo: --workload nosuch.json: no such file"),
    (["--report", "no/such/dir/out.json"], "demo: --report no/such/dir/out.json: no such "
                                           "directory no/such/dir"),
    (["--bogus"], "demo: No such option '--bogus'"),
    (["--static", "--sites", "2"], "demo: --sites: not with --static"),
    (["--sites", "4"], "demo: Invalid value for '--sites': 4 is not in the range 1<=x<=3."),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                             message: str) -> None:
    out = subprocess.run([sys.executable, str(DEMO), "--dir", str(tmp_path / "run"), *args],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(message), out.stderr
    assert out.stdout == "" and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_bad_workload_fails_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "wf.json"
    bad.write_text('{"workflow": {"tasks": [{"id": "a", "runtime": -1}]}}')
    run = DemoRun("--dir", str(tmp_path / "run"), "--workload", str(bad), cwd=tmp_path)
    code, out, err = run.finish()
    assert code == 1
    assert err.count("\n") == 1 and "demo: failed in setup:" in err and str(bad) in err
    assert "[1/4]" not in out and "Traceback" not in out + err


@pytest.mark.slow
def test_bin_demo_and_elasticslice_demo_are_the_same_command(tmp_path: Path) -> None:
    """``make demo`` runs ``bin/demo``; both it and ``elasticslice demo`` have one help."""
    mine = subprocess.run([sys.executable, str(DEMO), "--help"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)
    cli = subprocess.run([str(ELASTICSLICE), "demo", "--help"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert mine.returncode == cli.returncode == 0
    assert mine.stdout.replace("Usage: demo", "Usage: elasticslice demo") == cli.stdout
    for option in ("--dir", "--emulator-dir", "--workload", "--time-scale", "--nodes-max",
                   "--notice", "--margin", "--revocations", "--report", "--static",
                   "--quiet"):
        assert option in mine.stdout
    make = subprocess.run(["make", "-n", "demo"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert "bin/demo" in make.stdout


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def progress_at(elapsed: float, done: int) -> Progress:
    return Progress(elapsed, nodes=2, pilots=2, queued=3, running=4, done=done, total=10,
                    revocations=0)


def test_a_terminal_gets_one_updating_line_and_a_pipe_periodic_lines() -> None:
    tty, pipe = FakeTerminal(), io.StringIO()
    shows = [(0.0, 0), (0.5, 1), (1.0, 2), (2.5, 3), (2.6, 4), (20.0, 4)]
    for stream in (tty, pipe):
        printer = ProgressPrinter(Console(stream))
        for elapsed, done in shows:
            printer.show(progress_at(elapsed, done))
        printer.show(progress_at(21.0, 10), final=True)
    assert tty.getvalue().count("\r") == len(shows) + 1 and tty.getvalue().count("\n") == 1
    lines = pipe.getvalue().splitlines()
    # changes at most every 2 s, a line every 10 s even without one, and the last
    assert [line.split("done ")[1].split()[0] for line in lines] == \
        ["0/10", "3/10", "4/10", "10/10"]
    assert "\r" not in pipe.getvalue()


def test_events_say_what_the_counters_did() -> None:
    before = {"revocations": 0, "early_releases": 0, "units_requeued": 0}
    after = {"revocations": 1, "early_releases": 1, "units_requeued": 2,
             "forced_releases": 0}
    assert event_lines(before, after) == [
        "revocation: CloudLab wants 1 node(s) back; no new unit goes there, the pilot "
        "drains before the deadline",
        "requeued: 2 unit(s) would not end before the deadline; they run elsewhere",
        "early release: 1 drained node(s) given back before the deadline"]
    assert event_lines(after, after) == []



def test_demo_report_and_troy_run_report_share_the_task_entry(tmp_path: Path) -> None:
    """One entry shape (troy.report.ENTRY_KEYS) in both reports; the demo's output paths
    are right from each place its report is written to."""
    import troy
    from elasticslice.demo.report import ElasticReport
    from troy.output import OutputKeeper
    from troy.report import build_report
    from troy.workload.files import load_workload
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"tasks": [{"id": "a", "executable": "/bin/sh",
                                        "arguments": ["-c", "echo said"]}]}))
    workload = load_workload(f)
    run_dir, other = tmp_path / "run", tmp_path / "other"
    other.mkdir()
    keeper = OutputKeeper(run_dir / "output").open()
    keeper.watch(workload)
    with troy.Session(store_path=tmp_path / "s.sqlite") as session:
        session.add_framework("local", name="local")
        state = troy.execute_workload(session, workload,
                                      troy.Overlay([{"size": 1, "framework": "local"}]),
                                      timeout=60)
    assert state is troy.State.DONE
    report = ElasticReport()
    report.take_tasks(workload, keeper, run_dir)
    report.write(run_dir / "report.json", other / "out.json")
    ran = build_report(workload, state, 1.0, outputs=keeper, base=str(run_dir))["tasks"]
    for where in (run_dir / "report.json", other / "out.json"):
        [entry] = json.loads(where.read_text())["troy"]["tasks"]
        assert tuple(entry) == tuple(ran[0]) == ENTRY_KEYS
        assert (where.parent / entry["stdout"]).read_text() == "said\n"
