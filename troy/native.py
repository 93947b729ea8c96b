"""Build optional C modules next to their sources: ``python -m troy.native`` (``make`` runs
it as part of the set-up).

Troy's own is ``troy/_spawn.c``: a unit's process run to its end without the GIL
(vfork and execve, its pipes read and its exit watched in C), which :mod:`troy.execution` uses
where it is built and replaces with ``subprocess`` where it is not, with the same results.
(``elasticslice.rspec.fastbuild`` builds the C RSpec reader the same way.)

A module needs a C compiler and this Python's headers, nothing else. Without them this
prints one line saying Python does the work and exits 0 (``make`` goes on either way);
``--check``: exit 1 when a module is not built and loaded (how the tests see a set-up that
lost one); ``--force``: build again.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Module:
    """A C module: its source, its import name, what it is for (one phrase), what else it
    compiles against (include folders; files whose change means a rebuild; libraries), and
    ``problem()``: why it is not in use (None: it is)."""

    source: Path
    name: str
    purpose: str
    problem: Callable[[], str | None]
    includes: Callable[[], list[Path]] = list
    depends: Callable[[], list[Path]] = list
    libraries: tuple[str, ...] = field(default=())

    def target(self) -> Path:
        """Where the built module goes (this Python's extension suffix)."""
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        return self.source.with_name(self.name.rsplit(".", 1)[-1] + suffix)


def _spawn_problem() -> str | None:
    from troy import execution
    return execution.native_problem()


SPAWN = Module(ROOT / "troy" / "_spawn.c", "troy._spawn", "units' processes", _spawn_problem)


def compiler() -> list[str] | None:
    """This Python's C compiler command (``CC``, else ``cc``), if there is one."""
    from shutil import which
    argv = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    return argv if argv and which(argv[0]) else None


def command(module: Module, cc: list[str], out: Path) -> list[str]:
    return [*cc, "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall",
            f"-I{sysconfig.get_paths()['include']}",
            *(f"-I{path}" for path in module.includes()),
            str(module.source), "-o", str(out), *(f"-l{lib}" for lib in module.libraries)]


def up_to_date(module: Module) -> bool:
    out = module.target()
    if not out.exists():
        return False
    built = out.stat().st_mtime
    return all(built >= path.stat().st_mtime for path in [module.source, *module.depends()])


def build(module: Module, force: bool = False) -> str:
    """Build ``module`` if it is missing or older than what it is built from; one line on
    what happened."""
    out, fallback = module.target(), f"{module.purpose} run in Python (the same results, slower)"
    if not force and up_to_date(module):
        return f"C {module.name}: up to date"
    cc = compiler()
    if cc is None:
        return f"C {module.name}: no C compiler here; {fallback}"
    with tempfile.TemporaryDirectory() as tmp:   # built aside, then moved in whole
        built = Path(tmp) / out.name
        proc = subprocess.run(command(module, cc, built), capture_output=True, text=True)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["?"])[0]
            return f"C {module.name}: not built ({first}); {fallback}"
        os.replace(built, out)
    return f"C {module.name}: built {out.name}"


def main(argv: list[str] | None = None, modules: tuple[Module, ...] = (SPAWN,)) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        problems = {m.name: m.problem() for m in modules}
        for name, why in problems.items():
            print(f"C {name}: {why or 'loaded'}")
        return 1 if any(problems.values()) else 0
    for module in modules:
        print(build(module, force="--force" in args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
