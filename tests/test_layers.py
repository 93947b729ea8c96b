"""The layers: the library never imports the command line (``elasticslice.commands``,
``elasticslice.cli``, ``troy.cli``), and Troy never imports elasticslice. Read from the
source (every import statement, at module level or inside a function), not from what one
run happened to import."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.helpers import REPO

CLI = ("elasticslice.commands", "elasticslice.cli", "troy.cli")


def imports(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every module ``source`` (a module of ``package``) imports
    (``from a import b``: ``a`` and ``a.b``, since ``b`` may be a module)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            yield node.lineno, base
            yield from ((node.lineno, f"{base}.{a.name}") for a in node.names)


def under(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def offenders(package: str, exempt: tuple[str, ...], banned: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if under(name, exempt):
            continue
        source = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(REPO)}:{line} imports {mod}"
                  for line, mod in imports(source, name.rpartition(".")[0])
                  if under(mod, banned)]
    return found


def test_no_library_module_imports_the_command_line() -> None:
    assert offenders("elasticslice", ("elasticslice.commands", "elasticslice.cli"), CLI) == []
    assert offenders("troy", ("troy.cli",), CLI) == []


def test_troy_never_imports_elasticslice() -> None:
    assert offenders("troy", (), ("elasticslice",)) == []


def test_the_check_sees_imports_inside_functions_and_relative_ones() -> None:
    """What broke: elasticslice/pilots/cluster.py took ``lock_state_dir`` from
    ``elasticslice.commands.manage`` inside a method."""
    inside = "def start():\n    from elasticslice.commands.manage import lock_state_dir\n"
    assert under(list(imports(inside, "elasticslice.pilots"))[0][1], CLI)
    relative = "from ..commands import run\n"
    assert "elasticslice.commands.run" in [m for _, m in imports(relative,
                                                               "elasticslice.pilots")]
    plain = "import troy.cli as c\n"
    assert under(list(imports(plain, "elasticslice.demo"))[0][1], CLI)


# -- the seam to Troy ----------------------------------------------------------------------
#: Troy's pilot frameworks are public as packages only: what ``troy.frameworks`` and
#: ``troy.frameworks.dask`` export (their ``__all__``, docs/troy.md and docs/troy-dask.md).
#: Their modules (``base``, ``drain``, ``dask.tls``, ``dask.enrol``, ``dask.denylist``...)
#: are Troy's insides: elasticslice imports none of them.
FRAMEWORK_PACKAGES = ("troy.frameworks", "troy.frameworks.dask")
#: the bridge to Troy: the only modules of elasticslice that drive Troy's frameworks
BRIDGE = ("elasticslice.pilots", "elasticslice.dask", "elasticslice.parsl")
#: the Troy modules the bridge may import: the package, its state model and errors, and the
#: framework packages
BRIDGE_TROY = ("troy", "troy.states", "troy.errors", *FRAMEWORK_PACKAGES)
#: private attributes the bridge reaches on objects that are not Troy's (Parsl's): allowed
#: here, by file and expression, and nowhere else
FOREIGN_REACHES = {("elasticslice/parsl/drain.py", "executor._hold_manager"),
                   ("elasticslice/parsl/keys.py", "curvezmq.ServerContext._start_auth_thread")}


def from_troy(source: str) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name) for every import of a Troy module in ``source`` (``import
    troy.x``: name None; ``from troy.x import y``: name ``y``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name, None) for a in node.names
                        if under(a.name, ("troy",)))
        elif isinstance(node, ast.ImportFrom) and not node.level \
                and under(node.module or "", ("troy",)):
            yield from ((node.lineno, node.module or "", a.name) for a in node.names)


def exported(module: str) -> set[str]:
    import importlib
    return set(getattr(importlib.import_module(module), "__all__", ()))


def troy_import_problem(module: str, name: str | None, bridge: bool) -> str | None:
    """Why importing ``name`` from Troy's ``module`` is not the public API (None: it is)."""
    if any(part.startswith("_") for part in [*module.split("."), name or ""]):
        return "a private name"
    if under(module, ("troy.frameworks",)) and module not in FRAMEWORK_PACKAGES:
        return "a framework's module, not its package"
    if bridge and module not in BRIDGE_TROY:
        return f"not one of {', '.join(BRIDGE_TROY)}"
    if name is not None and module in ("troy", *FRAMEWORK_PACKAGES) \
            and name not in exported(module):
        return f"not in {module}.__all__"
    return None


