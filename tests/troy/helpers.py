"""Helpers for the Troy tests: workloads more than one test module runs."""
from __future__ import annotations

from pathlib import Path

import troy
from troy import Relation


def diamond(out: Path) -> troy.Workload:
    """split → 3 parallel workers (cardinality) → join, each leaving a file."""
    w = troy.Workload()
    split = w.add_task({"executable": "/bin/sh", "arguments": ["-c", f"echo go > {out}/split"]})
    work = w.add_task({"executable": "/bin/sh", "cardinality": 3, "arguments": [
        "-c", f"cat {out}/split > {out}/work.%(cardinal)s"]})
    join = w.add_task({"executable": "/bin/sh", "arguments": [
        "-c", f"cat {out}/work.* > {out}/join"]})
    w.add_relation([Relation(split, work), Relation(work, join)])
    return w
