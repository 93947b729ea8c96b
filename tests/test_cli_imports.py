"""What a short command of `elasticslice` imports: only what it uses.

The suite starts the command line hundreds of times, and each heavy package a command
imports without using it costs every start tens of ms of CPU. What broke: every command,
`--version` too, imported cryptography (the config took one helper from ``rpc.pki``), and
every client command the RSpec library and lxml (``rpc.cm`` -> ``rspec.addnodes``; the
client commands' modules). The slow tests run a command in a fresh interpreter and look at
``sys.modules`` when it ends; the fast ones read the light modules' own imports.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

#: packages a short command should not import unless it uses them
WATCHED = ("cryptography.x509", "lxml.etree", "elasticslice.rspec", "elasticslice.config",
           "elasticslice.rpc.pki", "elasticslice.rpc.credential", "elasticslice.managers",
           "elasticslice.emulator", "elasticslice.pilots", "apscheduler", "distributed",
           "dask", "parsl", "prometheus_client")
#: what none of the commands below needs
NEVER = {"elasticslice.managers", "elasticslice.emulator", "elasticslice.pilots",
         "apscheduler", "distributed", "dask", "parsl", "prometheus_client"}

_PROBE = """
import json, sys
from elasticslice.cli import cli
try:
    cli(sys.argv[2:], prog_name="elasticslice")
    code = 0
except SystemExit as done:
    code = done.code or 0
watched = json.loads(sys.argv[1])
print("\\nPROBE " + json.dumps({"exit": code,
                                 "loaded": sorted(m for m in watched if m in sys.modules)}))
"""


def loaded_by(*args: str, cwd: Path = REPO, **variables: str) -> set[str]:
    """The :data:`WATCHED` modules that ``elasticslice ARGS`` had imported when it ended (it
    must succeed). No ``ELASTICSLICE_*`` variable is passed on but ``variables``: each one
    makes the command line check the names it knows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICSLICE_")}
    env.update(variables)
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(WATCHED), *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    last = done.stdout.rstrip().splitlines()[-1] if done.stdout.strip() else ""
    assert last.startswith("PROBE "), (done.stdout, done.stderr)
    probe = json.loads(last[len("PROBE "):])
    assert probe["exit"] == 0, (done.stdout, done.stderr)
    return set(probe["loaded"])


@pytest.mark.slow
def test_version_imports_none_of_the_library():
    assert loaded_by("--version") == set()


@pytest.mark.slow
def test_rspec_validate_imports_neither_cryptography_nor_the_config():
    assert loaded_by("rspec", "validate", "rspecs/lan-4.xml") <= {"elasticslice.rspec",
                                                                   "lxml.etree"}


@pytest.mark.slow
def test_an_option_variable_is_checked_against_its_own_command_only():
    """``ELASTICSLICE_EMULATOR_SERVE_BOOT_DELAY`` (what the doc tests set for every command
    they run) is known from the ``emulator`` commands alone: checking it once loaded every
    command's module (the managers, the pilots, Dask: ~0.4 s of CPU per command line)."""
    assert loaded_by("rspec", "validate", "rspecs/lan-4.xml",
                     ELASTICSLICE_EMULATOR_SERVE_BOOT_DELAY="0.2").isdisjoint(
        {"elasticslice.managers", "elasticslice.pilots", "distributed", "apscheduler"})


