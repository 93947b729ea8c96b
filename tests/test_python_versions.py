"""The project runs on Python 3.10 and later (setup.cfg), on the control node and on the
nodes (Ubuntu 22.04's python3 is 3.10, 24.04's 3.12). Kept true cheaply:

- every module is read for what the standard library gained after 3.10 (a name, a module,
  ``except*``) and for ``fromisoformat``, whose 3.10 form refuses a ``Z``
  (``elasticslice.isotime.parse_iso`` reads alike on both): no interpreter needed;
- where this machine has a Python 3.10 (pyenv's, or on PATH), every module is compiled and
  imported with it: in ``.venv/py310`` when ``make test-py310`` made it (every dependency),
  else with the dependencies that interpreter can see (a module that stops at a missing
  third-party import counts; one that stops at anything else fails). (Python 3.12, Ubuntu
  24.04's: the node's modules run there in tests/elasticslice/pilots/test_node_install.py.)
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGES = ("elasticslice", "troy", "bench")
#: module -> names it gained after Python 3.10 ("" : the module itself is newer)
NEWER = {
    "tomllib": {""}, "wsgiref.types": {""},
    "datetime": {"UTC"},
    "enum": {"StrEnum", "ReprEnum", "verify", "member", "nonmember", "global_enum",
             "EnumCheck", "FlagBoundary", "show_flag_values"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type",
               "reveal_type", "dataclass_transform", "TypeVarTuple", "Unpack", "Required",
               "NotRequired", "override", "get_overloads", "clear_overloads"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier"},
    "hashlib": {"file_digest"},
    "contextlib": {"chdir"},
    "logging": {"getLevelNamesMapping"},
    "operator": {"call"},
    "inspect": {"getmembers_static"},
    "math": {"cbrt", "exp2"},
    "sys": {"exception"},
    "itertools": {"batched"},
}
BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
ISOTIME = REPO / "elasticslice" / "isotime.py"


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def newer_than_310(path: Path, root: Path = REPO) -> list[str]:
    """``path:line what`` (relative to ``root``) for each use of something Python 3.10
    lacks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name
                if "" in NEWER.get(alias.name, ()):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            if "" in NEWER.get(node.module, ()):
                found.append((node.lineno, f"from {node.module} import"))
            for alias in node.names:
                if alias.name in NEWER.get(node.module, ()):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.attr in NEWER.get(
                    aliases.get(node.value.id, ""), ()):
                found.append((node.lineno, f"{aliases[node.value.id]}.{node.attr}"))
            elif node.attr == "fromisoformat" and path != ISOTIME:
                found.append((node.lineno, "fromisoformat (3.10 refuses 'Z': "
                                           "elasticslice.isotime.parse_iso)"))
            elif node.attr == "add_note":
                found.append((node.lineno, "BaseException.add_note"))
        elif isinstance(node, ast.Name) and node.id in BUILTINS:
            found.append((node.lineno, node.id))
        elif type(node).__name__ == "TryStar":
            found.append((node.lineno, "except*"))
    return [f"{path.relative_to(root)}:{line} {what}" for line, what in sorted(found)]


def test_no_module_uses_what_python_310_lacks() -> None:
    assert [hit for path in modules() for hit in newer_than_310(path)] == []


def test_the_check_sees_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    star = sys.version_info >= (3, 11)  # a 3.10 cannot even parse except*
    sample.write_text("import datetime as dt\nimport tomllib\nfrom typing import Self\n"
                      "when = dt.UTC\nx = dt.datetime.fromisoformat('2026-01-01T00:00:00Z')\n"
                      + ("try:\n    pass\nexcept* ValueError:\n    pass\n" if star else "")
                      + "raise ExceptionGroup('x', [])\n")
    assert [h.split(" ", 1)[1] for h in newer_than_310(sample, tmp_path)] == [
        "import tomllib", "typing.Self", "datetime.UTC",
        "fromisoformat (3.10 refuses 'Z': elasticslice.isotime.parse_iso)",
        *(["except*"] if star else []), "ExceptionGroup"]


# ------------------------------------------------------------ with the interpreter --------
IMPORT_ALL = r'''
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
stdlib, names = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])
failed, missing = {}, {}
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if top and top not in stdlib and top not in ("elasticslice", "troy", "bench"):
            missing[name] = top
        else:
            failed[name] = "%s: %s" % (type(err).__name__, err)
    except BaseException as err:
        failed[name] = "%s: %s" % (type(err).__name__, err)
print(json.dumps({"failed": failed, "missing": missing}))
'''
COMPILE_ALL = r'''
import json, sys
bad = {}
for path in json.loads(sys.argv[1]):
    try:
        compile(open(path, encoding="utf-8").read(), path, "exec", dont_inherit=True)
    except SyntaxError as err:
        bad[path] = "%s:%s %s" % (err.lineno, err.offset, err.msg)
print(json.dumps(bad))
'''


def interpreter(version: str) -> tuple[str | None, bool]:
    """A Python ``version`` here, and whether it has the project's dependencies (the
    ``make test-py310`` venv)."""
    venv = REPO / ".venv" / f"py{version.replace('.', '')}" / "bin" / "python"
    if venv.exists():
        return str(venv), True
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    return (str(found[-1]) if found else shutil.which(f"python{version}")), False


def module_names() -> list[str]:
    names = []
    for path in modules():
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


@pytest.mark.slow
@pytest.mark.parametrize("version", ["3.10"])
def test_every_module_compiles_and_imports_on(version: str) -> None:
    python, complete = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1",
           "HOME": str(Path.home())}
    compiled = subprocess.run([python, "-c", COMPILE_ALL, json.dumps(list(map(str,
                                                                             modules())))],
                              capture_output=True, text=True, timeout=300, env=env)
    assert json.loads(compiled.stdout) == {}, compiled.stderr
    done = subprocess.run([python, "-c", IMPORT_ALL, json.dumps(sorted(
        sys.stdlib_module_names)), json.dumps(module_names())], capture_output=True,
        text=True, timeout=300, env=env, cwd=REPO)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}, done.stderr[-2000:]
    if complete:
        assert result["missing"] == {}
