"""Build the C RSpec reader (``_fastrspec.c``) next to its source: ``python -m
elasticslice.rspec.fastbuild`` (``make`` runs it as part of the set-up).

The reader needs a C compiler, this Python's headers, and the libxml2 headers lxml ships in
its wheel (``lxml/includes``): nothing else, and no libxml2 of the system (it runs lxml's
own, looked up in lxml's module). Without a compiler :func:`elasticslice.rspec.parse` reads
RSpecs in Python, the same records about four times slower (docs/benchmarks.md); this
prints one line saying so and exits 0, as ``make`` goes on either way. ``--check``: exit 1
when the reader is not built and importable (the tests' way to see a set-up that lost it).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_fastrspec.c"


def target() -> Path:
    """Where the built module goes (this Python's extension suffix)."""
    return HERE / f"_fastrspec{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def compiler() -> list[str] | None:
    """This Python's C compiler command (``CC``, else ``cc``), if there is one."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = shlex.split(cc)
    from shutil import which
    return argv if argv and which(argv[0]) else None


def command(cc: list[str], out: Path) -> list[str]:
    import lxml
    lxml_includes = Path(lxml.__file__).parent / "includes"
    return [*cc, "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall",
            f"-I{sysconfig.get_paths()['include']}", f"-I{lxml_includes}",
            str(SOURCE), "-o", str(out), "-ldl"]


def up_to_date(out: Path) -> bool:
    import lxml
    if not out.exists():
        return False
    built = out.stat().st_mtime
    return built >= SOURCE.stat().st_mtime and built >= Path(lxml.__file__).stat().st_mtime


def build(force: bool = False) -> str:
    """Build the reader if it is missing or older than its source or lxml; one line on
    what happened."""
    out = target()
    if not force and up_to_date(out):
        return f"C RSpec reader: {out.name} is up to date"
    cc = compiler()
    if cc is None:
        return ("C RSpec reader: no C compiler here; RSpecs are read in Python (the same "
                "records, slower)")
    with tempfile.TemporaryDirectory() as tmp:   # built aside, then moved in whole
        built = Path(tmp) / out.name
        proc = subprocess.run(command(cc, built), capture_output=True, text=True)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["?"])[0]
            return (f"C RSpec reader: not built ({first}); RSpecs are read in Python (the "
                    "same records, slower)")
        os.replace(built, out)
    return f"C RSpec reader: built {out.name}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        from elasticslice.rspec import fast
        problem = fast.problem()
        print(f"C RSpec reader: {problem or 'loaded'}")
        return 1 if problem else 0
    print(build(force="--force" in args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
