"""The chaos workflow: a WfCommons trace as a Troy workload file whose every task leaves a
line in ``<ran>/<task>`` each time its work runs to the end (the node, the time).

``elasticslice run`` runs that file. Duplicate runs are then counted from what ran
(:func:`completions`), not from what a process counted: a process SIGKILLed between a
unit's end and its record does not make a rerun invisible.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path


def recording_workflow(trace: Path, out: Path, ran: Path, time_scale: float) -> int:
    """Write to ``out`` the tasks and relations of ``trace`` (WfFormat, runtimes times
    ``time_scale``), each a ``/bin/sh`` that sleeps its runtime, then appends its node
    and the time to ``ran/<task>``; returns the number of tasks."""
    from troy.workload.files import load_workload
    workload = load_workload(trace, time_scale=time_scale)
    ran.mkdir(parents=True, exist_ok=True)
    tasks = []
    for uid, task in workload.tasks.items():
        d = task.description
        seconds = " ".join(shlex.quote(str(a)) for a in d.arguments)
        record = shlex.quote(str(ran / uid))
        line = '"$ELASTICSLICE_CLIENT_ID $(date +%s.%N)"'
        tasks.append({"id": uid, "executable": "/bin/sh", "cores": d.cores,
                      "runtime": d.runtime,
                      "arguments": ["-c", f"sleep {seconds} && echo {line} >> {record}"]})
    relations = [[r.head, r.tail] for r in workload.relations]
    out.write_text(json.dumps({"name": f"chaos: {trace.name}", "tasks": tasks,
                               "relations": relations}, indent=1) + "\n")
    return len(tasks)


def completions(ran: Path) -> dict[str, int]:
    """task id -> how many times its work ran to the end."""
    return {p.name: p.read_text().count("\n") for p in sorted(ran.iterdir())} \
        if ran.is_dir() else {}
