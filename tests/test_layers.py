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
