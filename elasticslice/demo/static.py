"""The end-to-end demo behind ``make demo`` (``bin/demo``): CloudLab in a box, the ProtoGENI
client and Troy, for real and in one process tree.

Five steps: start the emulator (TLS, its own CA) in a fresh directory; register a slice and
create a sliver of nodes whose startup command really runs on each node's machine; grow the
sliver with AddNodes; run a WfCommons workflow with Troy on one pilot per acquired node,
sized to the node's cores; give every node back and stop. ``Demo(options, output).run()``
returns a ``DemoResult`` and writes ``report.json``; ``close()`` stops whatever is still
running (emulator, node processes, pilots, Dask) after a failure or an interrupt.

The pilots run on this machine, sized to the nodes: this is ``--static``, the walkthrough of
the client and Troy; the default demo (elastic.py) makes every node a pilot.
"""
from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from elasticslice.config import load_config
from elasticslice.emulator import EmulatorServer, init_emulator
from elasticslice.emulator.nodefs import NodeDir
from elasticslice.demo.console import DemoError, port_open, rel, stop_emulator
from elasticslice.rpc.client import ProtoGeniServer
from elasticslice.rpc.cm import NodeStatus
from elasticslice.rspec import NodeSpec, add_nodes_args, build_request, parse, pin_add_args

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_WORKFLOW = REPO / "examples" / "workflows" / "montage-chameleon-2mass-005d-001.json"
STEPS = 5
# What each node runs at boot, as the experiment's user (as CloudLab runs it): it writes its
# name, cores and user into its own /tmp/started (the box's nodes say their emulated cores
# in $ELASTICSLICE_CORES; on CloudLab `nproc` answers).
STARTUP = ('printf "%s cores=%s user=%s\\n" "$(hostname)" "${ELASTICSLICE_CORES:-$(nproc)}" '
           '"$(id -un)" > /tmp/started; nproc')
POLL = 0.2


@dataclass
class DemoOptions:
    """What ``bin/demo`` lets the user choose."""

    directory: Path = Path("demo-run")
    nodes: int = 2
    add_nodes: int = 2
    hardware_type: str | None = None       # None: the inventory's default type
    framework: str = "local"                # Troy pilot framework: local or dask
    workflow: Path = DEFAULT_WORKFLOW
    time_scale: float = 0.1
    boot_delay: float = 1.0
    timeout: float = 60.0                   # per wait: nodes ready, workflow done
    quiet: bool = False


@dataclass
class DemoNode:
    """One node the demo acquired, and what became of it."""

    client_id: str
    component_id: str
    hostname: str
    hardware_type: str
    cores: int
    acquired_by: str                        # CreateSliver | AddNodes
    status: str = ""
    execute_status: str | None = None
    started: str | None = None             # what the startup command wrote
    units: int = 0
    released_by: str | None = None         # DeleteNodes | DeleteSlice

    @property
    def node_id(self) -> str:
        return self.component_id.rsplit("+", 1)[-1]


@dataclass
class DemoResult:
    """What the summary and ``report.json`` say."""

    directory: Path
    url: str = ""
    slice_urn: str = ""
    nodes: list[DemoNode] = field(default_factory=list)
    troy: dict[str, Any] = field(default_factory=dict)
    emulator_stopped: bool = False
    report_written: bool = False
    seconds: float = 0.0

    @property
    def report_path(self) -> Path:
        return self.directory / "report.json"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "directory": str(self.directory),
                "seconds": round(self.seconds, 3)}


class Output(Protocol):
    """Where the demo shows itself (``bin/demo``'s console): steps (a title and a short
    name for error messages), labelled details, progress lines (``final`` ends one)."""

    tty: bool

    def step(self, title: str, short: str) -> None: ...
    def detail(self, label: str, text: str = "") -> None: ...
    def progress(self, text: str, final: bool) -> None: ...


