"""Per-test CPU, for finding the suite's costliest tests; loaded only when asked for.

    CPUPROFILE_OUT=/tmp/cpu.jsonl python -m pytest -n 7 --dist worksteal -p tests.cpuprofile_plugin

Each test (setup + call + teardown) appends one JSON line to ``$CPUPROFILE_OUT``: its
nodeid, its module, the xdist worker, the CPU (user + system seconds) of the worker
process itself (``RUSAGE_SELF``) and of the children it reaped meanwhile
(``RUSAGE_CHILDREN``), and its wall time. Module- and session-scoped fixtures charge their
setup to the first test that uses them (and their teardown to the last): group per module
to see a module's whole cost. Children still running at a test's end (a daemon that
outlives it) are charged to whichever test reaps them. Summarise with
``python -m tests.cpuprofile_plugin FILE``.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get("CPUPROFILE_OUT")
    self0, children0, wall0 = (_cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN),
                               time.monotonic())
    yield
    if not out:
        return
    record = {
        "test": item.nodeid, "module": item.nodeid.split("::")[0],
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "self": round(_cpu(resource.RUSAGE_SELF) - self0, 3),
        "children": round(_cpu(resource.RUSAGE_CHILDREN) - children0, 3),
        "wall": round(time.monotonic() - wall0, 3),
    }
    with open(out, "a") as f:   # one short line per write: appends from workers do not mix
        f.write(json.dumps(record) + "\n")


def summarise(path: str, tests: int = 40, modules: int = 20) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    for r in rows:
        r["cpu"] = r["self"] + r["children"]
    total = sum(r["cpu"] for r in rows)
    print(f"{len(rows)} tests, {total:.1f} s CPU (own {sum(r['self'] for r in rows):.1f}, "
          f"children {sum(r['children'] for r in rows):.1f}), "
          f"test wall summed {sum(r['wall'] for r in rows):.1f} s")
    print(f"\ntop {tests} tests by CPU (own + children)  own  children  wall")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:tests]:
        print(f"{r['cpu']:7.1f} {r['self']:6.1f} {r['children']:6.1f} {r['wall']:6.1f}  {r['test']}")
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        m = per[r["module"]]
        m[0] += r["cpu"]; m[1] += r["self"]; m[2] += r["wall"]; m[3] += 1
    print(f"\ntop {modules} modules by CPU  own  wall  tests")
    for name, (cpu, own, wall, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:modules]:
        print(f"{cpu:7.1f} {own:6.1f} {wall:6.1f} {n:4d}  {name}")


if __name__ == "__main__":
    summarise(sys.argv[1], *map(int, sys.argv[2:]))
