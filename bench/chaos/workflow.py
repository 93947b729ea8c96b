"""The chaos workflow: a WfCommons trace as a Troy workload file whose every task leaves a
line in ``<ran>/<task>`` each time its work runs to the end (the node, the time).

``elasticslice run`` runs that file. Duplicate runs are then counted from what ran
(:func:`completions`), not from what a process counted: a process SIGKILLed between a
unit's end and its record does not make a rerun invisible. The tasks run on the emulator's
nodes, which see none of this machine's files: each tells a :class:`Recorder` (plain HTTP
at the box's control address, where its nodes reach this machine, in the chaos process) with
``curl``, and the recorder writes the line.
"""
from __future__ import annotations

import http.server
import json
import re
import shlex
import threading
from pathlib import Path

_RECORD = re.compile(r"^/ran/([\w.-]+)/([\w.-]*)/([\d.]+)$")


class Recorder:
    """``GET /ran/<task>/<node>/<time>`` appends ``<node> <time>`` to ``ran/<task>``."""

    def __init__(self, ran: Path, host: str = "127.0.0.1") -> None:
        self.ran = ran
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                match = _RECORD.match(self.path)
                if match and match.group(1) in (".", ".."):
                    match = None
                if match:
                    task, node, when = match.groups()
                    with lock, open(ran / task, "a", encoding="utf-8") as out:
                        out.write(f"{node} {when}\n")
                self.send_response(200 if match else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def recording_workflow(trace: Path, out: Path, ran: Path, time_scale: float,
                       recorder: str) -> int:
    """Write to ``out`` the tasks and relations of ``trace`` (WfFormat, runtimes times
    ``time_scale``), each a ``/bin/sh`` that sleeps its runtime, then tells the recorder at
    URL ``recorder`` its node (``geni-get client_id``) and the time (written to
    ``ran/<task>``); returns the number of tasks."""
    from troy.workload.files import load_workload
    workload = load_workload(trace, time_scale=time_scale)
    ran.mkdir(parents=True, exist_ok=True)
    tasks = []
    for uid, task in workload.tasks.items():
        d = task.description
        seconds = " ".join(shlex.quote(str(a)) for a in d.arguments)
        record = f'"{recorder}/ran/{uid}/$(geni-get client_id)/$(date +%s.%N)"'
        tasks.append({"id": uid, "executable": "/bin/sh", "cores": d.cores,
                      "runtime": d.runtime,
                      "arguments": ["-c", f"sleep {seconds} && curl -sf {record} >/dev/null"]})
    relations = [[r.head, r.tail] for r in workload.relations]
    out.write_text(json.dumps({"name": f"chaos: {trace.name}", "tasks": tasks,
                               "relations": relations}, indent=1) + "\n")
    return len(tasks)


def completions(ran: Path) -> dict[str, int]:
    """task id -> how many times its work ran to the end."""
    return {p.name: p.read_text().count("\n") for p in sorted(ran.iterdir())} \
        if ran.is_dir() else {}