class Demo:
    """The walkthrough; ``run()`` does every step, ``close()`` stops what is left."""

    def __init__(self, options: DemoOptions, console: Output) -> None:
        self.o = options
        self.c = console
        self.result = DemoResult(directory=options.directory.resolve())
        self.emu: EmulatorServer | None = None
        self.server: ProtoGeniServer | None = None
        self.session: Any = None
        self.hardware_type = ""
        self.cores = 0
        self.t0 = time.monotonic()

    @property
    def dir(self) -> Path:
        return self.result.directory

    # ---------------------------------------------------------------- step 1
    def start_emulator(self) -> None:
        self.c.step("Start CloudLab in a box (the emulator: SA + CM over TLS, its own CA)",
                    "emulator")
        init_emulator(self.dir, port=0)
        self.emu = EmulatorServer(self.dir, port=0, boot_delay=self.o.boot_delay)
        self.emu.start()
        self.result.url = self.emu.url
        assert self.emu.ctx is not None
        inv = self.emu.ctx.inventory
        self.c.detail("directory", f"{rel(self.dir)}/  (each node's own / in "
                                   f"nodes/<node>/root/)")
        self.c.detail("URL", f"{self.emu.url}  (/sa, /cm, /dynslice)")
        self.c.detail("client config", rel(self.emu.config_path))
        self.c.detail("inventory", ", ".join(f"{t.count} {t.name} ({t.cores} cores)"
                                             for t in inv.types.values()))
        self.hardware_type = self.o.hardware_type or inv.default_type
        if self.hardware_type not in inv.types:
            raise DemoError(f"--hardware-type {self.hardware_type}: the emulator has none; "
                            f"it has {', '.join(inv.types)}")
        # CloudLab publishes cores per hardware type; the emulator's inventory is that list.
        self.cores = inv.types[self.hardware_type].cores

    # ---------------------------------------------------------------- step 2
    def create_sliver(self) -> None:
        n = self.o.nodes
        self.c.step(f"Create a slice and a {n}-node sliver with the ProtoGENI client (TLS)",
                    "slice and sliver")
        assert self.emu is not None
        self.server = ProtoGeniServer(load_config(self.emu.config_path))
        server = self.server
        self.c.detail("GetVersion", f"SA {server.get_version()}, CM API "
                                    f"{server.cm().get_version().get('api', '2')}")
        server.register_slice()
        self.result.slice_urn = server.slice_urn()
        self.c.detail("Register", self.result.slice_urn)
        ad = parse(server.discover_resources(available=True), source="DiscoverResources")
        free = ad.available_by_type.get(self.hardware_type, 0)
        self.c.detail("Discover", f"{free} {self.hardware_type} nodes available")
        if free < n + self.o.add_nodes:
            raise DemoError(f"{n + self.o.add_nodes} {self.hardware_type} nodes wanted, "
                            f"{free} available")
        specs = self.node_specs(range(n))
        self.c.detail("request", f"{n} x {self.hardware_type}, startup command: {STARTUP}")
        _, manifest = server.create_sliver(build_request(specs))
        self.take_manifest(manifest, "CreateSliver")
        mapping = ", ".join(f"{x.client_id} -> {x.node_id}" for x in self.result.nodes)
        self.c.detail("CreateSliver", mapping)
        self.wait_ready([s.client_id for s in specs])
        self.show_startup([s.client_id for s in specs])

    def node_specs(self, numbers: range) -> list[NodeSpec]:
        return [NodeSpec(f"node-{i}", hardware_type=self.hardware_type,
                         executes=[("sh", STARTUP)]) for i in numbers]

    def take_manifest(self, xml: str, how: str) -> None:
        """Record the manifest's nodes that are new (hostname, type, cores)."""
        known = {x.client_id for x in self.result.nodes}
        for node in parse(xml, source=f"{how} manifest").nodes:
            if node.client_id and node.client_id not in known:
                self.result.nodes.append(DemoNode(
                    client_id=node.client_id, component_id=node.component_id or "",
                    hostname=node.hostname or "", cores=self.cores, acquired_by=how,
                    hardware_type=node.hardware_type or self.hardware_type))

    def node(self, client_id: str) -> DemoNode:
        return next(x for x in self.result.nodes if x.client_id == client_id)

    def wait_ready(self, client_ids: list[str]) -> None:
        """Poll SliverStatus until ``client_ids`` are ready and their startup ran."""
        assert self.server is not None
        start = time.monotonic()
        deadline = start + self.o.timeout
        last = ""
        while True:
            status = self.server.sliver_status()
            mine = [status.node(c) for c in client_ids]
            nodes = [m for m in mine if m is not None]
            for ns in nodes:
                self.check_node(ns)
            counts = Counter(ns.status for ns in nodes)
            ran = sum(1 for ns in nodes if ns.execute_state == "exited")
            line = (f"sliver {status.status:<9} ready {counts['ready']}/{len(client_ids)}"
                    f"  startup done {ran}/{len(client_ids)}")
            done = len(nodes) == len(client_ids) and ran == len(nodes) \
                and counts["ready"] == len(nodes)
            if line != last or done:
                self.c.progress(f"{time.monotonic() - start:5.1f}s  SliverStatus: {line}", done)
                last = line
            if done:
                return
            if time.monotonic() > deadline:
                raise DemoError(f"nodes {', '.join(client_ids)} not ready after "
                                f"{self.o.timeout:g}s (last: {line})")
            time.sleep(POLL)

    def check_node(self, ns: NodeStatus) -> None:
        demo_node = self.node(ns.client_id)
        demo_node.status = ns.status
        demo_node.execute_status = ns.execute_status
        if ns.failed:
            raise DemoError(f"node {ns.client_id} failed to boot: {ns.error or ns.rawstate}")
        if ns.execute_state == "exited" and ns.execute_status not in ("0", None):
            said = (NodeDir(self.dir / "nodes" / demo_node.node_id).runlog_text() or "")
            last = " / ".join(said.strip().splitlines()[-3:]) or "(its runlog is empty)"
            raise DemoError(f"startup command of {ns.client_id} exited with "
                            f"{ns.execute_status}: {last} (all of it: elasticslice emulator "
                            f"log --dir {rel(self.dir)} {demo_node.node_id})")

    def show_startup(self, client_ids: list[str]) -> None:
        """Show that the startup command really ran: the file it wrote on its node (its
        ``/tmp/started``, in the node's root folder on this machine)."""
        for cid in client_ids:
            x = self.node(cid)
            path = self.dir / "nodes" / x.node_id / "root" / "tmp" / "started"
            try:
                x.started = path.read_text(encoding="utf-8").strip()
            except OSError as err:
                raise DemoError(f"{cid}: the startup command ran but {rel(path)} is "
                                f"missing: {err.strerror or err}") from err
            self.c.detail("startup ran" if cid == client_ids[0] else "",
                          f"{cid}: exit {x.execute_status}; {rel(path)}: {x.started}")

    # ---------------------------------------------------------------- step 3
    def add_nodes(self) -> None:
        first, n = self.o.nodes, self.o.add_nodes
        self.c.step(f"Grow the sliver: AddNodes {n} more {self.hardware_type} node(s)",
                    "AddNodes")
        assert self.server is not None
        specs = self.node_specs(range(first, first + n))
        # AddNodes has no hardware type (CloudLab's CM reads five keys): each node names a
        # free node of the type, from the advertisement
        free = parse(self.server.discover_resources(available=True),
                     source="DiscoverResources").nodes
        args, left_out = pin_add_args(add_nodes_args(specs), {self.hardware_type: [
            x.component_name or "" for x in free
            if x.available and self.hardware_type in x.hardware_types]})
        if left_out:
            raise DemoError(f"{n} {self.hardware_type} nodes wanted, {n - len(left_out)} free")
        manifest = self.server.add_nodes(args)
        self.take_manifest(manifest, "AddNodes")
        self.c.detail("AddNodes", ", ".join(f"{s.client_id} -> {self.node(s.client_id).node_id}"
                                            for s in specs))
        self.wait_ready([s.client_id for s in specs])
        self.show_startup([s.client_id for s in specs])
        self.show_table()

    def show_table(self) -> None:
        nodes = self.result.nodes
        prefix = nodes[0].component_id.rsplit("+", 1)[0] + "+" if nodes else ""
        rows = [("client_id", f"component_id ({prefix}...)", "hostname", "type", "cores",
                 "status")]
        rows += [(x.client_id, x.node_id, x.hostname, x.hardware_type, str(x.cores), x.status)
                 for x in nodes]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        self.c.detail("nodes")
        for r in rows:
            self.c.detail("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())

    # ---------------------------------------------------------------- step 4
    def run_workflow(self) -> None:
        import troy
        from troy.output import OutputKeeper
        from troy.report import build_report
        ready = [x for x in self.result.nodes if x.status == "ready"]
        fw = self.o.framework
        self.c.step(f"Run a WfCommons workflow with Troy: one pilot per ready node "
                    f"({len(ready)}), {fw} framework", "Troy workflow")
        if not ready:
            raise DemoError("no ready node to put a pilot on")
        workload = self.load_workflow(min(x.cores for x in ready))
        outputs = OutputKeeper(self.dir / "output").open()  # tasks' stdout/stderr
        outputs.watch(workload)
        total = len(workload.tasks)
        work = sum(t.description.runtime or 0.0 for t in workload.tasks.values())
        self.c.detail("workflow", f"{self.o.workflow.name}: {total} tasks, {work:.1f} s of "
                                  f"task time (recorded runtimes x {self.o.time_scale:g})")
        sandbox = self.dir / "troy"
        (sandbox / "units").mkdir(parents=True, exist_ok=True)
        self.session = session = troy.Session(store_path=sandbox / "troy.sqlite")
        session.add_framework(fw, name=fw, sandbox=str(sandbox / "units"))
        overlay = troy.Overlay([troy.PilotDescription(size=x.cores, framework=fw,
                                                      resource=x.hostname, tag=x.client_id)
                                for x in ready])
        self.c.detail("pilots", ", ".join(f"{x.client_id} ({x.cores} cores)" for x in ready)
                      + f" = {sum(x.cores for x in ready)} cores")
        self.c.detail("note", "--static: these pilots run on THIS machine, one per acquired "
                              "node and sized to its cores;")
        self.c.detail("", "the default (elastic) demo makes every node a pilot instead.")
        started = time.monotonic()
        troy.OverlayManager(session).manage_overlay(overlay)    # every pilot RUNNING
        self.c.detail("pilots up", f"{len(ready)} {fw} pilots RUNNING after "
                                   f"{time.monotonic() - started:.1f} s"
                      + (" (Dask worker processes with a cores resource)" if fw == "dask"
                         else " (core budgets of this process)"))
        state, wall = self.execute(session, workload, overlay, total)
        report = build_report(workload, state, wall, outputs=outputs, base=str(self.dir))
        names = {op.pilot.id: op.description.tag for op in overlay.pilots.values()
                 if op.pilot is not None}
        units = {e["unit"]: names.get(e["pilot"], e["pilot"]) for e in report["tasks"]
                 if e["unit"]}
        per_node = Counter(units.values())
        for x in ready:
            x.units = per_node.get(x.client_id, 0)
        overlay.cancel()
        self.session = None
        session.close()
        self.c.detail("result", f"{report['state']}: {report['tasks_done']}/{total} tasks "
                                f"done, {report['tasks_failed']} failed, "
                                f"{report['tasks_canceled']} canceled; {len(units)} units; "
                                f"makespan {report['makespan_s']:.2f} s")
        self.c.detail("units/pilot", ", ".join(f"{x.client_id} {x.units}" for x in ready))
        self.result.troy = {**{k: v for k, v in report.items() if k != "tasks"},
                            "framework": fw, "workflow": str(self.o.workflow),
                            "workflow_name": self.o.workflow.name,
                            "time_scale": self.o.time_scale,
                            "pilots": {x.client_id: {"cores": x.cores, "units": x.units,
                                                     "resource": x.hostname} for x in ready},
                            "tasks": report["tasks"]}
        if report["state"] != "DONE":
            raise DemoError(f"workflow ended {report['state']}: {report['tasks_failed']} "
                            f"task(s) failed, {report['tasks_canceled']} canceled "
                            f"(see {rel(self.result.report_path)})")

    def load_workflow(self, max_cores: int | None) -> Any:
        """The workflow as a Troy Workload (tasks wider than ``max_cores`` are narrowed)."""
        from troy.workload.files import load_workload
        return load_workload(self.o.workflow, time_scale=self.o.time_scale,
                             max_cores=max_cores)

    def execute(self, session: Any, workload: Any, overlay: Any,
                total: int) -> tuple[Any, float]:
        """``execute_workload`` in a thread (``troy.WorkloadRun``); progress here, fed by
        task events."""
        import troy
        from troy.errors import NoSuccess
        # early binding spreads the units over every node's pilot by its cores
        run = troy.WorkloadRun(session, workload, overlay, bind_mode="early",
                               timeout=self.o.timeout, name="demo-troy")
        started = time.monotonic()
        run.start()
        seen: set[str] = set()
        step, shown = max(1, total // 4), 0
        for tid, state in run.events():   # (it notices a Ctrl-C while no task ends)
            if not state.is_final:
                continue
            seen.add(tid)
            if self.c.tty or len(seen) - shown >= step or len(seen) == total:
                shown = len(seen)
                self.c.progress(f"{time.monotonic() - started:5.1f}s  tasks final "
                                f"{shown}/{total}", shown == total)
        err = run.exception()
        if isinstance(err, NoSuccess) and not workload.finished:
            raise DemoError(f"the workflow did not finish within --timeout "
                            f"{self.o.timeout:g}s (a smaller --time-scale is faster)") from err
        if err is not None:
            raise err
        return run.result(), time.monotonic() - started

    # ---------------------------------------------------------------- step 5
    def release(self) -> None:
        self.c.step("Give the nodes back (DeleteNodes, DeleteSlice) and stop the emulator",
                    "release")
        assert self.server is not None and self.emu is not None
        added = [x for x in self.result.nodes if x.acquired_by == "AddNodes"]
        manifest = self.server.delete_nodes([x.client_id for x in added])
        left = {n.client_id for n in parse(manifest, source="DeleteNodes manifest").nodes}
        for x in added:
            if x.client_id in left:
                raise DemoError(f"DeleteNodes: {x.client_id} is still in the manifest")
            x.released_by = "DeleteNodes"
        wiped = all(not (self.dir / "nodes" / x.node_id).exists() for x in added)
        self.c.detail("DeleteNodes", f"{', '.join(x.client_id for x in added)}; "
                                     f"{len(left)} node(s) left"
                                     + ("; their sandboxes are wiped" if wiped else ""))
        self.server.delete_slice()
        for x in self.result.nodes:
            if x.released_by is None:
                x.released_by = "DeleteSlice"
        self.c.detail("DeleteSlice", f"{self.result.slice_urn} (the sliver and its "
                                     f"{len(left)} node(s) released)")
        port = self.emu.port
        self.stop_emulator()
        self.result.emulator_stopped = not port_open(port)
        self.c.detail("emulator", f"stopped; port {port} "
                                  + ("closed" if self.result.emulator_stopped else "STILL OPEN"))
        if not self.result.emulator_stopped:
            raise DemoError(f"the emulator still answers on port {port} after stop")

    # ---------------------------------------------------------------- life cycle
    def run(self) -> DemoResult:
        """Every step; the report is written after a failure too (what was done so far)."""
        self.load_workflow(None)   # a bad workflow file fails now, not after step 3
        try:
            self.start_emulator()
            self.create_sliver()
            self.add_nodes()
            self.run_workflow()
            self.release()
        finally:
            self.result.seconds = time.monotonic() - self.t0
            self.write_report()
        return self.result

    def write_report(self) -> None:
        try:
            self.result.report_path.write_text(
                json.dumps(self.result.to_json(), indent=1) + "\n", encoding="utf-8")
            self.result.report_written = True
        except OSError:
            log.exception("cannot write %s", self.result.report_path)

    def stop_emulator(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.emu is not None:
            emu, self.emu = self.emu, None
            stop_emulator(emu)

    def close(self) -> None:
        """Stop whatever is still running (after a failure or an interrupt). Idempotent."""
        session, self.session = self.session, None
        if session is not None:
            log.info("closing the Troy session (pilots, units)")
            try:
                session.close()
            except Exception:
                log.exception("closing the Troy session failed")
        try:
            self.stop_emulator()
        except Exception:
            log.exception("stopping the emulator failed")