def troy_offenders(source: str, module: str) -> list[str]:
    bridge = under(module, BRIDGE)
    return [f"{line}: {mod}{'' if name is None else ' import ' + name}: {why}"
            for line, mod, name in from_troy(source)
            if (why := troy_import_problem(mod, name, bridge)) is not None]


def private_reaches(source: str) -> list[tuple[int, str]]:
    """``x._name`` (and ``getattr(x, "_name")``) on anything but ``self``, ``cls`` and
    ``super()``: a reach into another object's insides."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) \
                    and base.func.id == "super":
                continue
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) \
                and str(node.args[1].value).startswith("_"):
            found.append((node.lineno, ast.unparse(node)))
    return found


def elasticslice_modules() -> Iterator[tuple[str, str, str]]:
    """(path relative to the repository, module name, source) of every elasticslice module."""
    for path in sorted((REPO / "elasticslice").rglob("*.py")):
        rel = path.relative_to(REPO)
        yield rel.as_posix(), ".".join(rel.with_suffix("").parts), \
            path.read_text(encoding="utf-8")


def test_elasticslice_uses_only_troys_public_framework_api() -> None:
    """What broke: ``pilots/`` took ``RENEW_URL_ENV`` from ``troy.frameworks.dask.enrol`` and
    ``DaskTLS`` from ``troy.frameworks.dask.tls``, and reached Dask's retirement with
    ``getattr(framework, "retire_worker")``: the seam is ``troy.frameworks.dask``'s exports
    and ``PilotFramework.retire``."""
    found = []
    for rel, module, source in elasticslice_modules():
        found += [f"{rel}:{o}" for o in troy_offenders(source, module.removesuffix(".__init__"))]
    assert found == []


def test_the_bridge_reaches_into_no_troy_object() -> None:
    found = []
    for rel, module, source in elasticslice_modules():
        if under(module.removesuffix(".__init__"), BRIDGE):
            found += [f"{rel}:{line}: {expr}" for line, expr in private_reaches(source)
                      if (rel, expr) not in FOREIGN_REACHES]
    assert found == []


def test_the_seam_check_sees_what_it_must() -> None:
    """A private import, a framework's module, a name the package does not export, a module
    the bridge may not use, a reach into a framework's insides: each is an offence."""
    bad = {
        "from troy.frameworks.dask.enrol import RENEW_URL_ENV\n": "a framework's module",
        "import troy.frameworks.dask.tls\n": "a framework's module",
        "from troy.frameworks.base import PilotFramework\n": "a framework's module",
        "def f():\n    from troy.frameworks.dask import _WHERE\n": "a private name",
        "from troy.frameworks.dask import agent\n": "not in troy.frameworks.dask.__all__",
        "from troy import frameworks\n": "not in troy.__all__",
        "from troy.unit import ComputeUnit\n": "not one of",
        "from troy._x import y\n": "a private name",
    }
    for source, why in bad.items():
        problems = troy_offenders(source, "elasticslice.pilots.manager")
        assert len(problems) == 1 and why in problems[0], (source, problems)
    good = ("from troy.frameworks.dask import DaskTLS, RENEW_URL_ENV, DenyList\n"
            "from troy.frameworks import Pilot, PilotFramework\n"
            "from troy.states import FINAL_STATES\nimport troy\nfrom troy import Overlay\n")
    assert troy_offenders(good, "elasticslice.pilots.manager") == []
    # outside the bridge, other public modules of Troy are fine; a framework's insides not
    assert troy_offenders("from troy.report import build_report\n",
                          "elasticslice.commands.run") == []
    assert troy_offenders("from troy.frameworks.dask.processes import silence_dask\n",
                          "elasticslice.commands.run") != []
    reaches = ("def f(framework, self):\n    framework._records.clear()\n"
               "    getattr(framework, '_by_addr')\n    self._ok = super()._fine()\n")
    assert sorted(e for _, e in private_reaches(reaches)) == [
        "framework._records", "getattr(framework, '_by_addr')"]
