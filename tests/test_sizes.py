"""The manager's house stays readable (issue 35): no module of ``managers/``, ``pilots/``,
``parsl/`` or ``dask.py`` over 450 lines, and no class there defining more than 25 public
methods beyond those seed 004 documents (the names users know: ``add_nodes``,
``manage_once``, ...). Read from the source."""
from __future__ import annotations

import ast
import re

from tests.helpers import REPO

MAX_LINES = 450
MAX_PUBLIC = 25
SEED = REPO.parent / "shared" / "seeds"


def seed_methods() -> set[str]:
    """The methods seed 004 documents (``name(args)[source]`` lines), or the ones it had
    when this test was written where the seeds are not beside the project (a fresh clone)."""
    found: set[str] = set()
    for path in sorted(SEED.glob("004_*.txt")) if SEED.is_dir() else []:
        found |= set(re.findall(r"^([a-z_]+)\(", path.read_text(encoding="utf-8"), re.M))
    return found or set(SEED_004)


SEED_004 = ("__init__ add_nodes create_rspec create_slice create_sliver delete_nodes end_delete "
            "ensure_slice ensure_sliver get_add_args get_delete_commands get_email "
            "get_node_status get_system_state handle_added_node handle_deleted_node "
            "has_pending_deletes is_adding is_deleting manage manage_once renew set_helper "
            "set_system_state should_add_nodes should_delete_nodes start start_delete stop "
            "update_all update_available update_sliver_status").split()


def modules() -> list:
    pkg = REPO / "elasticslice"
    return sorted([*(pkg / "managers").rglob("*.py"), *(pkg / "pilots").rglob("*.py"),
                   *(pkg / "parsl").rglob("*.py"), pkg / "dask.py"])


def test_no_module_is_over_450_lines() -> None:
    long = {str(p.relative_to(REPO)): n for p in modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_no_class_defines_more_than_25_public_methods_beyond_the_seed() -> None:
    seed = seed_methods()
    assert {"manage_once", "add_nodes", "get_add_args"} <= seed
    wide = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            public = [f.name for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and not f.name.startswith("_") and f.name not in seed]
            if len(public) > MAX_PUBLIC:
                wide[f"{path.relative_to(REPO)}:{node.name}"] = len(public)
    assert wide == {}


def test_the_seed_list_is_the_seeds() -> None:
    """Beside the seeds, the list this test falls back on is theirs."""
    if SEED.is_dir():
        assert seed_methods() == set(SEED_004)