@pytest.mark.slow
def test_a_misspelled_option_variable_is_still_named_with_the_closest_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICSLICE_")}
    done = subprocess.run([sys.executable, "-m", "elasticslice.cli", "rspec", "validate",
                           "rspecs/lan-4.xml"], capture_output=True, text=True, cwd=REPO,
                          env={**env, "ELASTICSLICE_EMULATOR_SERVE_BOOT_DELAI": "0.2"},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert ("$ELASTICSLICE_EMULATOR_SERVE_BOOT_DELAI is not a variable elasticslice reads: "
            "ignored; did you mean $ELASTICSLICE_EMULATOR_SERVE_BOOT_DELAY?") in done.stderr


@pytest.mark.slow
def test_getversion_imports_neither_cryptography_nor_the_rspec_library(emulator):
    """The box's config names sa_url: GetVersion needs no certificate parsing and no
    credential (TLS is the ssl module's)."""
    assert loaded_by("--config", str(emulator.config_path), "getversion") <= {
        "elasticslice.config"}


@pytest.mark.slow
def test_a_client_call_with_credentials_imports_no_rspec_library(emulator):
    """create-slice needs the certificate and credentials (cryptography, lxml), not the
    RSpec library, the manager, the emulator or Dask."""
    loaded = loaded_by("--config", str(emulator.config_path), "create-slice")
    assert "elasticslice.rpc.credential" in loaded  # it did get that far
    assert not loaded & (NEVER | {"elasticslice.rspec"})


# ------------------------------------------------------------------ the fast tier -----------
#: light modules of the command line's path -> what they must not import at module level
#: (``if TYPE_CHECKING:`` blocks aside); the slow tests above check what is loaded in the end
HEAVY = ("cryptography", "lxml", "elasticslice.rspec", "elasticslice.rpc.pki",
         "elasticslice.rpc.credential", "elasticslice.rpc.xmldsig", "elasticslice.managers",
         "elasticslice.emulator", "elasticslice.pilots")
LIGHT = {
    "elasticslice/errors.py": (*HEAVY, "elasticslice.config"),
    "elasticslice/envcheck.py": (*HEAVY, "elasticslice.config"),
    "elasticslice/cli.py": (*HEAVY, "elasticslice.config", "elasticslice.commands"),
    "elasticslice/config.py": HEAVY,
    "elasticslice/rpc/cache.py": HEAVY,
    "elasticslice/rpc/client.py": HEAVY,
    "elasticslice/rpc/cm.py": HEAVY,
    "elasticslice/rpc/nodes.py": HEAVY,
    "elasticslice/rpc/transport.py": HEAVY,
    "elasticslice/commands/client.py": HEAVY,
    "elasticslice/commands/nodes.py": HEAVY,
    "elasticslice/commands/waiting.py": HEAVY,
}


def module_level_imports(source: str) -> list[str]:
    """The modules a source imports when it is imported: not in functions, not under
    ``if TYPE_CHECKING:`` (``from a import b``: ``a`` and ``a.b``, since ``b`` may be a
    module)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(ast.Module(body=[other], type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                found.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                found.extend([child.module, *(f"{child.module}.{a.name}" for a in child.names)])
            visit(child)

    visit(ast.parse(source))
    return found


@pytest.mark.parametrize("path", sorted(LIGHT))
def test_a_light_module_imports_nothing_heavy_at_module_level(path):
    banned = LIGHT[path]
    imports = module_level_imports((REPO / path).read_text(encoding="utf-8"))
    heavy = [m for m in imports if any(m == b or m.startswith(b + ".") for b in banned)]
    assert heavy == [], f"{path} imports {heavy} when imported: import it where it is used"


def test_module_level_imports_skip_functions_and_type_checking():
    source = ("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    import lxml\ndef f():\n    import cryptography\n"
              "class C:\n    def g(self):\n        from elasticslice.rspec import parse\n")
    assert module_level_imports(source) == ["os", "typing", "typing.TYPE_CHECKING"]


def test_the_prefix_envcheck_checks_is_the_configs():
    from elasticslice.config import ENV_PREFIX
    from elasticslice.envcheck import ENV_PREFIX as checked
    assert checked == ENV_PREFIX == "ELASTICSLICE_"


def test_one_module_of_the_pilots_package_loads_not_the_whole_package():
    """``elasticslice.pilots`` imports its public names when first asked for: the wheelhouse
    (a doctor's, an enrolment's need) loads neither the cluster nor the manager, and every
    name the package exports still resolves."""
    probe = ("import json, sys\n"
             "import elasticslice.pilots.wheelhouse\n"
             "lazy = sorted(m for m in ('elasticslice.pilots.cluster', "
             "'elasticslice.pilots.manager', 'elasticslice.managers') if m in sys.modules)\n"
             "import elasticslice.pilots as p\n"
             "print(json.dumps({'lazy': lazy, 'names': {n: getattr(p, n).__name__ "
             "for n in p.__all__}}))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["lazy"] == []
    assert found["names"] == {name: name for name in (
        "ClusterCA", "ClusterCAError", "ClusterSnapshot", "ElasticCluster",
        "PilotElasticSliceHelper", "PilotSliceManager", "Revocations")}
